#!/usr/bin/env python3
"""The table of tools/gpu-bench.sh: microtrain's variants and the peers, one row each.

    python3 tools/gpu_bench_summary.py --microtrain RESULTS_JSON [--microtrain RESULTS_JSON ...]
        [--peers PEERS_JSONL] [--peer-peak-tflops X --peer-peak-source TEXT]
    python3 tools/gpu_bench_summary.py --parse-llmc LOG --label TEXT [--skip N] [--dry]

Table mode. Columns: batch size, ms per step (median, p10-p90 where the run recorded steps),
tokens/s (tokens of the measured steps over their total time: the mean step, as microtrain and
bench/torch_gpu_step.py count), MFU counted as llm.c counts it (6 N + 6 L C T per token, N every
parameter, the padded vocabulary included: microtrain's own figure for its rows, the same formula
and the same peak for the peers'), the MFU a run printed itself where it prints one (llm.c: its
own peak table), peak memory, final loss. The peak is the one microtrain's results.json used for
the precision that ran (its data-sheet entry); --peer-peak-tflops replaces it for the peers' rows
(the dry run: the fixture's GPU is not this CPU). Each --microtrain is one results.json (one batch
size); a missing file leaves its rows out and says so. A peer line is one JSON object: as
bench/torch_gpu_step.py prints it ("impl", "attention", "compile", "ms_per_step_median",
"tokens_per_s", "peak_mem_mib", "final_loss", "B", "T", "preset"), or as --parse-llmc prints it
("impl": "llm.c"), or {"impl": ..., "B": ..., "error": "why it has no numbers"}.

--parse-llmc mode reads the stdout of llm.c's train_gpt2cu (its printf formats: the "step %4d/%d |
loss ... | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s" lines, "device memory usage: %zd MiB / %zd
MiB", "| num_parameters | ...", "| micro batch size B | ...", "| sequence length T | ...",
"| device | ...") and prints one peer line: the first N steps skipped as warm-up (cuBLAS/cuDNN
set-up; llm.c itself skips one), the median and mean of the rest, tokens/s from the mean, the
median of llm.c's own MFU, the last step's loss. No step line: an "error" line instead, with the
log's last lines. --dry marks the row as a fixture (the dry run), not a measurement.
"""
import argparse
import json
import os
import re
import statistics
import sys

PRESETS = {  # (n_layer, n_embd, padded vocab, max_seq_len): N as llm.c counts it
    "gpt2-124M": (12, 768, 50304, 1024),
    "gpt2-350M": (24, 1024, 50304, 1024),
    "gpt2-mini": (4, 256, 50304, 256),
    "tiny": (2, 64, 256, 32),
}


def llmc_parameters(L, C, Vp, maxT):
    # wte, wpe, then per block: ln_1, attn (c_attn, c_proj), ln_2, mlp (c_fc, c_proj); ln_f.
    block = 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C)
    return Vp * C + maxT * C + L * block + 2 * C


def flops_per_token(preset, T):
    L, C, Vp, maxT = PRESETS[preset]
    return 6 * llmc_parameters(L, C, Vp, maxT) + 6 * L * C * T


