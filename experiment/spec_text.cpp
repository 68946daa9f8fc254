// The raw-text checks of an experiment file (see spec_text.h). yaml-cpp 0.7 is lenient where a
// typo should be an error: an unclosed quote runs on to the next quote or the end of the file,
// swallowing the keys after it; a second document is ignored by YAML::Load; its parser recurses
// once per nesting level. So before parsing, one pass over the text with a small tokenizer that
// knows comments, block scalars, both quote styles ('' and \" escapes) and flow brackets.
#include "experiment/spec_text.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>
#include <vector>

#include "experiment/spec.h"
#include "io/regular_file.h"

namespace mt {

namespace {

std::string open_error_text(int err) {
    switch (err) {
        case ENOENT:
            return "it does not exist; check the path";
        case ELOOP:
            return "too many levels of symbolic links (a symlink loop); point the path at the "
                   "file itself";
        case EACCES:
            return "permission denied; check the file's permissions";
        case ENOTDIR:
            return "a component of the path is not a directory; check the path";
        default:
            return std::string(std::strerror(err)) + "; check the path";
    }
}

// A file descriptor closed on scope exit.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

}  // namespace

std::string read_experiment_text(const std::string& path) {
    const std::string head = path + ": cannot open the experiment file: ";
    // O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting for one.
    Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
    if (f.fd < 0) {
        const int err = errno;
        struct stat st {};
        if (err == EISDIR || (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
            throw SpecError(path + ": is a directory; give the path of a YAML experiment file");
        throw SpecError(head + open_error_text(err));
    }
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) throw SpecError(head + open_error_text(errno));
    if (!S_ISREG(st.st_mode)) {
        if (S_ISDIR(st.st_mode))
            throw SpecError(path + ": is a directory; give the path of a YAML experiment file");
        throw SpecError(path + ": is " + file_kind(st.st_mode) +
                        ", not a regular file; give the path of a YAML experiment file");
    }
    const std::string limit = std::to_string(kMaxExperimentFileBytes) + " bytes (1 MiB)";
    auto too_big = [&](const std::string& size) {
        return SpecError(path + ": the experiment file is " + size + ", more than the limit of " +
                         limit +
                         "; an experiment file holds a few KB of settings: check that this is "
                         "the right file");
    };
    if (static_cast<unsigned long long>(st.st_size) > kMaxExperimentFileBytes)
        throw too_big(std::to_string(st.st_size) + " bytes");
    std::string text;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(f.fd, buf, sizeof buf);
        if (n < 0) {
            if (errno == EINTR) continue;
            throw SpecError(path + ": cannot read the experiment file: " + std::strerror(errno));
        }
        if (n == 0) break;
        text.append(buf, static_cast<size_t>(n));
        if (text.size() > kMaxExperimentFileBytes) throw too_big("larger (it grew while read)");
    }
    return text;
}

namespace {

// One pass over the text. Positions are reported 1-based, columns in bytes (as yaml-cpp's).
class TextChecker {
  public:
    TextChecker(std::string_view text, const std::string& path, bool set_value)
        : t_(text), path_(path), set_value_(set_value) {}

    void run() {
        check_bytes();
        size_t ls = 0;
        line_ = 1;
        while (ls <= t_.size()) {
            size_t le = t_.find('\n', ls);
            if (le == std::string_view::npos) le = t_.size();
            line_start_ = ls;
            scan_line(ls, le);
            if (le == t_.size()) break;
            ls = le + 1;
            ++line_;
        }
    }

  private:
    std::string where(size_t pos) const {
        if (set_value_)
            return path_ + ": in the value at column " + std::to_string(pos - line_start_ + 1);
        return path_ + ":" + std::to_string(line_) + ":" + std::to_string(pos - line_start_ + 1);
    }
    [[noreturn]] void fail(size_t pos, const std::string& msg) const {
        throw SpecError(where(pos) + ": " + msg);
    }

