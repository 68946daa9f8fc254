// Data: llm.c token files and the batch loader.
//
// Order of batches. The source is a stream of n tokens. It is cut into W = (n-1)/T row windows
// of T+1 tokens starting at multiples of T (window w = tokens [w*T, w*T+T]; inputs are the first
// T, targets the last T, so consecutive windows share one token). Each epoch visits every window
// once in an order shuffled by (seed, epoch) with Fisher-Yates; global row g is window
// perm_{g / W}[g % W], and batch i is rows i*B .. i*B+B-1 (a batch may straddle two epochs).
// Batch i is therefore a pure function of (source, seed, B, T, i): the workers only decide
// *when* it is built, never *what* it holds.
//
// Split (data.val_fraction f > 0). The last V = max(1, floor(f*W)) windows are the validation
// part and the first W-V the training part; a loader reads one part, with W above standing for
// that part's window count and window ids offset to the part's first window. Starting at batch k
// (DataLoaderOptions::first_batch, a resumed run) is the same as having consumed k batches.
//
// Shape jitter (data.seq_len_jitter j > 0). Batch i is L_i = jittered_seq_len(T, j, seed, i)
// tokens long: each of its rows is the first L_i + 1 tokens of its window (inputs the first L_i,
// targets the next L_i). The windows stay cut at multiples of T, so the epochs, the split and the
// cache are those of T; only the tokens a batch reads shrink. A row-major (B, L_i) batch fills the
// front of a slot sized for (B, T).
//
// Sample cache (data.cache). The key of a sample is its window id within the loader's part
// (0 .. W-1): every source, synthetic included, is cut into W windows (a synthetic stream has a
// nominal length, so it has epochs too), and epoch e visits each window once. The cache is one
// host allocation (under the `data` memory category) of W prepared windows of T + 1 int32 tokens
// plus one state byte each, reserved when the loader is built; a window's pages become resident
// when it is first prepared. So the first epoch prepares every window (read + preprocess_us) and
// every later epoch copies them: the data phase drops after the first epoch. A window's state is
// empty -> filling (one thread claims it and prepares it) -> ready (release store; readers
// acquire); a thread that needs a window another is filling waits for it, so each window is
// prepared exactly once, whatever the number of workers. Under data parallel every rank caches
// the windows its rows visit (over epochs: all of them). The cache holds windows, not batches, so
// a jittered batch takes the prefix it needs of the cached window.
//
// Threads (workers > 0). A ring of P = prefetch slots; batch i lives in slot i % P. A worker may
// claim batch i only once batch i-P has been released by the consumer (i < released + P), so a
// slot is written by exactly one worker while nobody reads it. next() releases the batch it
// returned last time, then waits until its batch is marked ready. A worker that throws stores the
// exception; next() rethrows it. The destructor sets `stop`, wakes everyone and joins: a worker
// blocked on a full ring or spinning in the simulated preprocessing returns promptly.
#include "engine/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <thread>

#include "io/atomic_file.h"
#include "io/regular_file.h"

namespace mt {

namespace {

namespace fs = std::filesystem;

constexpr int32_t kTokenMagic = 20240520;
constexpr int32_t kTokenVersion = 1;
constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);  // 1024

[[noreturn]] void data_error(const std::string& path, const std::string& what) {
    throw DataError("'" + path + "': " + what);
}

// Uniform integer in [0, bound) from a 64-bit engine, by rejection (no modulo bias), written out
// so the shuffle is the same with every standard library.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = rng();
    while (r >= limit);
    return r % bound;
}

void require_regular_file(const std::string& path) {
    if (auto problem = not_a_regular_file(path))
        data_error(path, *problem + "; data.path must name a token or text file");
}

// Busy-spins for `us` microseconds: SIMULATED CPU work per sample (decoding, augmentation,
// tokenisation...). A spin, not a sleep, so it occupies a core the way real preprocessing does.
void spin_for_us(int us, const std::atomic<bool>& stop) {
    if (us <= 0) return;
    const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(us);
    while (std::chrono::steady_clock::now() < end)
        if (stop.load(std::memory_order_relaxed)) return;
}

// An open token file: one descriptor for the size check and every read, so the size checked
// is the size of the file read (a path replaced in between cannot mix two files).
class TokenFile {
  public:
    // O_NONBLOCK: opening a FIFO named as a token file must not wait for a writer (it is then
    // rejected as not a regular file).
    explicit TokenFile(const std::string& path)
        : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {
        if (fd_ < 0) data_error(path, std::string("cannot open: ") + std::strerror(errno));
    }
    TokenFile(const TokenFile&) = delete;
    TokenFile& operator=(const TokenFile&) = delete;
    ~TokenFile() { ::close(fd_); }