def percentile(xs, q):
    """Linear interpolation between the closest ranks (numpy's default), q in [0, 1]."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# ---- llm.c's stdout ------------------------------------------------------------------------

# train_gpt2.cu: "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms |
# %.1f%% bf16 MFU | %.0f tok/s". The MFU is -100 % on a GPU its table lacks (it returns -1).
LLMC_STEP = re.compile(
    r"^step\s+(\d+)/(\d+) \| loss\s+([-+0-9.eEnaif]+) \([^)]*\)\| norm\s+([-+0-9.eEnaif]+) \([^)]*\)\| "
    r"lr ([-+0-9.e]+) \| ([0-9.]+) ms \| (-?[0-9.]+)% bf16 MFU \| ([0-9.]+) tok/s")
LLMC_TABLE = re.compile(r"^\|\s*([^|]+?)\s*\|\s*(.*?)\s*\|\s*$")
LLMC_MEMORY = re.compile(r"^device memory usage: (\d+) MiB / (\d+) MiB")


def parse_llmc_log(text, skip):
    """One peer record from train_gpt2cu's stdout (see the module docstring)."""
    steps, table, memory = [], {}, None
    for line in text.splitlines():
        m = LLMC_STEP.match(line)
        if m:
            steps.append({"step": int(m[1]), "of": int(m[2]), "loss": float(m[3]),
                          "ms": float(m[6]), "mfu": float(m[7])})
            continue
        m = LLMC_MEMORY.match(line)
        if m:
            memory = int(m[1])
            continue
        m = LLMC_TABLE.match(line)
        if m and m[1] not in ("Parameter",):
            table[m[1]] = m[2]
    rec = {"impl": "llm.c"}
    for key, name, conv in (("B", "micro batch size B", int), ("T", "sequence length T", int),
                            ("num_parameters", "num_parameters", int), ("device", "device", str),
                            ("precision", "precision", str), ("recompute", "recompute", int),
                            ("llmc_peak_tflops", "peak TFlops", float)):
        if name in table:
            try:
                rec[key] = conv(table[name])
            except ValueError:
                pass
    measured = steps[skip:]
    if not measured:
        tail = "\n".join(text.splitlines()[-8:])
        rec["error"] = (f"no timed step after the {skip} warm-up steps "
                        f"({len(steps)} step lines in the log); its last lines:\n{tail}")
        return rec
    ms = [s["ms"] for s in measured]
    mean = statistics.fmean(ms)
    tokens = rec.get("B", 0) * rec.get("T", 0)
    own_mfu = [s["mfu"] for s in measured]
    rec.update({
        # The preset whose parameter count (llm.c's) is the one it printed: -e d12 is GPT-2 124M.
        "preset": next((k for k, v in PRESETS.items() if llmc_parameters(*v) == rec.get("num_parameters")), None),
        "steps": len(measured), "warmup_skipped": min(skip, len(steps)),
        "ms_per_step_median": statistics.median(ms), "ms_per_step_mean": mean,
        "ms_per_step_p10": percentile(ms, 0.1), "ms_per_step_p90": percentile(ms, 0.9),
        "tokens_per_s": tokens / (mean / 1e3) if tokens else None,
        # llm.c prints -100 % where its peak table lacks the GPU (get_flops_promised: -1).
        "llmc_mfu_median": statistics.median(own_mfu) / 100 if min(own_mfu) >= 0 else None,
        "final_loss": measured[-1]["loss"],
        "device_mem_used_mib": memory,
    })
    return rec


# ---- rows ----------------------------------------------------------------------------------

def microtrain_rows(path):
    with open(path) as f:
        j = json.load(f)
    rows, peak = [], None
    for v in j["variants"]:
        B = v.get("batch", {}).get("batch_size")
        if v.get("status") != "ok":
            rows.append({"name": f"microtrain `{v['name']}`", "B": B,
                         "note": f"{v.get('status')}: {v.get('message', '')}"})
            continue
        s = v["stats"]["step_ms"]
        fl = v["flops"]
        peak = peak or fl.get("peak_per_s")
        rows.append({
            "name": f"microtrain `{v['name']}`", "B": B,
            "ms": f"{s['median']:.2f} ({s['p10']:.2f}–{s['p90']:.2f})",
            "tokens_per_s": v["stats"]["tokens_per_s"],
            "mfu": fl.get("mfu"),
            "mem": v["memory"]["device"].get("peak_used_bytes", 0) / 2**20,
            "loss": v["loss"]["final"],
        })
    calls = {r["variant"]: r for r in j["comparison"]["variants"]}
    for row, v in zip(rows, j["variants"]):
        c = calls.get(v["name"])
        if c and not c.get("is_baseline") and c.get("speedup_ci95"):
            lo, hi = c["speedup_ci95"]
            row["call"] = f"{c.get('time_call')} [{lo:.2f}–{hi:.2f}] vs `{j['comparison']['baseline']}`"
    return rows, peak, j


def peer_name(p):
    dry = (f", round {p['round']}" if p.get("round") else "") + (" (DRY: fixture, not a run)" if p.get("dry") else "")
    if p.get("impl") == "llm.c":
        if p.get("exit_status"):  # its timed steps printed, then it stopped (its own time limit)
            dry += f", exit status {p['exit_status']} after them"
        return f"llm.c {p.get('commit', '')[:7]}, {p.get('attention', '?')} attention{dry}".replace("llm.c ,", "llm.c,")
    return f"PyTorch {p.get('torch', '')} {'torch.compile' if p.get('compile') else 'eager'}, {p.get('attention')}{dry}"


