// The training run of `microtrain train FILE.yaml` (see training_run.h, docs/design.md "The
// training run"). Its steps run through engine/step_loop.h's StepLoop, which decides what a
// non-finite loss or a stop signal does; this file validates, writes train.csv, checkpoints and
// turns the loop's outcome into an exit code.
//
// Why a resumed run is bitwise identical to an uninterrupted one: everything that decides the
// next step is in the checkpoint or is a pure function of the config. The weights and the AdamW
// moments are stored as exact fp32 bytes and the AdamW step count (bias correction, the LR
// schedule) is the checkpoint's "step"; batch i of the DataLoader is a pure function of (source,
// run.seed, B, T, i), so the loader's position (batches consumed) is all its state; the model's
// RNG is used once, by init_weights(run.seed) at step 0, and nothing after (no dropout), so there
// is no stream state to carry. The validation batches are the same fixed ones at every
// evaluation and evaluation only runs forward, so evaluating never changes training.
#include "cli/training_run.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "checkpoint/checkpoint.h"
#include "distributed/world.h"
#include "engine/data.h"
#include "engine/divergence.h"
#include "engine/signals.h"
#include "engine/step_loop.h"
#include "engine/training_session.h"
#include "experiment/dist_config_check.h"
#include "experiment/spec.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "io/regular_file.h"
#include "report/noise.h"
#include "report/recording.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

// __metadata__ keys of a training checkpoint, beside checkpoint.h's config keys and "step".
// Every key of ours starts with kOwnPrefix; the checksum covers them all (format 2; format 1's
// covered the tensors only, so an edited data_position resumed on other batches unnoticed).
constexpr const char* kOwnPrefix = "microtrain.";
constexpr const char* kFormatKey = "microtrain.train_format";
constexpr const char* kFormatVersion = "2";
constexpr const char* kConfigPrefix = "microtrain.config.";  // + dotted key: the resolved config
constexpr const char* kPositionKey = "microtrain.data_position";  // train batches consumed
constexpr const char* kCsvRowsKey = "microtrain.csv_rows";        // train.csv rows it covers
constexpr const char* kChecksumKey = "microtrain.checksum";       // FNV-1a: tensors + microtrain.*
constexpr const char* kSeedKey = "microtrain.seed";
constexpr const char* kRngKey = "microtrain.rng";
// Data parallel: the ranks that wrote it and the global batch (ranks x data.batch_size), which
// data_position counts in. Absent in a checkpoint of one process: 1 and data.batch_size.
constexpr const char* kWorldSizeKey = "microtrain.world_size";
constexpr const char* kGlobalBatchKey = "microtrain.global_batch";
// train.csv's columns: other_cpu_ms and steal_ms (what else the machine did during the step,
// engine/cpu_load.h) at the end of each row. A run directory started by an older microtrain has
// the header without them (kCsvHeaderWithoutNoise): a resume keeps that file's column set.
constexpr const char* kCsvHeader = "step,loss,val_loss,lr,grad_norm,ms,other_cpu_ms,steal_ms";
constexpr const char* kCsvHeaderWithoutNoise = "step,loss,val_loss,lr,grad_norm,ms";
// The largest train.csv read back on --resume: about 100 bytes a step, so tens of millions of
// steps; a larger file is not one of ours.
constexpr size_t kMaxCsvBytes = size_t{4} << 30;
// The busiest stretch the end-of-run noise line names: at least this many consecutive steps and
// this much step time (2 s: 200 ticks of each CPU at USER_HZ 100, so one tick more or less is 1%).
constexpr int kNoiseWindowSteps = 16;
constexpr double kNoiseWindowMs = 2000;

// An error that ends the run with `code` (2: bad input or an unusable directory; 1: runtime).
// `agreed`: every rank of a data-parallel job throws it at the same point (it follows from
// agreed values, e.g. the global loss), so the ranks can all return instead of aborting the job.
struct TrainError : std::runtime_error {
    TrainError(int c, const std::string& what, bool a = false)
        : std::runtime_error(what), code(c), agreed(a) {}
    int code;
    bool agreed;
};
[[noreturn]] void input_error(const std::string& what) {
    throw TrainError(2, what);
}

// ---- the config a checkpoint records ----------------------------------------------------------

// Every knob (flatten) plus the train.* keys: what a resume must match. train.steps is left out
// on purpose: continuing a finished run for more steps is what --steps on --resume is for.
std::map<std::string, std::string> config_map(const RunConfig& c, const TrainSpec& t) {
    std::map<std::string, std::string> m;
    for (auto& [k, v] : flatten(c)) m[k] = v;
    m["train.eval_every"] = std::to_string(t.eval_every);
    m["train.eval_batches"] = std::to_string(t.eval_batches);
    m["train.checkpoint_every"] = std::to_string(t.checkpoint_every);
    m["train.keep_checkpoints"] = std::to_string(t.keep_checkpoints);
    return m;
}

// "key: A (checkpoint) vs B (now)" for every key that differs, or "" when none.
std::string config_differences(const std::map<std::string, std::string>& saved,
                               const std::map<std::string, std::string>& now) {
    std::string out;
    auto add = [&](const std::string& k, const std::string& a, const std::string& b) {
        out += (out.empty() ? "" : "; ") + k + " " + a + " (checkpoint) vs " + b + " (now)";
    };
    for (const auto& [k, v] : saved)
        if (auto it = now.find(k); it == now.end())
            add(k, "'" + v + "'", "absent");
        else if (it->second != v)
            add(k, "'" + v + "'", "'" + it->second + "'");
    for (const auto& [k, v] : now)
        if (!saved.count(k)) add(k, "absent", "'" + v + "'");
    return out;
}

// ---- checkpoint files -----------------------------------------------------------------------

std::string checkpoint_name(int step) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "step-%08d.safetensors", step);
    return buf;
}