    // The file's size; anything but a regular file is an error.
    size_t size() const {
        struct stat st {};
        if (fstat(fd_, &st) != 0)
            data_error(path_, std::string("cannot read its size: ") + std::strerror(errno));
        if (!S_ISREG(st.st_mode))
            data_error(path_, "not a regular file: expected an llm.c token file (.bin)");
        return static_cast<size_t>(st.st_size);
    }
    // Exactly n bytes at `offset`; fewer means the file shrank after its size was checked.
    void read(void* dst, size_t n, size_t offset, const char* what) const {
        auto* out = static_cast<char*>(dst);
        size_t done = 0;
        while (done < n) {
            const ssize_t got =
                ::pread(fd_, out + done, n - done, static_cast<off_t>(offset + done));
            if (got < 0 && errno == EINTR) continue;
            if (got < 0)
                data_error(path_, std::string("cannot read ") + what + ": " + std::strerror(errno));
            if (got == 0)
                data_error(path_, std::string("the file ended at byte ") +
                                      std::to_string(offset + done) + " while reading " + what +
                                      ": it was truncated while being read");
            done += static_cast<size_t>(got);
        }
    }

    int fd() const { return fd_; }

  private:
    std::string path_;
    int fd_;
};

// Header + size checks shared by read_token_file and token_file_count; returns the count.
size_t check_token_header(const std::string& path, const TokenFile& f) {
    const size_t size = f.size();
    if (size < kHeaderBytes)
        data_error(path, "truncated: an llm.c token file starts with a " +
                             std::to_string(kHeaderBytes) + "-byte header, expected at least " +
                             std::to_string(kHeaderBytes) + " bytes, got " + std::to_string(size));
    int32_t header[kHeaderInts];
    // The format is little-endian int32; so is every machine this project targets (x86-64, ARM).
    f.read(header, kHeaderBytes, 0, "the header");
    if (header[0] != kTokenMagic)
        data_error(path, "bad magic number " + std::to_string(header[0]) + " (expected " +
                             std::to_string(kTokenMagic) + "): not an llm.c token file");
    if (header[1] != kTokenVersion)
        data_error(path, "unsupported version " + std::to_string(header[1]) + " (expected " +
                             std::to_string(kTokenVersion) + ": uint16 tokens)");
    if (header[2] < 0)
        data_error(path, "negative token count " + std::to_string(header[2]) + " in the header");
    const size_t count = static_cast<size_t>(header[2]);
    const size_t expected = kHeaderBytes + count * sizeof(uint16_t);
    if (size < expected)
        data_error(path, "truncated: the header says " + std::to_string(count) +
                             " tokens, expected " + std::to_string(expected) + " bytes, got " +
                             std::to_string(size));
    if (size > expected)
        data_error(path, "the header says " + std::to_string(count) + " tokens, expected " +
                             std::to_string(expected) + " bytes, got " + std::to_string(size) +
                             " (trailing data: the header's count is wrong)");
    return count;
}

// Checks every token of the file against the vocabulary in one streaming pass of fixed-size
// chunks (pread through the page cache: no copy of the file is kept, so `validate` of a 4 GiB
// file needs a few MiB). The error locates the first bad token and names the vocabulary that
// would hold the largest one.
void check_token_vocab(const std::string& path, const TokenFile& f, size_t count, int vocab_size) {
    constexpr size_t kChunkTokens = size_t{1} << 20;  // 2 MiB a read
    std::vector<uint16_t> chunk(std::min(count, kChunkTokens));
    size_t bad_at = SIZE_MAX;
    uint16_t bad_value = 0, max_tok = 0;
    for (size_t first = 0; first < count; first += chunk.size()) {
        const size_t n = std::min(chunk.size(), count - first);
        f.read(chunk.data(), n * sizeof(uint16_t), kHeaderBytes + first * sizeof(uint16_t),
               "the tokens");
        for (size_t i = 0; i < n; ++i) {
            max_tok = std::max(max_tok, chunk[i]);
            if (bad_at == SIZE_MAX && chunk[i] >= vocab_size) {
                bad_at = first + i;
                bad_value = chunk[i];
            }
        }
    }
    if (bad_at != SIZE_MAX)
        data_error(path, "token " + std::to_string(bad_value) + " at token offset " +
                             std::to_string(bad_at) + " (byte " +
                             std::to_string(kHeaderBytes + 2 * bad_at) +
                             ") is >= model.vocab_size " + std::to_string(vocab_size) +
                             "; the file was tokenised for a larger vocabulary: set "
                             "model.vocab_size to at least " +
                             std::to_string(max_tok + 1));
}

