// Data: token sources and the batch loader.
// A batch is B*(T+1) consecutive tokens per row window: inputs = w[0..T), targets = w[1..T].
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/run_config.h"
#include "kernels/backend.h"

namespace mt {

struct DataError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// A host batch: inputs and targets, each B*T int32, row-major (B, T). The one batch type of the
// project: a view whose tokens are owned by the BatchSource that handed it out.
struct Batch {
    int B = 0, T = 0;
    int* inputs = nullptr;  // points into host memory owned by the batch source
    int* targets = nullptr;
    uint64_t index = 0;  // 0-based batch number in the deterministic order
};

// Where a training step's batches come from (engine/training_session.h asks it once per
// micro-step).
class BatchSource {
  public:
    virtual ~BatchSource() = default;
    // The next batch; it stays valid until the next call.
    virtual const Batch& next() = 0;
};

// One batch held in memory and handed out on every call: the `step` command's given batch, and
// the one repeated batch of `train` and bench/cpu_step (a model that memorises it shows that
// forward, backward and the optimizer work together). Owns its tokens.
class RepeatedBatch final : public BatchSource {
  public:
    // inputs and targets: B*T ids each, row-major (B, T). Throws DataError on a size mismatch.
    RepeatedBatch(int B, int T, std::vector<int> inputs, std::vector<int> targets);
    // B*T+1 ids drawn uniformly from [0, vocab_size) by std::mt19937(seed); inputs = ids[0..n),
    // targets = ids[1..n] (shifted by one, as nanoGPT's get_batch).
    static RepeatedBatch uniform_random(int B, int T, int vocab_size, uint64_t seed);
    // Moving keeps the vectors' buffers, so batch_ still points at them; a copy would not.
    RepeatedBatch(RepeatedBatch&&) noexcept = default;
    RepeatedBatch& operator=(RepeatedBatch&&) noexcept = default;
    RepeatedBatch(const RepeatedBatch&) = delete;
    RepeatedBatch& operator=(const RepeatedBatch&) = delete;
    const Batch& next() override;
    const Batch& batch() const { return batch_; }

  private:
    std::vector<int> inputs_, targets_;
    Batch batch_;
};

// Writes an llm.c token file: 256 int32 header (magic 20240520, version 1, count) + uint16 tokens.
void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens);
// Reads one; throws DataError naming the file and what is wrong (magic, version, truncation).
std::vector<uint16_t> read_token_file(const std::string& path);
// Checks an llm.c token file's header and size without reading the tokens; returns the count.
// Throws DataError like read_token_file.
size_t token_file_count(const std::string& path);

// Checks the data source of `config` as the loader will read it, without keeping it: the file of
// a tokens / text source is a regular file (not a FIFO, device or directory, which would block or
// mislead), readable, well-formed (token header; UTF-8), every token < vocab_size, and long
// enough for one batch. Throws DataError naming the file and what is wrong. `microtrain validate`
// runs it so a bad data file fails before an experiment starts, not in its first step.
void check_data_source(const DataConfig& config, int vocab_size);
// check_data_source for data.path and, when set, data.val_path: the DataError's message starts
// with the key ("data.val_path: 'val.bin': token 600 ..."). `validate` and `train` (before it
// creates its run directory) run it.
void check_data_sources(const DataConfig& config, int vocab_size);

// The length of batch `batch` under shape jitter (data.seq_len_jitter j): seq_len when j is 0,
// otherwise drawn uniformly from [max(1, ceil((1 - j) * seq_len)), seq_len] by a generator seeded
// from (seed, batch) alone, so a resumed run and every data-parallel rank (all of which count the
// same global batch index) agree on it. Throws DataError for j outside [0, 1] or seq_len < 1.
int jittered_seq_len(int seq_len, float jitter, uint64_t seed, uint64_t batch);

// The bytes of host memory a DataLoader over `config` reserves for its sample cache (data.cache):
// one prepared window of seq_len + 1 int32 tokens, plus one state byte, per window of the
// training part (the part a `run` / `train` loader reads; `world` ranks: the synthetic stream's
// nominal length follows the global batch). 0 when config.cache is false, and when the source
// cannot be examined (the loader then reports why).
size_t sample_cache_bytes(const DataConfig& config, int world = 1);

// Which windows a DataLoader draws from. With data.val_fraction f > 0 the last
// max(1, floor(f * W)) of the W windows are the validation part and the rest the training part;
// with f = 0 both are all windows. (data.val_path is a loader of its own over that file.)
enum class DataSplit { train, val };

// Where a loader starts and which part it reads. The defaults are the `run` command's loader.
struct DataLoaderOptions {
    DataSplit split = DataSplit::train;
    // The first batch next() returns: a resumed run continues at the batches it had consumed.
    uint64_t first_batch = 0;
    // Data parallel: rank `rank` of `world` takes rows [rank*B, rank*B + B) of the global batch
    // of world*B rows, so `world` loaders of batch B hand out exactly what one loader of batch
    // world*B does (the same windows, in the same order, the same epochs).
    int rank = 0, world = 1;
};

// Produces batches in a deterministic order (by seed) for any number of workers: workers 0
// loads synchronously inside next(); workers > 0 fill a ring of `prefetch` batches in background
// threads. Either way batch i is the same. Epochs wrap. With data.seq_len_jitter > 0 batch i has
// T = jittered_seq_len(...) <= seq_len (the first T + 1 tokens of each of its windows); with
// data.cache every window's prepared tokens are kept after their first use.
class DataLoader final : public BatchSource {
  public:
    // vocab_size: tokens must be < vocab_size (checked; DataError otherwise).
    DataLoader(const DataConfig& config, int vocab_size, uint64_t seed, Backend* backend = nullptr,
               DataLoaderOptions options = {});
    ~DataLoader();
    DataLoader(const DataLoader&) = delete;
    DataLoader& operator=(const DataLoader&) = delete;

    // Blocks until the next batch is ready. The returned batch stays valid until the next call.
    const Batch& next() override;
    size_t num_tokens() const;     // tokens in the source (synthetic: nominal size)
    uint64_t num_windows() const;  // windows of the part this loader reads
    uint64_t position() const;     // batches consumed so far, counting from batch 0
    // Samples (windows) read and preprocessed so far, by every thread: with data.cache each
    // window is prepared once, without it once per use. (Counts work, for tests and reports.)
    uint64_t samples_prepared() const;
    size_t cache_bytes() const;    // host bytes reserved for the sample cache (0 without)
    std::string describe() const;  // "synthetic, B4 T64, workers 0" etc.

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace mt