// The checkpoints in `dir`, newest (highest step) first; none when `dir` does not exist. Only
// exact "step-NNNNNNNN.safetensors" names count: an atomic write's temporary
// ("...safetensors.tmp.XXXXXX") never does. A `dir` that exists but cannot be listed (a regular
// file in its place, no permission) is an error: read as "no checkpoints", a resume would start
// again from step 0 and cut train.csv.
std::vector<std::pair<int, fs::path>> list_checkpoints(const fs::path& dir) {
    std::vector<std::pair<int, fs::path>> out;
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
        if (errno == ENOENT) return out;
        input_error(dir.string() + ": cannot read the checkpoints directory: " +
                    std::strerror(errno) + "; check its permissions");
    }
    if (!S_ISDIR(st.st_mode))
        input_error(dir.string() + ": is " + file_kind(st.st_mode) +
                    ", expected the run's checkpoints directory; move it away, or start a new "
                    "--out-dir");
    std::error_code ec;
    fs::directory_iterator it(dir, ec);
    if (ec)
        input_error(dir.string() + ": cannot list the checkpoints: " + ec.message() +
                    "; check its permissions");
    for (const auto& e : it) {
        const std::string n = e.path().filename().string();
        int step = 0;
        char tail = 0;
        if (n.size() == 25 && std::sscanf(n.c_str(), "step-%8d.safetensors%c", &step, &tail) == 1 &&
            n == checkpoint_name(step))
            out.emplace_back(step, e.path());
    }
    std::sort(out.begin(), out.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    return out;
}

// Temporaries of atomic writes a SIGKILL interrupted: never valid, safe to delete.
void remove_stale_temporaries(const fs::path& dir) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
        if (e.path().filename().string().find(".tmp.") != std::string::npos)
            fs::remove(e.path(), ec);
}

uint64_t fnv1a(uint64_t h, std::span<const std::byte> bytes) {
    for (std::byte b : bytes) h = (h ^ static_cast<uint8_t>(b)) * 0x100000001B3ull;
    return h;
}

// The checksum of named tensors and of our metadata (every kOwnPrefix key but the checksum's
// own), each in name order (independent of the file's order): it catches a checkpoint whose
// bytes were damaged after it was written (the rename makes a torn write impossible, not a bad
// disk or a careless edit), tensor or metadata alike. Each name and value is hashed with its
// terminating NUL, so no two different sequences hash the same bytes.
using NamedBytes = std::map<std::string, std::span<const std::byte>>;
std::string checksum_text(const NamedBytes& tensors,
                          const std::map<std::string, std::string>& metadata) {
    uint64_t h = 0xCBF29CE484222325ull;
    auto add = [&h](const std::string& text) {
        h = fnv1a(h, std::as_bytes(std::span(text.data(), text.size() + 1)));
    };
    for (const auto& [name, bytes] : tensors) {
        add(name);
        h = fnv1a(h, bytes);
    }
    for (const auto& [key, value] : metadata)
        if (key.rfind(kOwnPrefix, 0) == 0 && key != kChecksumKey) {
            add(key);
            add(value);
        }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
    return buf;
}

std::string file_checksum(const SafeTensorsFile& f) {
    std::map<std::string, std::vector<std::byte>> owned;  // read from the file (no mapping)
    NamedBytes t;
    for (const auto& e : f.tensors()) t[e.name] = owned[e.name] = f.read_raw(e);
    return checksum_text(t, f.metadata());
}

// ---- train.csv ------------------------------------------------------------------------------

// Losses are doubles (StepRecord) printed with %.17g, lr and grad_norm are floats printed with
// %.9g: each reads back to the same bits. ms is a measurement, not a result: %.3f; so are
// other_cpu_ms and steal_ms (tick resolution: %.0f), left out for a file without those columns.
std::string csv_row(int step, const StepRecord& r, const std::optional<double>& val,
                    bool noise_columns) {
    char buf[320];
    char val_text[40] = "";
    if (val) std::snprintf(val_text, sizeof val_text, "%.17g", *val);
    const int n =
        std::snprintf(buf, sizeof buf, "%d,%.17g,%s,%.9g,%.9g,%.3f", step, r.loss, val_text,
                      static_cast<double>(static_cast<float>(r.lr)),
                      static_cast<double>(static_cast<float>(r.grad_norm)), r.times.wall_ms);
    if (noise_columns)
        std::snprintf(buf + n, sizeof buf - static_cast<size_t>(n), ",%.0f,%.0f", r.other_cpu_ms,
                      r.steal_ms);
    return std::string(buf) + "\n";
}

// The whole train.csv `path`. A FIFO, a device or a directory in its place is an error naming
// it (opened, a FIFO would block the run forever).
std::string read_csv_text(const fs::path& path) {
    try {
        return read_regular_file(path.string(), kMaxCsvBytes);
    } catch (const FileKindError& e) {
        input_error(std::string(e.what()) +
                    "; expected the run's train.csv (start a new --out-dir)");
    }
}

// Cuts `path` back to its header and first `rows` rows (the steps the resumed checkpoint
// covers), atomically: rows after it belong to steps that will be run again. Returns whether the
// file has the noise columns (false: an older run's header, kept as it is).
bool truncate_csv(const fs::path& path, int rows) {
    if (!fs::exists(fs::symlink_status(path)))
        input_error(path.string() +
                    ": cannot open: the run directory has checkpoints but no "
                    "train.csv; it cannot be resumed (start a new --out-dir)");
    std::istringstream in(read_csv_text(path));
    std::string line, kept;
    if (!std::getline(in, line) || (line != kCsvHeader && line != kCsvHeaderWithoutNoise))
        input_error(path.string() + ": expected the header '" + kCsvHeader + "', got '" + line +
                    "'; this is not a microtrain train.csv (start a new --out-dir)");
    const bool noise_columns = line == kCsvHeader;
    kept = line + "\n";
    for (int i = 1; i <= rows; ++i) {
        if (!std::getline(in, line) || in.eof())  // a last line without '\n' is torn
            input_error(path.string() + ": expected at least " + std::to_string(rows) +
                        " complete rows (the checkpoint's step), got " + std::to_string(i - 1) +
                        "; the file was edited or truncated (start a new --out-dir)");
        if (line.rfind(std::to_string(i) + ",", 0) != 0)
            input_error(path.string() + ": row " + std::to_string(i) + " should be step " +
                        std::to_string(i) + ", got '" + line + "' (start a new --out-dir)");
        kept += line + "\n";
    }
    write_file_atomic(path.string(), kept);
    return noise_columns;
}

// Data rows of an existing train.csv (0 when there is none).
int csv_rows(const fs::path& path) {
    if (!fs::exists(fs::symlink_status(path))) return 0;
    std::istringstream in(read_csv_text(path));
    std::string line;
    int n = -1;  // the header is not a row
    while (std::getline(in, line)) ++n;
    return std::max(n, 0);
}