def peer_rows(path, peak):
    rows = []
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        p = json.loads(line)
        if p.get("error"):
            # Its first line (what went wrong) and the log's last three (why, usually).
            lines = [x.strip() for x in p["error"].strip().splitlines() if x.strip()]
            rows.append({"name": peer_name(p), "B": p.get("B"),
                         "note": "no numbers: " + " / ".join(lines[:1] + lines[1:][-3:])})
            continue
        tps = p.get("tokens_per_s")
        mfu = (tps * flops_per_token(p["preset"], p["T"]) / peak
               if (tps and peak and p.get("preset") in PRESETS and p.get("T")) else None)
        if "ms_per_step_p10" in p:
            ms = f"{p['ms_per_step_median']:.2f} ({p['ms_per_step_p10']:.2f}–{p['ms_per_step_p90']:.2f})"
        else:
            ms = f"{p.get('ms_per_step_median', p['ms_per_step_mean']):.2f}"
        rows.append({"name": peer_name(p), "B": p.get("B"), "ms": ms, "tokens_per_s": tps, "mfu": mfu,
                     "own_mfu": p.get("llmc_mfu_median"),
                     "mem": p.get("peak_mem_mib", p.get("device_mem_used_mib")),
                     "loss": p.get("final_loss")})
    return rows


def table(rows):
    out = ["| run | B | ms/step, median (p10–p90) | tokens/s | MFU (llm.c count) | MFU it printed | "
           "peak memory MiB | final loss | time call |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        B = r.get("B") if r.get("B") is not None else "?"
        if "note" in r:
            out.append(f"| {r['name']} | {B} | {r['note']} | | | | | | |")
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") else "n/a"
        own = f"{100 * r['own_mfu']:.1f} %" if r.get("own_mfu") else ""
        mem = f"{r['mem']:.0f}" if r.get("mem") else "n/a"
        loss = f"{r['loss']:.4f}" if r.get("loss") is not None else "n/a"
        tps = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else "n/a"
        out.append(f"| {r['name']} | {B} | {r['ms']} | {tps} | {mfu} | {own} | {mem} | {loss} | {r.get('call', '')} |")
    return "\n".join(out)


def summary(a):
    notes, rows, peak, first = [], [], None, None
    for path in a.microtrain:
        if os.path.exists(path):
            r, p, j = microtrain_rows(path)
            rows += r
            peak = peak or p
            first = first or j
        else:
            notes.append(f"no microtrain results at {path}")
    peer_peak = a.peer_peak_tflops * 1e12 if a.peer_peak_tflops else peak
    if a.peers and os.path.exists(a.peers):
        rows += peer_rows(a.peers, peer_peak)
    elif a.peers:
        notes.append(f"no peer results at {a.peers}")
    # One block per batch size, microtrain's rows first within it (a stable sort).
    rows.sort(key=lambda r: r.get("B") or 0)
    print(table(rows))
    if first:
        v = next((v for v in first["variants"] if v.get("status") == "ok"), None)
        if v:
            print(f"\nDevice: {v['device_name']}; peak used for microtrain's MFU: "
                  f"{(peak or 0) / 1e12:.1f} TFLOP/s ({v['flops'].get('peak_source', '')}); "
                  f"{first['experiment'].get('rounds', 1)} interleaved rounds for microtrain's variants.")
    if a.peer_peak_tflops:
        print(f"Peers' MFU against {a.peer_peak_tflops:.1f} TFLOP/s ({a.peer_peak_source}).")
    print("Peak memory: microtrain's device peak; PyTorch's torch.cuda.max_memory_allocated; "
          "llm.c's own cudaMemGetInfo line after its allocations (context included). "
          "'MFU it printed': llm.c's median, against its own peak table.")
    for n in notes:
        print(f"\n{n}", file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--microtrain", action="append", default=[],
                    help="a results.json of microtrain (repeat: one per batch size)")
    ap.add_argument("--peers", default="")
    ap.add_argument("--peer-peak-tflops", type=float, default=None)
    ap.add_argument("--peer-peak-source", default="given on the command line")
    ap.add_argument("--parse-llmc", metavar="LOG", help="print llm.c's peer line from its stdout")
    ap.add_argument("--label", default="", help="--parse-llmc: the attention it ran, for the row's name")
    ap.add_argument("--commit", default="", help="--parse-llmc: llm.c's commit, for the row's name")
    ap.add_argument("--skip", type=int, default=3, help="--parse-llmc: warm-up steps left out")
    ap.add_argument("--dry", action="store_true", help="--parse-llmc: a fixture, not a run")
    a = ap.parse_args()
    if a.parse_llmc:
        try:
            with open(a.parse_llmc, errors="replace") as f:
                text = f.read()
        except OSError as e:
            print(json.dumps({"impl": "llm.c", "attention": a.label, "error": f"cannot read {a.parse_llmc}: {e}"}))
            return 0
        rec = parse_llmc_log(text, a.skip)
        rec.update({"attention": a.label, "commit": a.commit})
        if a.dry:
            rec["dry"] = True
        print(json.dumps(rec))
        return 0
    if not a.microtrain and not a.peers:
        ap.error("nothing to summarise: give --microtrain and/or --peers (or --parse-llmc LOG)")
    return summary(a)


if __name__ == "__main__":
    sys.exit(main())