// The tokens of an llm.c token file, mapped read-only rather than copied: the pages are the page
// cache's, shared by every process that maps the file (each MPI rank, each variant's worker) and
// reclaimable under memory pressure, so the file costs no private memory and is not part of the
// memory estimate. The header, the size and every token are checked before it is mapped (the
// located errors above). A file truncated in place while mapped would fault (SIGBUS) on the lost
// pages: a token file is not rewritten under a running job (write_token_file replaces a file by
// rename, which leaves the mapped inode intact).
class MappedTokenFile {
  public:
    MappedTokenFile(const std::string& path, int vocab_size) {
        const TokenFile f(path);
        count_ = check_token_header(path, f);
        check_token_vocab(path, f, count_, vocab_size);
        bytes_ = kHeaderBytes + count_ * sizeof(uint16_t);
        base_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, f.fd(), 0);
        if (base_ == MAP_FAILED)
            data_error(path, std::string("cannot map it into memory: ") + std::strerror(errno));
    }
    MappedTokenFile(const MappedTokenFile&) = delete;
    MappedTokenFile& operator=(const MappedTokenFile&) = delete;
    ~MappedTokenFile() { ::munmap(base_, bytes_); }

    // The header is 1024 bytes, so the tokens start aligned for uint16_t.
    std::span<const uint16_t> tokens() const {
        return {reinterpret_cast<const uint16_t*>(static_cast<const char*>(base_) + kHeaderBytes),
                count_};
    }

  private:
    void* base_ = nullptr;
    size_t bytes_ = 0, count_ = 0;
};

// Byte offset of the first invalid UTF-8 sequence, or npos.
size_t first_invalid_utf8(const std::vector<uint16_t>& bytes) {
    size_t i = 0;
    const size_t n = bytes.size();
    while (i < n) {
        const unsigned c = bytes[i];
        size_t len;
        unsigned cp;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07;
        } else {
            return i;
        }
        if (i + len > n) return i;
        for (size_t k = 1; k < len; ++k) {
            if ((bytes[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (bytes[i + k] & 0x3F);
        }
        // Overlong encodings, surrogates and code points past U+10FFFF are invalid.
        static const unsigned min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return std::string::npos;
}

// The nominal length of the synthetic stream for batches of `need` tokens: 64 batches, at least
// 2^20 tokens (the stream itself is readable at any position).
uint64_t synthetic_nominal_tokens(uint64_t need) {
    return std::max<uint64_t>(uint64_t{1} << 20, 64 * need);
}

// The validation part's window count for val_fraction f of `windows` (0 when f is 0).
uint64_t val_windows(float f, uint64_t windows) {
    if (!(f > 0)) return 0;
    return std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(f) * windows));
}

// The sample cache (data.cache; see the top of this file): W prepared windows of T + 1 int32
// tokens, then W state bytes, in one host allocation. Thread-safe: any thread may ask for any
// window.
class SampleCache {
  public:
    static size_t bytes_for(uint64_t windows, int T) {
        return static_cast<size_t>(windows) * ((static_cast<size_t>(T) + 1) * sizeof(int) + 1);
    }

    SampleCache(uint64_t windows, int T, Backend* backend) : window_(static_cast<size_t>(T) + 1) {
        const size_t bytes = bytes_for(windows, T);
        // Not pinned and not touched: the pages become resident as windows are first prepared.
        if (backend) {
            host_ = HostBuffer(*backend, bytes, /*pinned=*/false);
            base_ = host_.as<char>();
        } else {
            plain_.reset(new char[bytes]);
            base_ = plain_.get();
        }
        states_ = reinterpret_cast<std::atomic<uint8_t>*>(base_ + windows * window_ * sizeof(int));
        for (uint64_t w = 0; w < windows; ++w) new (&states_[w]) std::atomic<uint8_t>(kEmpty);
        bytes_ = bytes;
    }
    SampleCache(const SampleCache&) = delete;
    SampleCache& operator=(const SampleCache&) = delete;

    size_t bytes() const { return bytes_; }

    // The T + 1 prepared tokens of window w. The first caller prepares them with
    // prepare(out) -> bool (false: stopped before finishing; the window stays empty); a caller
    // arriving while another prepares it waits. Returns null when `stop` is raised meanwhile.
    template <class Prepare>
    const int* get(uint64_t w, Prepare&& prepare, const std::atomic<bool>& stop) {
        std::atomic<uint8_t>& state = states_[w];
        int* sample = reinterpret_cast<int*>(base_) + w * window_;
        for (;;) {
            uint8_t s = state.load(std::memory_order_acquire);
            if (s == kReady) return sample;
            if (s == kEmpty && state.compare_exchange_strong(s, kFilling, std::memory_order_acq_rel,
                                                             std::memory_order_acquire)) {
                bool done = false;
                try {
                    done = prepare(sample);
                } catch (...) {
                    state.store(kEmpty, std::memory_order_release);
                    throw;
                }
                state.store(done ? kReady : kEmpty, std::memory_order_release);
                return done ? sample : nullptr;
            }
            if (stop.load(std::memory_order_relaxed)) return nullptr;
            std::this_thread::yield();  // another thread is preparing window w
        }
    }

  private:
    static constexpr uint8_t kEmpty = 0, kFilling = 1, kReady = 2;
    size_t window_;  // ints per window: T + 1
    HostBuffer host_;
    std::unique_ptr<char[]> plain_;
    char* base_ = nullptr;
    std::atomic<uint8_t>* states_ = nullptr;
    size_t bytes_ = 0;
};

// The loader's own checks of the values it is given (the spec checks them first, with file
// positions; a loader built in code gets these).
void check_loader_config(const DataConfig& c, int vocab_size) {
    auto bad = [](const std::string& what) { throw DataError("data config: " + what); };
    if (c.batch_size < 1) bad("batch_size must be >= 1, got " + std::to_string(c.batch_size));
    if (c.seq_len < 1) bad("seq_len must be >= 1, got " + std::to_string(c.seq_len));
    if (c.workers < 0) bad("workers must be >= 0, got " + std::to_string(c.workers));
    if (c.prefetch < 1) bad("prefetch must be >= 1, got " + std::to_string(c.prefetch));
    if (c.preprocess_us < 0)
        bad("preprocess_us must be >= 0, got " + std::to_string(c.preprocess_us));
    if (!(c.seq_len_jitter >= 0 && c.seq_len_jitter <= 1))
        bad("seq_len_jitter must be in [0, 1], got " + std::to_string(c.seq_len_jitter));
    if (vocab_size < 1) bad("vocab_size must be >= 1, got " + std::to_string(vocab_size));
}

const char* source_name(DataSource s) {
    switch (s) {
        case DataSource::synthetic:
            return "synthetic";
        case DataSource::tokens:
            return "tokens";
        case DataSource::text:
            return "text";
    }
    return "?";
}

}  // namespace