// Appends rows, flushing each: a kill loses no row already printed.
class CsvAppender {
  public:
    explicit CsvAppender(const fs::path& path) : path_(path.string()) {
        int fd = -1;
        try {
            fd = open_regular_for_append(path_);  // never a FIFO, a device or a symbolic link
        } catch (const FileKindError& e) {
            input_error(e.what());
        }
        f_ = ::fdopen(fd, "a");
        if (!f_) {
            ::close(fd);
            throw TrainError(1, path_ + ": cannot open for appending: " + std::strerror(errno));
        }
    }
    ~CsvAppender() {
        if (f_) std::fclose(f_);
    }
    CsvAppender(const CsvAppender&) = delete;
    CsvAppender& operator=(const CsvAppender&) = delete;
    void append(const std::string& row) {
        if (std::fputs(row.c_str(), f_) < 0 || std::fflush(f_) != 0)
            throw TrainError(1, path_ + ": cannot write: " + std::strerror(errno));
    }
    // On disk (not just in the page cache) before a checkpoint that counts these rows.
    void sync() {
        if (fsync(fileno(f_)) != 0)
            throw TrainError(1, path_ + ": cannot fsync: " + std::strerror(errno));
    }

  private:
    std::string path_;
    FILE* f_ = nullptr;
};

// ---- validation -----------------------------------------------------------------------------

// The fixed validation batches: batches 0 .. n-1 of the validation part (data.val_fraction) or
// of the validation file (data.val_path), read once. Data parallel: batch i is the global batch
// of world x B rows and this rank holds its slice (the same rows a one-process run of batch
// world x B evaluates), so the mean over the ranks is the one-process validation loss.
struct ValidationSet {
    std::vector<std::vector<int>> inputs, targets;
    std::string source;  // for the start-up line
};

ValidationSet make_validation_set(const RunConfig& cfg, int n, const World& world) {
    ValidationSet v;
    DataConfig dc = cfg.data;
    dc.workers = 0;
    // The validation batches are held in memory, at full length: shape jitter and the sample
    // cache are for the training batches.
    dc.seq_len_jitter = 0;
    dc.cache = false;
    DataLoaderOptions opt;
    opt.rank = world.rank();
    opt.world = world.size();
    if (!dc.val_path.empty()) {
        dc.path = dc.val_path;
        dc.val_fraction = 0;
        v.source = "'" + dc.val_path + "'";
    } else if (dc.val_fraction > 0) {
        opt.split = DataSplit::val;
        char buf[64];
        std::snprintf(buf, sizeof buf, "the last %g of the windows", dc.val_fraction);
        v.source = buf;
    } else {
        return v;
    }
    DataLoader loader(dc, cfg.model.vocab_size, cfg.run.seed, nullptr, opt);
    const size_t bt = static_cast<size_t>(dc.batch_size) * dc.seq_len;
    for (int i = 0; i < n; ++i) {
        const Batch& b = loader.next();
        v.inputs.emplace_back(b.inputs, b.inputs + bt);
        v.targets.emplace_back(b.targets, b.targets + bt);
    }
    v.source += " (" + std::to_string(loader.num_windows()) + " windows)";
    return v;
}

// ---- resuming -------------------------------------------------------------------------------

struct ResumePoint {
    fs::path path;
    int step = 0;
    uint64_t data_position = 0;  // train batches consumed (global batches)
    uint64_t global_batch = 0;   // rows per batch of the run that wrote it
};

void warn_skipping(const fs::path& path, const std::string& why) {
    std::fprintf(stderr,
                 "microtrain train: warning: skipping checkpoint %s: %s; trying the previous "
                 "one\n",
                 path.string().c_str(), why.c_str());
}

// Checks one candidate: a whole, undamaged microtrain training checkpoint of this config.
// Returns nullopt (after a warning) for one to skip; a config mismatch is an error, not a skip:
// an older checkpoint of the same directory would not match either.
std::optional<ResumePoint> check_candidate(const fs::path& path,
                                           const std::map<std::string, std::string>& config,
                                           const RunConfig& cfg) {
    try {
        const SafeTensorsFile f = SafeTensorsFile::open(path.string());
        const TrainCheckpointState state = read_train_checkpoint(f);
        if (const std::string d = config_differences(state.config, config); !d.empty())
            input_error(path.string() + ": was written by a different config: " + d +
                        ". Only train.steps (--steps) may change on --resume; resume with the "
                        "original file, --variant and --set flags, or start a new --out-dir");
        // The same config, so a tensor of another shape (a header edited, its bytes and
        // checksum intact) is damage: skip it as such, before the session is built on it.
        check_checkpoint_layout(f, cfg.model, cfg.trainable, /*with_optimizer=*/true);
        return ResumePoint{path, state.step, state.data_position, state.global_batch};
    } catch (const SafeTensorsError& e) {
        warn_skipping(path, e.what());
        return std::nullopt;
    }
}

// The newest valid checkpoint of `dir`; nullopt when it has none at all.
std::optional<ResumePoint> find_resume_point(const fs::path& dir,
                                             const std::map<std::string, std::string>& config,
                                             const RunConfig& cfg) {
    const fs::path ckdir = dir / "checkpoints";
    const auto all = list_checkpoints(ckdir);
    if (all.empty()) return std::nullopt;
    for (const auto& [step, path] : all)
        if (auto r = check_candidate(path, config, cfg)) return *r;
    input_error(ckdir.string() + ": none of its " + std::to_string(all.size()) +
                " checkpoints is valid (see the warnings above); the run cannot be resumed, start "
                "a new --out-dir");
}

// ---- the run --------------------------------------------------------------------------------

std::string duration_text(double seconds) {
    const long s = std::lround(std::max(0.0, seconds));
    char buf[32];
    if (s >= 3600)
        std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else
        std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
    return buf;
}

// ---- ZeRO-1 moments ---------------------------------------------------------------------------
//
// Under ZeRO-1 each rank's AdamW holds m and v only for its owned ranges, packed. A checkpoint
// holds the full moments in the one-process layout, so it loads into any world size (and into
// PyTorch); a resumed ZeRO-1 rank takes its ranges back out of them.

struct FullMoments {
    // The trainable prefix of the device layout (what an unsharded AdamW holds); empty on
    // ranks other than 0.
    std::vector<float> m, v;
};

void append_bytes(std::string& out, const void* p, size_t bytes) {
    out.append(static_cast<const char*>(p), bytes);
}