    // NUL bytes and invalid UTF-8, with the position of the first bad byte.
    void check_bytes() {
        line_ = 1;
        line_start_ = 0;
        for (size_t i = 0; i < t_.size();) {
            const auto c = static_cast<unsigned char>(t_[i]);
            if (c == '\n') {
                ++line_;
                line_start_ = ++i;
                continue;
            }
            if (c == 0)
                fail(i,
                     "the file contains a NUL byte; an experiment file is UTF-8 text (is this a "
                     "binary or UTF-16 file?)");
            const size_t n = c < 0x80         ? 1
                             : (c >> 5) == 6  ? 2
                             : (c >> 4) == 14 ? 3
                             : (c >> 3) == 30 ? 4
                                              : 0;
            bool ok = n > 0 && i + n <= t_.size();
            for (size_t k = 1; ok && k < n; ++k)
                ok = (static_cast<unsigned char>(t_[i + k]) & 0xC0) == 0x80;
            if (ok && n > 1) ok = utf8_lead_ok(c, static_cast<unsigned char>(t_[i + 1]));
            if (!ok)
                fail(i, "invalid UTF-8 (byte 0x" + hex(c) +
                            "); an experiment file is UTF-8 text: re-save it as UTF-8");
            i += n;
        }
    }
    // The lead byte of a multi-byte sequence with its second byte: no overlong forms, no
    // UTF-16 surrogates (U+D800..DFFF), nothing above U+10FFFF.
    static bool utf8_lead_ok(unsigned char c, unsigned char c1) {
        if (c < 0xC2 || c > 0xF4) return false;
        if (c == 0xE0) return c1 >= 0xA0;
        if (c == 0xED) return c1 < 0xA0;
        if (c == 0xF0) return c1 >= 0x90;
        if (c == 0xF4) return c1 < 0x90;
        return true;
    }
    static std::string hex(unsigned char c) {
        const char* d = "0123456789ABCDEF";
        return {d[c >> 4], d[c & 15]};
    }

    static bool blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

    void scan_line(size_t ls, size_t le) {
        size_t p = ls;
        while (p < le && t_[p] == ' ') ++p;
        const int indent = static_cast<int>(p - ls);
        const bool empty = p == le || t_[p] == '#' || (t_[p] == '\r' && p + 1 == le);
        if (block_scalar_indent_ >= 0) {
            if (empty || indent > block_scalar_indent_) return;  // the block scalar's content
            block_scalar_indent_ = -1;
        }
        if (empty) return;
        if (flow_ == 0 && indent == 0 && document_marker(ls, le)) return;
        if (document_ended_)
            fail(p, "content after the end of the document ('...' at line " +
                        std::to_string(end_line_) +
                        "); an experiment file holds one YAML document: remove the '...' line "
                        "or what follows it");
        content_seen_ = true;
        int extra = 0;  // "- " / "? " entries opening on this line
        if (flow_ == 0) {
            while (!indents_.empty() && indents_.back() > indent) indents_.pop_back();
            if (indents_.empty() || indents_.back() < indent) indents_.push_back(indent);
            while (p < le && (t_[p] == '-' || t_[p] == '?') && (p + 1 == le || blank(t_[p + 1]))) {
                ++extra;
                ++p;
                while (p < le && blank(t_[p])) ++p;
            }
        }
        check_depth(p, extra);
        scan_tokens(p, le, indent, extra);
    }

    // `---` (a document starts) or `...` (it ends) at column 1. True when the line is one.
    bool document_marker(size_t ls, size_t le) {
        const std::string_view rest = t_.substr(ls, le - ls);
        const bool start = rest.substr(0, 3) == "---", end = rest.substr(0, 3) == "...";
        if (!(start || end) || !(rest.size() == 3 || blank(rest[3]))) {
            if (!rest.empty() && rest[0] == '%' && !content_seen_) return true;  // a directive
            return false;
        }
        if (end) {
            document_ended_ = true;
            end_line_ = line_;
            return true;
        }
        if (content_seen_ || starts_ > 0)
            fail(ls,
                 "a second YAML document starts here ('---'); an experiment file holds one "
                 "document and the rest would be ignored: remove this line, or split the file");
        ++starts_;
        // Content after "--- " on the same line belongs to the document.
        size_t p = ls + 3;
        while (p < le && blank(t_[p])) ++p;
        if (p < le && t_[p] != '#') {
            content_seen_ = true;
            check_depth(p, 0);
            scan_tokens(p, le, 0, 0);
        }
        return true;
    }