// ---- token files ----------------------------------------------------------------------------

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
    if (tokens.size() > static_cast<size_t>(INT32_MAX))
        data_error(path, "cannot write " + std::to_string(tokens.size()) +
                             " tokens: the header's int32 count holds at most 2^31-1");
    int32_t header[kHeaderInts] = {};
    header[0] = kTokenMagic;
    header[1] = kTokenVersion;
    header[2] = static_cast<int32_t>(tokens.size());

    const std::span<const std::byte> pieces[] = {
        std::as_bytes(std::span(header)), std::as_bytes(std::span(tokens.data(), tokens.size()))};
    try {
        write_file_atomic(path, pieces);
    } catch (const std::runtime_error& e) {
        throw DataError(e.what());
    }
}

size_t token_file_count(const std::string& path) {
    return check_token_header(path, TokenFile(path));
}

std::vector<uint16_t> read_token_file(const std::string& path) {
    const TokenFile f(path);
    const size_t count = check_token_header(path, f);
    std::vector<uint16_t> tokens(count);
    f.read(tokens.data(), count * sizeof(uint16_t), kHeaderBytes, "the tokens");
    return tokens;
}

// ---- the loader -----------------------------------------------------------------------------

struct DataLoader::Impl {
    DataConfig cfg;
    int vocab = 0;
    uint64_t seed = 0;
    Backend* backend = nullptr;
    int rank = 0, world = 1;  // DataLoaderOptions: this loader's slice of the global batch

    // The stream of a tokens / text source: a token file's mapping, or the text's bytes.
    std::unique_ptr<MappedTokenFile> mapped;   // source tokens
    std::vector<uint16_t> text;                // source text
    std::span<const uint16_t> tokens;          // into one of them
    size_t n = 0;                              // tokens in the stream (synthetic: nominal)
    uint64_t windows = 0;                      // windows of this loader's part (all: (n-1)/T)
    uint64_t window_base = 0;                  // the part's first window (validation: the tail)
    std::optional<SyntheticTokens> synthetic;  // source synthetic

    // Per-epoch window permutations, computed on demand and cached (a few epochs: a batch spans
    // at most two, and the ring is short). Recomputing an evicted one gives the same result.
    std::mutex perm_mu;
    std::map<uint64_t, std::shared_ptr<const std::vector<uint32_t>>> perms;