// World::gather carries at most 2^31 bytes in all, and the moments are 8 bytes a parameter (a
// 350M model's are 2.8 GB), so each rank's bytes go in rounds of at most 2^30 / world bytes: as
// many rounds as the largest rank needs (agreed first, so every rank joins each one).
std::vector<std::string> gather_in_rounds(World& world, const std::string& mine, double timeout_s,
                                          const char* what) {
    const size_t chunk = std::max<size_t>(1, (size_t{1} << 30) / static_cast<size_t>(world.size()));
    double rounds = std::max(1.0, std::ceil(static_cast<double>(mine.size()) / chunk));
    world.allreduce_max(&rounds, 1, timeout_s, what);
    std::vector<std::string> all(world.rank() == 0 ? static_cast<size_t>(world.size()) : 0);
    for (size_t i = 0; i < static_cast<size_t>(rounds); ++i) {
        const size_t lo = std::min(mine.size(), i * chunk);
        const std::vector<std::string> part =
            world.gather(mine.substr(lo, std::min(chunk, mine.size() - lo)), timeout_s, what);
        for (size_t r = 0; r < all.size(); ++r) all[r] += part[r];
    }
    return all;
}

// Every rank's owned ranges and packed m/v go to rank 0, which places them by offset and checks
// that the ranks' ranges cover every element exactly once.
FullMoments gather_full_moments(AdamW& opt, size_t n, World& world, double timeout_s) {
    const std::vector<GPT::GradientRange>& owned = opt.partition().owned;
    const std::vector<float> m = opt.get_m(), v = opt.get_v();
    std::string mine;
    const uint64_t ranges = owned.size();
    append_bytes(mine, &ranges, sizeof ranges);
    for (const auto& r : owned) {
        const uint64_t range[2] = {r.offset, r.count};
        append_bytes(mine, range, sizeof range);
    }
    append_bytes(mine, m.data(), m.size() * sizeof(float));
    append_bytes(mine, v.data(), v.size() * sizeof(float));
    const std::vector<std::string> all =
        gather_in_rounds(world, mine, timeout_s, "the AdamW moments of the checkpoint");
    FullMoments full;
    if (world.rank() != 0) return full;
    full.m.assign(n, 0.0f);
    full.v.assign(n, 0.0f);
    std::vector<char> covered(n, 0);
    for (size_t rank = 0; rank < all.size(); ++rank) {
        const std::string& b = all[rank];
        auto bad = [&] {
            return TrainError(1, "the AdamW moments gathered from rank " + std::to_string(rank) +
                                     " do not fit the parameters (" + std::to_string(b.size()) +
                                     " bytes); the ranks disagree on the ZeRO-1 partition");
        };
        uint64_t nr = 0;
        if (b.size() < sizeof nr) throw bad();
        std::memcpy(&nr, b.data(), sizeof nr);
        if (nr > n || b.size() < sizeof nr + nr * 2 * sizeof(uint64_t)) throw bad();
        std::vector<uint64_t> rr(2 * nr);
        std::memcpy(rr.data(), b.data() + sizeof nr, rr.size() * sizeof(uint64_t));
        size_t count = 0;
        for (size_t i = 0; i < nr; ++i) {
            if (rr[2 * i] > n || rr[2 * i + 1] > n - rr[2 * i]) throw bad();
            count += rr[2 * i + 1];
        }
        const size_t head = sizeof nr + rr.size() * sizeof(uint64_t);
        if (b.size() != head + 2 * count * sizeof(float)) throw bad();
        const char* pm = b.data() + head;
        const char* pv = pm + count * sizeof(float);
        size_t at = 0;
        for (size_t i = 0; i < nr; ++i) {
            const size_t off = rr[2 * i], cnt = rr[2 * i + 1];
            for (size_t k = off; k < off + cnt; ++k)
                if (covered[k]++) throw bad();
            std::memcpy(full.m.data() + off, pm + at * sizeof(float), cnt * sizeof(float));
            std::memcpy(full.v.data() + off, pv + at * sizeof(float), cnt * sizeof(float));
            at += cnt;
        }
    }
    if (std::find(covered.begin(), covered.end(), 0) != covered.end())
        throw TrainError(1,
                         "the ranks' ZeRO-1 ranges do not cover every parameter; the AdamW "
                         "moments cannot be checkpointed");
    return full;
}

// This rank's owned ranges of the full moments, packed (what AdamW::set_state expects).
std::vector<float> pack_owned(const std::vector<float>& full,
                              const std::vector<GPT::GradientRange>& owned) {
    std::vector<float> out;
    for (const auto& r : owned)
        out.insert(out.end(), full.begin() + static_cast<std::ptrdiff_t>(r.offset),
                   full.begin() + static_cast<std::ptrdiff_t>(r.offset + r.count));
    return out;
}

class Trainer {
  public:
    explicit Trainer(const TrainRunOptions& o);
    int run();

  private:
    int loop();
    void check_same_config();
    void prepare_directory();
    void lock_directory();
    void share_resume_point(int error_code);
    void build_session();
    double evaluate();
    void checkpoint(int step);
    // `diverged`: the divergence rule flagged this step or an earlier one (marks the line).
    void print_progress(int step, const StepRecord& r, const std::optional<double>& val,
                        bool diverged);
    int global_batch() const { return cfg_.data.batch_size * world_.size(); }

    TrainRunOptions opts_;
    // Data parallel: rank 0 (the leader) alone writes the directory and prints; every rank
    // steps, evaluates its slice and joins the checkpoint's gather.
    World& world_;
    bool leader_;
    ExperimentSpec spec_;
    RunConfig cfg_;
    TrainSpec train_;
    fs::path dir_, ckdir_, csv_path_;
    std::map<std::string, std::string> config_;
    std::optional<ResumePoint> resume_;
    int start_step_ = 0;

    std::unique_ptr<TrainingSession> session_;
    DataLoader* loader_ = nullptr;  // owned by the session
    ValidationSet val_;
    DeviceBuffer d_inputs_, d_targets_;  // for the validation batches
    std::unique_ptr<CsvAppender> csv_;
    std::unique_ptr<DirectoryLock> lock_;  // rank 0's: held from prepare_directory to the end
    std::chrono::steady_clock::time_point t0_;
    int steps_here_ = 0;              // steps this process ran (for tokens/s and the ETA)
    double tokens_here_ = 0;          // tokens those steps trained (global batch)
    std::optional<double> last_val_;  // the latest validation loss, for the progress line
    bool csv_noise_columns_ = true;   // train.csv has other_cpu_ms,steal_ms (an older one not)
    TrainNoiseTracker noise_{kNoiseWindowSteps,
                             kNoiseWindowMs};  // what else the machine did, this process's
                                               // steps (report/noise.h)
    void print_noise() const;
};

