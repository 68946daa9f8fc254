// Sub-commands of the `microtrain` CLI. Each registers itself on the CLI11 app; main.cpp calls
// them in order. A command's callback returns its exit code via the int it is given.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace mt {
void register_train_command(CLI::App& app, int& exit_code);         // cli/cmd_train.cpp
void register_step_command(CLI::App& app, int& exit_code);          // cli/cmd_step.cpp
void register_validate_command(CLI::App& app, int& exit_code);      // cli/cmd_validate.cpp
void register_run_command(CLI::App& app, int& exit_code);           // cli/cmd_run.cpp
void register_compare_command(CLI::App& app, int& exit_code);       // cli/cmd_compare.cpp
void register_export_command(CLI::App& app, int& exit_code);        // cli/cmd_export.cpp
void register_sample_command(CLI::App& app, int& exit_code);        // cli/cmd_sample.cpp
void register_write_tokens_command(CLI::App& app, int& exit_code);  // cli/cmd_write_tokens.cpp

// `--set KEY=VALUE` of run, validate and train (repeatable): one value per --set, so the FILE
// after it is not read as a second override (`run --set k=v FILE` said "file is required").
inline CLI::Option* add_set_option(CLI::App* cmd, std::vector<std::string>& overrides,
                                   const std::string& help) {
    return cmd->add_option("--set", overrides, help)->allow_extra_args(false);
}

struct GPTConfig;
class RepeatedBatch;
// `step --batch`'s file (cli/cmd_step.cpp), read and validated against `model` (`weights`
// names its file in errors): int `inputs` and `targets` (B, T), T <= max_seq_len, ids in
// [0, vocab_size). Throws CheckpointError or DataError. Public for tests/fuzz/fuzz_batch.cpp.
RepeatedBatch read_step_batch(const std::string& path, const GPTConfig& model,
                              const std::string& weights);
}  // namespace mt