    struct Slot {
        HostBuffer host;         // with a backend (pinned when asked)
        std::vector<int> plain;  // without one
        int* inputs = nullptr;   // (B, T)
        int* targets = nullptr;  // (B, T)
        uint64_t batch = 0;
        bool ready = false;
    };
    std::vector<Slot> slots;
    Batch current;
    uint64_t consumed = 0;  // batches handed out by next()
    uint64_t first = 0;     // the first batch next() hands out (DataLoaderOptions::first_batch)

    std::mutex mu;
    std::condition_variable cv_work, cv_ready;
    uint64_t next_claim = 0;  // next batch a worker will build
    uint64_t released = 0;    // batches < released are no longer read by the consumer
    std::atomic<bool> stop{false};
    std::exception_ptr error;
    std::vector<std::thread> threads;

    std::unique_ptr<SampleCache> cache;  // data.cache
    std::atomic<uint64_t> prepared{0};   // samples read + preprocessed (samples_prepared())

    // Tokens [start, start + count) of the stream into out.
    void read_tokens(uint64_t start, int count, int* out) const {
        if (synthetic) return synthetic->read(start, count, out);
        std::copy_n(tokens.begin() + static_cast<ptrdiff_t>(start), count, out);
    }

    std::shared_ptr<const std::vector<uint32_t>> perm(uint64_t epoch) {
        std::lock_guard<std::mutex> lk(perm_mu);
        if (auto it = perms.find(epoch); it != perms.end()) return it->second;
        auto p = std::make_shared<std::vector<uint32_t>>(windows);
        for (uint64_t w = 0; w < windows; ++w) (*p)[w] = static_cast<uint32_t>(w);
        std::mt19937_64 rng(splitmix64(seed ^ splitmix64(epoch + 0x5EED)));
        for (uint64_t i = windows - 1; i > 0; --i)
            std::swap((*p)[i], (*p)[uniform_below(rng, i + 1)]);
        perms[epoch] = p;
        while (perms.size() > 4) perms.erase(perms.begin());  // the oldest epoch
        return p;
    }

    // The length of batch i (seq_len unless data.seq_len_jitter).
    int batch_len(uint64_t i) const {
        return jittered_seq_len(cfg.seq_len, cfg.seq_len_jitter, seed, i);
    }

    // Prepares the first `count` tokens of window w (of this loader's part) into out: the read
    // plus the SIMULATED per-sample preprocessing. False when stopped meanwhile.
    bool prepare(uint64_t w, int count, int* out) {
        read_tokens((window_base + w) * static_cast<uint64_t>(cfg.seq_len), count, out);
        spin_for_us(cfg.preprocess_us, stop);
        prepared.fetch_add(1, std::memory_order_relaxed);
        return !stop.load(std::memory_order_relaxed);
    }

    // Window w's first L + 1 prepared tokens: from the cache (which prepares all T + 1 on first
    // use), or prepared now into `scratch`. Null when stopped.
    const int* sample(uint64_t w, int L, int* scratch) {
        if (cache)
            return cache->get(
                w, [&](int* out) { return prepare(w, cfg.seq_len + 1, out); }, stop);
        return prepare(w, L + 1, scratch) ? scratch : nullptr;
    }

    // Builds batch i into (inputs, targets): B rows of L = batch_len(i) tokens, row-major (B, L),
    // targets shifted by one.
    void fill(uint64_t i, int* inputs, int* targets) {
        const int B = cfg.batch_size, L = batch_len(i);
        std::shared_ptr<const std::vector<uint32_t>> p;
        uint64_t p_epoch = UINT64_MAX;
        std::vector<int> scratch(cache ? 0 : static_cast<size_t>(L) + 1);
        for (int r = 0; r < B; ++r) {
            // Global row: batch i of the world is rows (i*world + rank)*B .. of the stream.
            const uint64_t g = (i * static_cast<uint64_t>(world) + static_cast<uint64_t>(rank)) *
                                   static_cast<uint64_t>(B) +
                               r;
            const uint64_t epoch = g / windows;
            if (epoch != p_epoch) p = perm(epoch), p_epoch = epoch;
            // The window's first L+1 tokens: inputs are the first L, targets the last L.
            const int* window = sample((*p)[g % windows], L, scratch.data());
            if (!window) return;  // stopped: nobody reads this batch
            std::copy_n(window, L, inputs + static_cast<size_t>(r) * L);
            std::copy_n(window + 1, L, targets + static_cast<size_t>(r) * L);
        }
    }