Trainer::Trainer(const TrainRunOptions& o)
    : opts_(o), world_(World::current()), leader_(world_.rank() == 0) {
    keep_output_from_blocking(world_);  // Ctrl-C on mpirun: see distributed/world.h
    spec_ = load_experiment(o.file, o.overrides);
    cfg_ = o.variant.empty() ? spec_.base : spec_.variant(o.variant);
    train_ = spec_.train;
    if (o.steps) train_.steps = *o.steps;
    if (cfg_.run.host_sync == HostSync::none)
        input_error(o.file +
                    ": run.host_sync: none is for `microtrain run` only: `train` writes "
                    "each step's loss to train.csv and checks it as the step ends; use step "
                    "(the default), loss_every_step or every_op");
    // The data files as the loaders will read them (tokens against the vocabulary included),
    // before the run directory is created: a bad validation file is an input error naming its
    // key, not a failure after train.csv exists.
    try {
        check_data_sources(cfg_.data, cfg_.model.vocab_size);
    } catch (const DataError& e) {
        input_error(o.file + ": " + e.what());
    }
    config_ = config_map(cfg_, train_);
    if (!o.resume_dir.empty()) {
        if (!o.out_dir.empty() &&
            fs::weakly_canonical(o.out_dir) != fs::weakly_canonical(o.resume_dir))
            input_error("--out-dir " + o.out_dir + " and --resume " + o.resume_dir +
                        " name different directories; a resumed run continues in its own "
                        "directory: give only --resume");
        dir_ = o.resume_dir;
    } else if (!o.out_dir.empty()) {
        dir_ = o.out_dir;
    } else {
        dir_ = fs::path(spec_.out_dir) /
               (spec_.name + "-train" + (o.variant.empty() ? "" : "-" + o.variant));
    }
    ckdir_ = dir_ / "checkpoints";
    csv_path_ = dir_ / "train.csv";
}

// A fresh run needs a directory without a run in it; a resumed one its newest valid checkpoint,
// with train.csv cut back to that checkpoint's step.
void Trainer::prepare_directory() {
    std::error_code ec;
    if (!opts_.resume_dir.empty()) {
        if (!fs::is_directory(dir_, ec))
            input_error("--resume " + dir_.string() +
                        ": not a directory; give the --out-dir of an earlier `microtrain train`");
        lock_directory();  // before anything is read or removed: another writer's temporaries
        remove_stale_temporaries(ckdir_);
        remove_stale_temporaries(dir_);
        resume_ = find_resume_point(dir_, config_, cfg_);
        if (!resume_ && !fs::exists(csv_path_, ec))
            input_error(dir_.string() + ": nothing to resume: no train.csv and no " +
                        "step-NNNNNNNN.safetensors in " + ckdir_.string() +
                        "; start the run without --resume (with --out-dir " + dir_.string() + ")");
        if (!resume_)  // started, but stopped before its first checkpoint: nothing to lose
            std::fprintf(stderr,
                         "microtrain train: warning: %s has no checkpoint yet (the run stopped "
                         "before its first); starting again from step 0\n",
                         ckdir_.string().c_str());
        start_step_ = resume_ ? resume_->step : 0;
        csv_noise_columns_ = truncate_csv(csv_path_, start_step_);
        fs::create_directories(ckdir_, ec);
        return;
    }
    fs::create_directories(dir_, ec);
    if (ec) throw TrainError(1, dir_.string() + ": cannot create the directory: " + ec.message());
    // Locked before the check: of two runs started together on one directory, the second is
    // refused here instead of finding it empty too.
    lock_directory();
    if (!list_checkpoints(ckdir_).empty() || csv_rows(csv_path_) > 0)
        input_error(dir_.string() +
                    ": already holds a training run (train.csv rows or checkpoints/); continue "
                    "it with --resume " +
                    dir_.string() + ", or choose another --out-dir");
    // The header first, then checkpoints/: a directory with either is a started run.
    write_file_atomic(csv_path_.string(), std::string(kCsvHeader) + "\n");
    fs::create_directories(ckdir_, ec);
    if (ec) throw TrainError(1, ckdir_.string() + ": cannot create the directory: " + ec.message());
}

// One process writes a run directory (io/directory_lock.h): a second `train` on it, fresh or
// --resume, exits 2 naming the holder's PID.
void Trainer::lock_directory() {
    try {
        lock_ = std::make_unique<DirectoryLock>(dir_.string());
    } catch (const DirectoryLockedError& e) {
        input_error(e.what());
    } catch (const FileKindError& e) {
        input_error(e.what());
    }
}

// Every rank must train the same config from the same directory: the resolved config, the
// train.* keys, the variant, the step count and the directories, compared with rank 0's.
void Trainer::check_same_config() {
    std::string mine = "variant " + opts_.variant +
                       "\ntrain.steps=" + std::to_string(train_.steps) + "\ndir=" + dir_.string() +
                       "\nresume=" + (opts_.resume_dir.empty() ? "no" : "yes") + "\n";
    for (const auto& [k, v] : config_) mine += k + "=" + v + "\n";
    if (!same_text_on_every_rank(mine, world_, cfg_.dist.timeout_s, "train"))
        throw TrainError(2, "", /*agreed=*/true);  // the check printed why
}

// Rank 0 chose the checkpoint (prepare_directory); the others read the same file, so the run
// directory must be on a filesystem every rank sees (one machine, or a shared mount). A
// directory rank 0 refused (`error_code`, the exit code; 0: none) ends every rank with that code
// instead of aborting the job: the other ranks are waiting here for it.
void Trainer::share_resume_point(int error_code) {
    std::string path = resume_ ? resume_->path.string() : std::string();
    uint64_t head[6] = {resume_ ? 1u : 0u,
                        static_cast<uint64_t>(start_step_),
                        resume_ ? resume_->data_position : 0,
                        resume_ ? resume_->global_batch : 0,
                        path.size(),
                        static_cast<uint64_t>(error_code)};
    const double t = cfg_.dist.timeout_s;
    world_.broadcast(head, sizeof head, t, "the resume point");
    if (head[5]) throw TrainError(static_cast<int>(head[5]), "", /*agreed=*/true);
    path.resize(head[4]);
    world_.broadcast(path.data(), path.size(), t, "the resume point (path)");
    start_step_ = static_cast<int>(head[1]);
    if (head[0])
        resume_ = ResumePoint{path, start_step_, head[2], head[3]};
    else
        resume_.reset();
}

