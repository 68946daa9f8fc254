#!/usr/bin/env bash
# Checks every relative link in the hand-written docs (README.md, docs/*.md, bench/README.md, the
# GPU-run index bench/results/README.md, kernels/cuda/README.md) or in the files given: the file
# it names must exist, and a #fragment must match a heading of that file (GitHub's anchor rules:
# lower case, punctuation dropped, spaces to '-', a repeated heading gets -1, -2, ...). Links to
# http(s)/mailto are not followed; links inside code spans and fenced code blocks are ignored.
#   tools/check-doc-links.sh              the hand-written docs above
#   tools/check-doc-links.sh FILE...      those files
# Exit 0 when every link resolves, 1 otherwise (one line per broken link: FILE:LINE: why).
set -euo pipefail
cd "$(dirname "$0")/.."
if (($# == 0)); then
    set -- README.md docs/*.md bench/README.md bench/results/README.md kernels/cuda/README.md
fi
exec python3 - "$@" <<'PY'
import os, re, sys

def strip_code(lines):
    """Yields (line number, text) with fenced blocks dropped and code spans blanked."""
    fence = None
    for n, line in enumerate(lines, 1):
        m = re.match(r"^\s*(```+|~~~+)", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * 3
            elif line.strip().startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)

def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # \w keeps letters, digits, '_' (Unicode too)
    return s.replace(" ", "-")

anchor_cache = {}
def anchors(path):
    if path not in anchor_cache:
        seen, out = {}, set()
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        fence = None
        for line in lines:
            m = re.match(r"^\s*(```+|~~~+)", line)
            if m:
                fence = None if fence else m.group(1)[0]
                continue
            if fence:
                continue
            h = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if h:
                base = slug(h.group(1))
                k = seen.get(base, 0)
                out.add(base if k == 0 else f"{base}-{k}")
                seen[base] = k + 1
        anchor_cache[path] = out
    return anchor_cache[path]

link = re.compile(r"\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
bad = 0
checked = 0
for md in sys.argv[1:]:
    with open(md, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for n, text in strip_code(lines):
        for m in link.finditer(text):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                continue
            checked += 1
            path, _, frag = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(md), path)) if path else md
            if not os.path.exists(dest):
                print(f"{md}:{n}: '{target}': {dest} does not exist")
                bad += 1
                continue
            if frag and (os.path.isdir(dest) or not dest.endswith(".md")):
                continue  # only Markdown headings are checked
            if frag and frag not in anchors(dest):
                print(f"{md}:{n}: '{target}': no heading '#{frag}' in {dest}")
                bad += 1
print(f"check-doc-links: {checked} relative links in {len(sys.argv) - 1} files, {bad} broken")
sys.exit(1 if bad else 0)
PY