    void check_depth(size_t pos, int extra) const {
        const size_t depth = indents_.size() + static_cast<size_t>(extra + flow_);
        if (depth > static_cast<size_t>(kMaxExperimentNesting))
            fail(pos, "nesting too deep: more than " + std::to_string(kMaxExperimentNesting) +
                          " levels of lists and mappings inside one another (an experiment file "
                          "needs about 5); check for unbalanced '[' or '{', or flatten it");
    }

    // The tokens of one line from `p`: quoted scalars, flow brackets, comments, block scalars.
    void scan_tokens(size_t p, size_t le, int indent, int extra) {
        const size_t first = p;
        char sig = 0;  // the last non-blank character before p on this line (0: none yet)
        for (; p < le; ++p) {
            const char c = t_[p];
            const char prev = p == first ? ' ' : t_[p - 1];
            if (blank(c)) continue;
            if (c == '#' && blank(prev)) return;  // a comment
            const bool token_start =
                p == first || prev == '[' || prev == '{' || prev == ',' ||
                (prev == ':' && flow_ > 0) ||
                (blank(prev) && (sig == 0 || std::strchr(":-?,[{", sig) != nullptr));
            if (token_start && c == '!') {  // a tag (!!str): the token after it still starts one
                while (p + 1 < le && !blank(t_[p + 1])) ++p;
                continue;
            }
            if (token_start && (c == '"' || c == '\'')) {
                p = closing_quote(p, le);
                sig = c;
                continue;
            }
            if (token_start && (c == '&' || c == '*') && p + 1 < le && !blank(t_[p + 1]))
                fail(p, std::string(c == '&' ? "an anchor (&name)" : "an alias (*name)") +
                            " is not supported in an experiment file; write the value out");
            // ',' ']' '}' cannot start a value outside [ ] or { } (YAML's c-indicators); yaml-cpp
            // misreads them there (YAML::LoadAll loops forever on a leading ','; found by
            // tests/fuzz/fuzz_experiment).
            if (token_start && flow_ == 0 && (c == ',' || c == ']' || c == '}'))
                fail(p, std::string("a '") + c +
                            "' outside a [ ] list or { } mapping; it is YAML syntax and cannot "
                            "start a value: remove it, or quote the value (\"" +
                            c + "...\")");
            // In flow context every bracket nests (a plain scalar there cannot hold one).
            if ((token_start || flow_ > 0) && (c == '[' || c == '{')) {
                ++flow_;
                check_depth(p, extra);
            } else if ((c == ']' || c == '}') && flow_ > 0) {
                --flow_;
            } else if (token_start && flow_ == 0 && (c == '|' || c == '>')) {
                block_scalar_indent_ = indent;  // the lines indented deeper are its content
                return;
            }
            sig = c;
        }
    }

    // The position of the quote closing the scalar opened at `open`; an error when the line ends
    // first (yaml-cpp would read on into the next lines up to the next quote or the end).
    size_t closing_quote(size_t open, size_t le) const {
        const char q = t_[open];
        for (size_t j = open + 1; j < le; ++j) {
            if (q == '"' && t_[j] == '\\') {
                ++j;
            } else if (t_[j] == q) {
                if (q == '\'' && j + 1 < le && t_[j + 1] == '\'') {
                    ++j;  // '' is an escaped quote
                    continue;
                }
                return j;
            }
        }
        const std::string kind = q == '"' ? "double-quoted" : "single-quoted";
        const std::string end = le == t_.size() ? "the end of the file" : "the end of the line";
        fail(open, "a " + kind + " string opens here and is not closed before " + end +
                       "; YAML would read the following lines into it, hiding the keys there. "
                       "Close it with " +
                       std::string(1, q) +
                       " on the same line (a quoted value must fit on one line)");
    }

    std::string_view t_;
    const std::string& path_;
    bool set_value_ = false;
    int line_ = 1;
    size_t line_start_ = 0;
    int flow_ = 0;                  // open [ and { brackets
    std::vector<int> indents_;      // block indentation levels open at this line
    int block_scalar_indent_ = -1;  // >= 0 inside a | or > block scalar
    bool content_seen_ = false;
    bool document_ended_ = false;
    int end_line_ = 0;
    int starts_ = 0;  // '---' lines seen
};

}  // namespace

void check_experiment_text(const std::string& text, const std::string& path, bool set_value) {
    TextChecker(text, path, set_value).run();
}

}  // namespace mt