void Trainer::build_session() {
    const bool cuda = cfg_.backend == BackendChoice::cuda ||
                      (cfg_.backend == BackendChoice::auto_ && cuda_available());
    std::unique_ptr<Backend> backend =
        create_training_backend(cfg_, cuda ? BackendKind::cuda : BackendKind::cpu);
    // The session checks the memory estimate too, but the loader (its sample cache) allocates
    // first: refuse a run that cannot fit before either does.
    check_memory_fits(cfg_, *backend);
    DataLoaderOptions lo;
    // In global batches: the same number on every rank, each rank reading its rows of them.
    lo.first_batch = resume_ ? resume_->data_position : 0;
    lo.rank = world_.rank();
    lo.world = world_.size();
    auto loader = std::make_unique<DataLoader>(cfg_.data, cfg_.model.vocab_size, cfg_.run.seed,
                                               backend.get(), lo);
    loader_ = loader.get();
    TrainingInputs in;
    in.batches = std::move(loader);
    in.track_memory = false;
    in.world = &world_;
    // Resuming: the checkpoint overwrites every weight, so skip the initialisation.
    if (resume_) in.load_weights = [](GPT&) {};
    session_ = std::make_unique<TrainingSession>(std::move(backend), cfg_, std::move(in));
    if (resume_) {
        AdamW& opt = session_->optimizer();
        CheckpointLoadInfo info;
        if (opt.sharded()) {
            // The file holds the full moments; a staging optimizer of the one-process layout
            // reads (and checks) them, and this rank keeps its ranges. Its memory is freed at
            // once, but it is a brief peak of two full moment buffers on each rank.
            AdamW staging(session_->model(), opt.config());
            info = load_checkpoint(resume_->path.string(), session_->model(), &staging);
            const auto& owned = opt.partition().owned;
            opt.set_state(pack_owned(staging.get_m(), owned), pack_owned(staging.get_v(), owned),
                          staging.steps_taken());
        } else {
            info = load_checkpoint(resume_->path.string(), session_->model(), &opt);
        }
        if (info.step != start_step_)
            throw TrainError(1, resume_->path.string() + ": step changed while loading");
    }
    const size_t n = static_cast<size_t>(cfg_.data.batch_size) * cfg_.data.seq_len;
    d_inputs_ = DeviceBuffer(session_->backend(), n * sizeof(int), MemoryCategory::data);
    d_targets_ = DeviceBuffer(session_->backend(), n * sizeof(int), MemoryCategory::data);
}

// Mean loss over the validation batches: forward only, so the weights, the moments and the data
// position are untouched (the next step's forward overwrites every activation it reads).
double Trainer::evaluate() {
    GPT& model = session_->model();
    Backend& be = session_->backend();
    const int B = cfg_.data.batch_size, T = cfg_.data.seq_len;
    const size_t bytes = static_cast<size_t>(B) * T * sizeof(int);
    double sum = 0;
    for (size_t i = 0; i < val_.inputs.size(); ++i) {
        be.copy_to_device(d_inputs_.get(), val_.inputs[i].data(), bytes);
        be.copy_to_device(d_targets_.get(), val_.targets[i].data(), bytes);
        model.forward(d_inputs_.as<int>(), d_targets_.as<int>(), B, T);
        sum += model.loss();
    }
    // Every rank's slice has B rows, so the mean of the ranks' means is the global batch's.
    world_.allreduce_sum(&sum, 1, cfg_.dist.timeout_s, "the validation loss");
    return sum / static_cast<double>(val_.inputs.size() * static_cast<size_t>(world_.size()));
}

// Every rank calls it at the same step (ZeRO-1: every rank's moments are gathered); rank 0
// writes.
void Trainer::checkpoint(int step) {
    GPT& model = session_->model();
    AdamW& opt = session_->optimizer();
    FullMoments full;
    if (opt.sharded())
        full = gather_full_moments(opt, model.trainable_count(), world_, cfg_.dist.timeout_s);
    if (!leader_) return;
    csv_->sync();  // the rows this checkpoint counts are on disk before it is
    if (!opt.sharded()) full = FullMoments{opt.get_m(), opt.get_v()};
    // ZeRO-1 gathers the parameters after every optimizer step, so rank 0's are all of them.
    // The checksum covers exactly the tensors save_checkpoint writes (checkpoint_tensors: the
    // moments of the trainable tensors only).
    const std::vector<float> params = model.get_params();
    NamedBytes tensors;
    for (const CheckpointTensor& t :
         checkpoint_tensors(model.parameter_table(), params, &full.m, &full.v))
        tensors[t.name] = std::as_bytes(t.values);
    std::map<std::string, std::string> extra;
    extra[kFormatKey] = kFormatVersion;
    for (const auto& [k, val] : config_) extra[kConfigPrefix + k] = val;
    extra[kPositionKey] = std::to_string(loader_->position());
    extra[kCsvRowsKey] = std::to_string(step);
    extra[kSeedKey] = std::to_string(cfg_.run.seed);
    extra[kWorldSizeKey] = std::to_string(world_.size());
    extra[kGlobalBatchKey] = std::to_string(global_batch());
    extra[kRngKey] =
        "none to carry: weights initialised once by run.seed; batch i is a pure function of "
        "(run.seed, i); no dropout";
    extra[kChecksumKey] = checksum_text(tensors, extra);
    if (opt.sharded()) {
        // save_checkpoint writes an optimizer's moments in the one-process layout: a staging
        // one holds the gathered moments (a brief peak of two full moment buffers on rank 0),
        // so the file is exactly what a one-process run writes.
        AdamW staging(model, opt.config());
        staging.set_state(full.m, full.v, opt.steps_taken());
        save_checkpoint((ckdir_ / checkpoint_name(step)).string(), model, &staging, extra);
    } else {
        save_checkpoint((ckdir_ / checkpoint_name(step)).string(), model, &opt, extra);
    }
    // Older ones go only now that the new one is whole (renamed into place and fsynced).
    const auto all = list_checkpoints(ckdir_);
    std::error_code ec;
    for (size_t i = static_cast<size_t>(train_.keep_checkpoints); i < all.size(); ++i)
        fs::remove(all[i].second, ec);
}

