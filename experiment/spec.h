// ExperimentSpec: a YAML experiment file parsed and validated. One base config plus variants,
// each a list of dotted-key overrides; resolve() turns each variant into a RunConfig.
#pragma once

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/run_config.h"
#include "report/paired_stats.h"

namespace mt {

// Every spec error names file:line:column, the key, what was expected and (for an unknown key)
// the nearest valid one. what() is the full human message.
struct SpecError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The `train:` section: what `microtrain train FILE` does (the other commands ignore it).
struct TrainSpec {
    int steps = 100;            // optimizer steps of the whole run (--steps overrides)
    int eval_every = 10;        // validation loss every N steps; 0 = never
    int eval_batches = 4;       // validation batches per evaluation (the same ones every time)
    int checkpoint_every = 50;  // checkpoint every N steps; 0 = only at the end and on a signal
    int keep_checkpoints = 2;   // newest N kept; older ones deleted once a new one is whole
};

struct ExperimentSpec {
    std::string name;
    std::string source_path;  // the YAML file
    // Resolved, in file order. variants[i].changed: what it changes against the baseline variant
    // (what the report compares it with); empty for the baseline itself.
    std::vector<RunConfig> variants;
    RunConfig base;        // the file's config with --set applied, before variants
    std::string baseline;  // compare.baseline (a variant name)
    // What the baseline variant's `set:` changes in the base config (empty when it has none).
    std::map<std::string, std::string> baseline_changes;
    // compare.loss_tolerance (relative, on the mean and the final loss); nullopt when the file
    // gives none: the comparison then derives one from the baseline's step-to-step spread.
    std::optional<double> loss_tolerance;
    // compare.min_effect: the smallest speedup (a fraction, default 2 %) a time call counts
    // (report/paired_stats.h).
    double min_effect = kDefaultMinEffect;
    std::string out_dir = "runs";                             // report.out_dir
    TrainSpec train;                                          // train.*
    const RunConfig& variant(const std::string& name) const;  // throws SpecError if absent
};

// Parses and validates `path`; `overrides` are "key=value" strings from --set, applied to the
// base before the variants. Throws SpecError.
ExperimentSpec load_experiment(const std::string& path,
                               const std::vector<std::string>& overrides = {});

// Parses `text` as the value of the knob `key` (a dotted key of the experiment file, such as
// "optim.lr"), checks it exactly as the file's key is checked (its type, its range, what the
// field it is stored in can hold) and stores it in `config`. The one parser behind the file,
// --set and the commands' flags (`step --lr` is optim.lr). Throws SpecError naming `where` (the
// flag as typed) and the key; `key` must be a knob (a programming error otherwise).
void set_knob(RunConfig& config, const std::string& key, const std::string& text,
              const std::string& where);

// The effective config as a flat list of (dotted key, value) in a stable order, for reports.
std::vector<std::pair<std::string, std::string>> flatten(const RunConfig& config);

// The settings of `config` only the CUDA backend provides, as "key value" text ("backend cuda",
// "run.precision bf16", "kernels.attention flash", "data.pin_memory true"). Empty when the config
// runs on the CPU backend as written. (pin_memory is listed though the CPU backend merely
// ignores it: pinned batches only mean something with a device.)
std::vector<std::string> cuda_only_features(const RunConfig& config);

}  // namespace mt