    void worker() {
        const uint64_t P = slots.size();
        for (;;) {
            uint64_t i;
            {
                std::unique_lock<std::mutex> lk(mu);
                cv_work.wait(lk, [&] { return stop.load() || next_claim < released + P; });
                if (stop.load()) return;
                i = next_claim++;
            }
            Slot& s = slots[i % P];
            try {
                fill(i, s.inputs, s.targets);
            } catch (...) {
                std::lock_guard<std::mutex> lk(mu);
                if (!error) error = std::current_exception();
                cv_ready.notify_all();
                return;
            }
            {
                std::lock_guard<std::mutex> lk(mu);
                s.batch = i;
                s.ready = true;
            }
            cv_ready.notify_all();
        }
    }

    // Data parallel: this loader's slice of the global batch (DataLoaderOptions::rank/world).
    void take_rank(const DataLoaderOptions& o) {
        if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
            throw DataError("data config: rank " + std::to_string(o.rank) + " of a world of " +
                            std::to_string(o.world));
        rank = o.rank;
        world = o.world;
    }

    // Narrows the loader to its part of the windows (DataSplit) and its first batch.
    void select_split(const DataLoaderOptions& o) {
        Impl& m = *this;
        const float f = m.cfg.val_fraction;
        if (!(f >= 0 && f < 1))
            throw DataError("data config: val_fraction must be in [0, 1), got " +
                            std::to_string(f));
        if (f > 0) {
            const std::string name =
                m.cfg.source == DataSource::synthetic ? "synthetic" : m.cfg.path;
            const uint64_t val = val_windows(f, m.windows);
            if (val >= m.windows)
                data_error(name,
                           "has " + std::to_string(m.windows) + " windows of seq_len " +
                               std::to_string(m.cfg.seq_len) +
                               " tokens, too few to hold out data.val_fraction " +
                               std::to_string(f) +
                               " and still train; use a longer file or a smaller val_fraction");
            if (o.split == DataSplit::val) {
                m.window_base = m.windows - val;
                m.windows = val;
            } else {
                m.windows -= val;
            }
        }
        m.first = m.consumed = m.next_claim = m.released = o.first_batch;
    }

    void shutdown() {
        {
            std::lock_guard<std::mutex> lk(mu);
            stop = true;
        }
        cv_work.notify_all();
        cv_ready.notify_all();
        for (auto& t : threads)
            if (t.joinable()) t.join();
        threads.clear();
    }
};

DataLoader::DataLoader(const DataConfig& config, int vocab_size, uint64_t seed, Backend* backend,
                       DataLoaderOptions options)
    : impl_(std::make_unique<Impl>()) {
    Impl& m = *impl_;
    m.cfg = config;
    m.vocab = vocab_size;
    m.seed = seed;
    m.backend = backend;
    const DataConfig& c = config;
    auto bad = [](const std::string& what) { throw DataError("data config: " + what); };
    check_loader_config(c, vocab_size);

    m.take_rank(options);
    // Sizes are those of the global batch (world * B rows): every rank sees the same stream.
    const uint64_t B = static_cast<uint64_t>(c.batch_size) * options.world, T = c.seq_len;
    const uint64_t need = B * T + 1;  // B windows of T+1 tokens overlapping by one
    if (c.source != DataSource::synthetic && !c.path.empty()) require_regular_file(c.path);
    switch (c.source) {
        case DataSource::synthetic:
            // A virtual stream (engine/synthetic.h: markov or uniform), computed per window.
            // Nominal length: 64 batches, at least 2^20 tokens.
            m.n = synthetic_nominal_tokens(need);
            m.synthetic.emplace(c.synthetic, vocab_size, seed);
            break;
        case DataSource::tokens: {
            if (c.path.empty()) bad("source tokens needs a path (data.path)");
            m.mapped = std::make_unique<MappedTokenFile>(c.path, vocab_size);
            m.tokens = m.mapped->tokens();
            m.n = m.tokens.size();
            break;
        }
        case DataSource::text: {
            if (c.path.empty()) bad("source text needs a path (data.path)");
            if (vocab_size < 256)
                data_error(c.path, "model.vocab_size must be >= 256 for byte-level text, got " +
                                       std::to_string(vocab_size) + "; set model.vocab_size: 256");
            std::ifstream f(c.path, std::ios::binary);
            if (!f) data_error(c.path, std::string("cannot open: ") + std::strerror(errno));
            std::string bytes((std::istreambuf_iterator<char>(f)),
                              std::istreambuf_iterator<char>());
            m.text.assign(bytes.begin(), bytes.end());
            for (auto& t : m.text) t &= 0xFF;  // char may be signed: keep the byte value
            if (size_t at = first_invalid_utf8(m.text); at != std::string::npos)
                data_error(c.path, "not valid UTF-8 at byte offset " + std::to_string(at) +
                                       "; source text expects a UTF-8 text file (use source "
                                       "tokens for an llm.c token file)");
            m.tokens = m.text;
            m.n = m.tokens.size();
            break;
        }
    }
    if (m.n < need) {
        const std::string name = c.source == DataSource::synthetic ? "synthetic" : c.path;
        data_error(name,
                   "has " + std::to_string(m.n) + " tokens, but one batch needs " +
                       std::to_string(need) + " (batch_size " + std::to_string(B) +
                       (options.world > 1 ? " over " + std::to_string(options.world) + " ranks"
                                          : std::string()) +
                       " x seq_len " + std::to_string(T) +
                       " + 1); use a longer file or a smaller batch_size / seq_len");
    }
    m.windows = (m.n - 1) / T;
    if (m.windows > UINT32_MAX)
        data_error(c.path, "has " + std::to_string(m.windows) +
                               " windows of seq_len tokens, more than this loader indexes (2^32)");
    m.select_split(options);
    if (c.cache) m.cache = std::make_unique<SampleCache>(m.windows, c.seq_len, backend);

    // Batch slots: one when loading synchronously, a ring of `prefetch` otherwise.
    const size_t nslots = c.workers == 0 ? 1 : static_cast<size_t>(c.prefetch);
    const size_t elems = static_cast<size_t>(c.batch_size) * T;  // this rank's rows only
    m.slots.resize(nslots);
    for (auto& s : m.slots) {
        int* base;
        if (backend) {
            s.host = HostBuffer(*backend, 2 * elems * sizeof(int), c.pin_memory);
            base = s.host.as<int>();
        } else {
            s.plain.assign(2 * elems, 0);
            base = s.plain.data();
        }
        s.inputs = base;
        s.targets = base + elems;
    }
    for (int w = 0; w < c.workers; ++w) m.threads.emplace_back([&m] { m.worker(); });
}