// The machine-noise line of the steps this process ran (rank 0's under data parallel), e.g.
// "machine: other processes took 0.42 cores on average, 1.70 at most (steps 120–135); steal 0".
void Trainer::print_noise() const {
    const std::string line = train_noise_line(noise_.noise());
    if (!line.empty()) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

void Trainer::print_progress(int step, const StepRecord& r, const std::optional<double>& val,
                             bool diverged) {
    ++steps_here_;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    tokens_here_ += r.tokens;  // the real lengths of the step's batches (data.seq_len_jitter)
    const double tokens = tokens_here_;
    if (val) last_val_ = val;
    char val_text[32] = "-";
    if (last_val_) std::snprintf(val_text, sizeof val_text, "%.4f", *last_val_);
    std::printf("step %*d/%d  loss %.4f  val %s  %.0f tok/s  %.1f ms/step  ETA %s%s\n",
                static_cast<int>(std::to_string(train_.steps).size()), step, train_.steps, r.loss,
                val_text, elapsed > 0 ? tokens / elapsed : 0.0, r.times.wall_ms,
                duration_text(elapsed / steps_here_ * (train_.steps - step)).c_str(),
                diverged ? "  DIVERGED" : "");
    std::fflush(stdout);
}

int Trainer::run() {
    if (world_.distributed()) check_same_config();
    if (leader_) {
        try {
            prepare_directory();
        } catch (const TrainError& e) {
            if (!world_.distributed()) throw;
            std::fprintf(stderr, "microtrain train: %s\n", e.what());
            share_resume_point(e.code);
        }
    }
    if (world_.distributed()) share_resume_point(0);
    build_session();
    if (train_.eval_every > 0) val_ = make_validation_set(cfg_, train_.eval_batches, world_);
    if (!leader_) return start_step_ >= train_.steps ? 0 : loop();
    csv_ = std::make_unique<CsvAppender>(csv_path_);
    std::printf("microtrain train: %s%s, %s, %zu params, B=%d T=%d grad_accum %d on %s\n",
                spec_.name.c_str(), opts_.variant.empty() ? "" : (" / " + opts_.variant).c_str(),
                cfg_.model.describe().c_str(), session_->n_params(), cfg_.data.batch_size,
                cfg_.data.seq_len, cfg_.run.grad_accum, session_->backend().device_name().c_str());
    if (const auto w = threads_beyond_cores(session_->backend()))
        std::printf("  warning: the CPU backend %s: %s\n", w->what.c_str(), w->fix.c_str());
    if (world_.distributed())
        std::printf(
            "  data parallel: %d ranks (%s), ZeRO-%d; data.batch_size %d is per rank, "
            "the global batch is %d\n",
            world_.size(), world_.transport().c_str(), cfg_.dist.zero, cfg_.data.batch_size,
            global_batch());
    std::printf("  data %s; validation %s\n", loader_->describe().c_str(),
                val_.inputs.empty()
                    ? (train_.eval_every > 0 ? "none (set data.val_fraction or data.val_path)"
                                             : "off (train.eval_every 0)")
                    : (val_.source + ", " + std::to_string(train_.eval_batches) +
                       " batches every " + std::to_string(train_.eval_every) + " steps")
                          .c_str());
    std::printf("  %s %s at step %d, to step %d\n", resume_ ? "resumed from" : "writing to",
                resume_ ? resume_->path.string().c_str() : dir_.string().c_str(), start_step_,
                train_.steps);
    // The loader's position counts global batches: with another global batch (ranks x
    // data.batch_size) the run continues at the same batch index, but each batch now holds other
    // rows, so the data from here on is not what the original run would have seen.
    const uint64_t saved_batch = resume_ && resume_->global_batch
                                     ? resume_->global_batch
                                     : static_cast<uint64_t>(cfg_.data.batch_size);
    if (resume_ && saved_batch != static_cast<uint64_t>(global_batch()))
        std::fprintf(stderr,
                     "microtrain train: warning: the checkpoint was written with a global batch "
                     "of %llu rows, this run's is %d (%d rank(s) x data.batch_size %d); the data "
                     "position (%llu batches) is in global batches, so the batches from here on "
                     "are composed differently and the run is not a bitwise continuation\n",
                     static_cast<unsigned long long>(saved_batch), global_batch(), world_.size(),
                     cfg_.data.batch_size, static_cast<unsigned long long>(resume_->data_position));
    std::fflush(stdout);
    if (start_step_ >= train_.steps) {
        std::printf("nothing to do: the run is at step %d >= train.steps %d (raise --steps)\n",
                    start_step_, train_.steps);
        return 0;
    }
    return loop();
}

// Steps start+1 .. train.steps through a StepLoop (engine/step_loop.h: the non-finite and
// stop-signal policy): after each step (validate), the CSV row, the progress line; after each
// finite one (checkpoint) — also after the step that saw a stop signal, under protect_writes.
// Data parallel: the loss, the validation loss and the stop signal are agreed over the ranks, so
// every rank validates, checkpoints and stops after the same step. The loop counts steps from
// 0, the run from 1: loop step i is the run's step i + 1.
int Trainer::loop() {
    StopSignals signals;
    t0_ = std::chrono::steady_clock::now();
    StepLoopOptions steps;
    // Steps numbered from 1, as train.csv and the progress line number them. Every rank sees the
    // same (all-reduced) loss, so every rank flags the same step.
    DivergenceWatch divergence(cfg_.model.vocab_size);
    steps.on_step = [&](const TrainingSession::CompletedStep& done) {
        const StepRecord& rec = done.record;
        const int step = rec.step + 1;
        const std::optional<Divergence> diverged =
            divergence.observe(step, rec.loss, rec.grad_norm);
        if (diverged && leader_)
            std::fprintf(stderr, "microtrain train: warning: %s\n",
                         divergence_warning(*diverged).c_str());
        std::optional<double> val;
        if (!val_.inputs.empty() && step % train_.eval_every == 0) val = evaluate();
        if (leader_) {
            csv_->append(csv_row(step, rec, val, csv_noise_columns_));
            StepRow row = step_row(rec);
            row.step = step;  // numbered as train.csv numbers it (from 1)
            noise_.add(row);
            print_progress(step, rec, val, divergence.found().has_value());
        }
    };
    steps.after_step = [&](const StepRecord& rec, int sig) {
        const int step = rec.step + 1;
        if (sig) signals.protect_writes();  // a second signal cannot cut the checkpoint off
        if (sig || step == train_.steps ||
            (train_.checkpoint_every > 0 && step % train_.checkpoint_every == 0))
            checkpoint(step);
    };
    const LoopOutcome outcome =
        StepLoop(*session_, std::move(steps)).run(start_step_, train_.steps);
    const int step = outcome.step + 1;
    switch (outcome.end) {
        case LoopOutcome::End::non_finite:
            throw TrainError(1,
                             std::string("the ") +
                                 (outcome.non_finite.in_loss ? "loss" : "gradient norm") +
                                 " is not finite at step " + std::to_string(step) +
                                 "; no checkpoint of the diverged model is written (the last one "
                                 "is kept); " +
                                 non_finite_hint(cfg_.optim, outcome.non_finite.in_loss),
                             /*agreed=*/true);
        case LoopOutcome::End::interrupted:
            if (leader_) print_noise();
            if (leader_)
                std::fprintf(stderr,
                             "microtrain train: stopped by signal %d after step %d; checkpoint "
                             "%s written; continue with --resume %s\n",
                             outcome.signal, step,
                             (ckdir_ / checkpoint_name(step)).string().c_str(),
                             dir_.string().c_str());
            return 128 + outcome.signal;
        case LoopOutcome::End::completed:
            break;
    }
    if (leader_) {
        print_noise();
        const std::string last = (ckdir_ / checkpoint_name(train_.steps)).string();
        std::printf("done: %d steps; checkpoint %s\n", train_.steps, last.c_str());
        if (cfg_.trainable.lora.enabled())  // what to do with the adapters (docs/commands.md)
            std::printf(
                "  export the adapters: microtrain export %s --merged MERGED.safetensors "
                "--adapters ADAPTERS.safetensors\n",
                last.c_str());
    }
    if (divergence.found()) {
        if (leader_)
            std::fprintf(stderr,
                         "microtrain train: the run diverged at step %d (%s); its checkpoints "
                         "hold the diverged model\n",
                         divergence.found()->step, divergence.found()->reason.c_str());
        return 1;
    }
    return 0;
}

}  // namespace

