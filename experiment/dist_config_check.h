// Data parallel: every rank of a job must run the same config, or the ranks would train (or
// measure) different things while their collectives still line up. `run` and `train` check this
// once, before anything is built, with the functions here.
#pragma once

#include <string>

#include "distributed/world.h"
#include "experiment/spec.h"

namespace mt {

// Rank 0's `mine` (the resolved config as "key=value" lines) is broadcast; a rank whose own
// differs prints the first lines that differ, prefixed "microtrain COMMAND: rank r of N", and
// every rank learns the verdict (a max over the ranks), so they all refuse together. Returns
// false on a mismatch (rank 0 then also prints that nothing was run). Every rank must call it.
bool same_text_on_every_rank(const std::string& mine, World& world, double timeout_s,
                             const char* command);

// Every key of every variant of `spec`, as same_text_on_every_rank compares them (`run`).
std::string resolved_config_text(const ExperimentSpec& spec);
bool same_config_on_every_rank(const ExperimentSpec& spec, World& world,
                               const char* command = "run");

}  // namespace mt