DataLoader::~DataLoader() {
    impl_->shutdown();
}

const Batch& DataLoader::next() {
    Impl& m = *impl_;
    const uint64_t i = m.consumed;
    Impl::Slot* slot;
    if (m.cfg.workers == 0) {
        slot = &m.slots[0];
        m.fill(i, slot->inputs, slot->targets);
    } else {
        std::unique_lock<std::mutex> lk(m.mu);
        // The batch returned last time is no longer read: its slot may be refilled. (Not on the
        // first call: batch first-1 was never handed out, and its slot may already hold a new one.)
        if (i > m.first) {
            m.slots[(i - 1) % m.slots.size()].ready = false;
            m.released = i;
            m.cv_work.notify_all();
        }
        slot = &m.slots[i % m.slots.size()];
        m.cv_ready.wait(lk, [&] { return m.error || (slot->ready && slot->batch == i); });
        if (m.error) std::rethrow_exception(m.error);
    }
    m.current.B = m.cfg.batch_size;
    m.current.T = m.batch_len(i);
    m.current.inputs = slot->inputs;
    m.current.targets = slot->targets;
    m.current.index = i;
    ++m.consumed;
    return m.current;
}

RepeatedBatch::RepeatedBatch(int B, int T, std::vector<int> inputs, std::vector<int> targets)
    : inputs_(std::move(inputs)), targets_(std::move(targets)) {
    const size_t n = static_cast<size_t>(B) * static_cast<size_t>(T);
    if (B < 1 || T < 1 || inputs_.size() != n || targets_.size() != n)
        throw DataError("RepeatedBatch: expected B*T = " + std::to_string(n) +
                        " inputs and targets for B=" + std::to_string(B) +
                        " T=" + std::to_string(T) + ", got " + std::to_string(inputs_.size()) +
                        " and " + std::to_string(targets_.size()));
    batch_.B = B;
    batch_.T = T;
    batch_.inputs = inputs_.data();
    batch_.targets = targets_.data();
}

RepeatedBatch RepeatedBatch::uniform_random(int B, int T, int vocab_size, uint64_t seed) {
    const size_t n = static_cast<size_t>(B) * static_cast<size_t>(T);
    std::vector<int> tokens(n + 1);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (auto& t : tokens) t = static_cast<int>(rng() % static_cast<uint32_t>(vocab_size));
    return RepeatedBatch(B, T, std::vector<int>(tokens.begin(), tokens.end() - 1),
                         std::vector<int>(tokens.begin() + 1, tokens.end()));
}

const Batch& RepeatedBatch::next() {
    return batch_;
}

size_t DataLoader::num_tokens() const {
    return impl_->n;
}