namespace {

// Prints the error and returns `code`; data parallel, a failure on one rank ends the job (the
// others would wait for it in the next collective), unless every rank met it at the same point.
int fail(int code, const char* what, bool agreed = false) {
    World& world = World::current();
    if (!world.distributed()) {
        std::fprintf(stderr, "microtrain train: %s\n", what);
        return code;
    }
    if (agreed) {
        if (world.rank() == 0 && *what) std::fprintf(stderr, "microtrain train: %s\n", what);
        return code;
    }
    std::fprintf(stderr, "microtrain train: rank %d of %d: %s; ending the job (all ranks)\n",
                 world.rank(), world.size(), what);
    world.abort(code);
}

}  // namespace

namespace {

// The metadata value `key` as a whole decimal number in [0, max]: a SafeTensorsError naming the
// key, the value and the range otherwise (a 20-digit value included, which std::stoull would
// have thrown as a bare "stoull").
uint64_t metadata_number(const SafeTensorsFile& f, const char* key, uint64_t max) {
    const std::string* v = f.metadata_value(key);
    if (!v) throw SafeTensorsError(std::string("__metadata__ \"") + key + "\" is missing");
    uint64_t n = 0;
    const char* end = v->data() + v->size();
    const auto [stop, ec] = std::from_chars(v->data(), end, n);
    if (v->empty() || ec != std::errc() || stop != end || n > max)
        throw SafeTensorsError(std::string("__metadata__ \"") + key + "\" is \"" +
                               v->substr(0, 40) + (v->size() > 40 ? "..." : "") +
                               "\", expected an integer in [0, " + std::to_string(max) + "]");
    return n;
}

}  // namespace

TrainCheckpointState read_train_checkpoint(const SafeTensorsFile& f) {
    const std::string* format = f.metadata_value(kFormatKey);
    if (!format || *format != kFormatVersion)
        throw SafeTensorsError(std::string("not a microtrain train checkpoint of format ") +
                               kFormatVersion + " (__metadata__ \"" + kFormatKey + "\" is " +
                               (format ? "'" + format->substr(0, 40) + "'" : "absent") + ")");
    TrainCheckpointState s;
    const uint64_t int_max = static_cast<uint64_t>(std::numeric_limits<int>::max());
    s.step = static_cast<int>(metadata_number(f, "step", int_max));
    s.data_position = metadata_number(f, kPositionKey, std::numeric_limits<uint64_t>::max());
    if (f.metadata_value(kGlobalBatchKey))
        s.global_batch = metadata_number(f, kGlobalBatchKey, int_max);
    if (metadata_number(f, kCsvRowsKey, int_max) != static_cast<uint64_t>(s.step))
        throw SafeTensorsError("its train.csv row count differs from its step");
    // Last, as it reads every tensor: a file whose numbers do not even parse is skipped sooner.
    const std::string* sum = f.metadata_value(kChecksumKey);
    if (!sum || *sum != file_checksum(f))
        throw SafeTensorsError(
            "its tensors or its microtrain.* metadata do not match the checksum it was written "
            "with (the file was damaged or edited after it was written)");
    const std::string prefix = kConfigPrefix;
    for (const auto& [k, v] : f.metadata())
        if (k.rfind(prefix, 0) == 0) s.config[k.substr(prefix.size())] = v;
    return s;
}

int run_training(const TrainRunOptions& options) {
    try {
        Trainer t(options);
        return t.run();
    } catch (const TrainError& e) {
        return fail(e.code, e.what(), e.agreed);
    } catch (const SpecError& e) {
        return fail(2, e.what());
    } catch (const DataError& e) {
        return fail(2, e.what());
    } catch (const ResourceError& e) {  // does not fit / too many threads: fixable by the user
        return fail(2, e.what());
    } catch (const FileKindError& e) {  // a FIFO, device or symlink where a file goes: the user's
        return fail(2, e.what());
    } catch (const std::exception& e) {
        return fail(1, e.what());
    }
}

}  // namespace mt
