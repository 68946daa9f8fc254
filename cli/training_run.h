// `microtrain train FILE.yaml`: a real training run of one config of an experiment file, with a
// validation loss, a per-step CSV, checkpoints and bitwise-exact resumption (docs/design.md,
// "The training run"; docs/commands.md, `microtrain train`).
//
// The run directory:
//   DIR/train.csv                              step,loss,val_loss,lr,grad_norm,ms — one row per
//                                              step, flushed every step
//   DIR/checkpoints/step-NNNNNNNN.safetensors  nanoGPT-named weights, AdamW moments and step,
//                                              and in __metadata__ the resolved config, the
//                                              data-loader position, the RNG account, the CSV
//                                              row count and a checksum (trainer.cpp)
// Every file is replaced atomically, so a SIGKILL at any moment leaves a directory that
// --resume accepts, losing at most the steps since the last checkpoint.
//
// Data parallel (`mpirun -np N microtrain train FILE`): every rank steps its rows of each global
// batch (N x data.batch_size) and evaluates its rows of the validation batches; rank 0 alone
// writes the directory and prints. A checkpoint has the one-process format under either ZeRO
// stage (ZeRO-1 moments are gathered to rank 0), so it resumes under any world size;
// data_position counts global batches (docs/commands.md, "Data parallel").
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mt {

class SafeTensorsFile;

struct TrainRunOptions {
    std::string file;                    // the experiment file
    std::string variant;                 // empty: the file's base config
    std::string out_dir;                 // empty: <report.out_dir>/<name>-train[-<variant>]
    std::string resume_dir;              // --resume DIR (then the run directory is DIR)
    std::optional<int> steps;            // --steps: overrides train.steps
    std::vector<std::string> overrides;  // --set key=value (and --threads as run.threads)
};

// Runs (or resumes) the training run and returns the exit code: 0 done; 1 a runtime failure
// (a non-finite loss, an I/O error); 2 bad input (the file, the flags, a directory that cannot
// be resumed); 128+n when stopped by signal n (SIGINT, SIGTERM, SIGHUP) after checkpointing.
// Errors are printed to stderr, prefixed "microtrain train: ".
int run_training(const TrainRunOptions& options);

// Where a training checkpoint says its run stands (the __metadata__ a resume reads).
struct TrainCheckpointState {
    int step = 0;
    uint64_t data_position = 0;                 // train batches consumed (global batches)
    uint64_t global_batch = 0;                  // rows per batch of the writer; 0: absent
    std::map<std::string, std::string> config;  // microtrain.config.* without the prefix
};

// Reads and checks the metadata of a training checkpoint: the format version, each number parsed
// whole within its range, then the checksum (over the tensors and every microtrain.* metadata
// value, so an edited data_position is a damaged file, not a resume on other batches). Throws
// SafeTensorsError naming the key and what was expected (`train --resume` then skips the file
// with a warning and tries the previous checkpoint).
TrainCheckpointState read_train_checkpoint(const SafeTensorsFile& f);

}  // namespace mt