uint64_t DataLoader::num_windows() const {
    return impl_->windows;
}

uint64_t DataLoader::position() const {
    return impl_->consumed;
}

uint64_t DataLoader::samples_prepared() const {
    return impl_->prepared.load();
}

size_t DataLoader::cache_bytes() const {
    return impl_->cache ? impl_->cache->bytes() : 0;
}

int jittered_seq_len(int seq_len, float jitter, uint64_t seed, uint64_t batch) {
    if (seq_len < 1)
        throw DataError("data config: seq_len must be >= 1, got " + std::to_string(seq_len));
    if (!(jitter >= 0 && jitter <= 1))
        throw DataError("data config: seq_len_jitter must be in [0, 1], got " +
                        std::to_string(jitter));
    if (jitter == 0) return seq_len;
    // The shortest length: (1 - j) of seq_len, rounded up, at least one token.
    const double lo_exact = std::ceil((1.0 - static_cast<double>(jitter)) * seq_len);
    const int lo = std::clamp(static_cast<int>(lo_exact), 1, seq_len);
    if (lo == seq_len) return seq_len;
    // A generator of its own per batch (not a stream): batch i's length depends on (seed, i) only.
    std::mt19937_64 rng(splitmix64(splitmix64(seed ^ 0x5E01E17ull) + batch));
    return lo + static_cast<int>(uniform_below(rng, static_cast<uint64_t>(seq_len - lo) + 1));
}

size_t sample_cache_bytes(const DataConfig& c, int world) {
    if (!c.cache || c.seq_len < 1 || c.batch_size < 1 || world < 1) return 0;
    const uint64_t T = static_cast<uint64_t>(c.seq_len);
    const uint64_t need =
        static_cast<uint64_t>(c.batch_size) * static_cast<uint64_t>(world) * T + 1;
    uint64_t n = 0;
    try {
        switch (c.source) {
            case DataSource::synthetic:
                n = synthetic_nominal_tokens(need);
                break;
            case DataSource::tokens:
                n = token_file_count(c.path);
                break;
            case DataSource::text: {
                std::error_code ec;
                const auto size = fs::file_size(c.path, ec);  // one token per byte
                n = ec ? 0 : static_cast<uint64_t>(size);
                break;
            }
        }
    } catch (const DataError&) {
        return 0;
    }
    if (n < need) return 0;
    const uint64_t windows = (n - 1) / T, val = val_windows(c.val_fraction, windows);
    if (val >= windows) return 0;
    return SampleCache::bytes_for(windows - val, c.seq_len);
}

std::string DataLoader::describe() const {
    const DataConfig& c = impl_->cfg;
    std::ostringstream os;
    os << source_name(c.source);
    if (c.source == DataSource::synthetic) os << " " << enum_name(c.synthetic);
    if (c.source != DataSource::synthetic) os << " '" << c.path << "'";
    os << " (" << impl_->n << " tokens" << (c.source == DataSource::synthetic ? ", nominal" : "")
       << "), B" << c.batch_size << " T" << c.seq_len << ", workers " << c.workers;
    if (c.workers > 0) os << ", prefetch " << c.prefetch;
    if (c.pin_memory) os << ", pinned";
    if (c.preprocess_us > 0) os << ", preprocess " << c.preprocess_us << " us/sample (simulated)";
    if (c.seq_len_jitter > 0) os << ", seq_len jitter " << c.seq_len_jitter;
    if (impl_->cache)
        os << ", cache " << impl_->windows << " samples ("
           << static_cast<double>(impl_->cache->bytes()) / (1024.0 * 1024.0) << " MiB)";
    return os.str();
}

void check_data_source(const DataConfig& config, int vocab_size) {
    if (config.source == DataSource::synthetic) return;
    DataConfig probe = config;  // synchronous, unpinned: no threads, no backend
    probe.workers = 0;
    probe.pin_memory = false;
    probe.preprocess_us = 0;
    probe.cache = false;
    DataLoader loader(probe, vocab_size, /*seed=*/0);
}

void check_data_sources(const DataConfig& config, int vocab_size) {
    try {
        check_data_source(config, vocab_size);
    } catch (const DataError& e) {
        throw DataError(std::string("data.path: ") + e.what());
    }
    if (config.source == DataSource::synthetic || config.val_path.empty()) return;
    DataConfig validation = config;  // read as the validation batches are: a loader over it
    validation.path = config.val_path;
    validation.val_path.clear();
    try {
        check_data_source(validation, vocab_size);
    } catch (const DataError& e) {
        throw DataError(std::string("data.val_path: ") + e.what());
    }
}

}  // namespace mt
