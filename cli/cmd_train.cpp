// `microtrain train FILE.yaml`: a real training run of one config of an experiment file, with
// validation, train.csv, checkpoints and --resume (cli/training_run.h). Without FILE (or with
// --one-batch): the quickest smoke test, a StepLoop (engine/step_loop.h) on one repeated random
// batch printing loss and ms/step each step. `microtrain run` is the measured, reported
// experiment.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/training_run.h"
#include "engine/step_loop.h"
#include "engine/training_session.h"
#include "experiment/spec.h"

namespace mt {
namespace {

// Command-line bounds: CLI11 states them in its message ("Value 0 not in range 1 to 1000000").
constexpr int kMaxSteps = 1000000;
constexpr int kMaxBatch = 65536;
constexpr int kMaxSeqLen = 1 << 20;

struct TrainArgs {
    // The training run (FILE given).
    std::string file, variant, out_dir, resume, init_from;
    std::vector<std::string> overrides;
    bool one_batch = false;
    // The one-batch smoke test (no FILE, or --one-batch).
    std::string preset = "tiny";
    std::string backend = "cpu";
    int batch = 4, seq_len = 32, steps = 20, threads = 0;
    std::string lr = "0.001";  // read by optim.lr's parser (set_knob), as in a file
    uint64_t seed = 1337;
};

// The RunConfig of `train`: the preset, one micro-batch per step, AdamW's defaults but the LR.
RunConfig train_config(const TrainArgs& a, const GPTConfig& model) {
    RunConfig c;
    c.variant = "train";
    c.model_preset = a.preset;
    c.model = model;
    c.data.batch_size = a.batch;
    c.data.seq_len = a.seq_len;
    set_knob(c, "optim.lr", a.lr, "--lr " + a.lr);
    c.run.seed = a.seed;
    c.run.threads = a.threads;
    c.profile.trace = false;
    return c;
}

int run_one_batch(const TrainArgs& a) {
    auto config = gpt_preset(a.preset);
    if (!config) {
        std::fprintf(stderr, "microtrain train: unknown --preset '%s'\n", a.preset.c_str());
        return 2;
    }
    if (a.seq_len > config->max_seq_len) {
        std::fprintf(stderr, "microtrain train: --seq-len %d exceeds max_seq_len %d of '%s'\n",
                     a.seq_len, config->max_seq_len, a.preset.c_str());
        return 2;
    }
    const RunConfig cfg = train_config(a, *config);
    // One fixed pseudo-random batch: repeated, the loss falls well below ln(V) as the model
    // memorises it, which is the visible sign that forward, backward and AdamW work together.
    TrainingInputs inputs;
    inputs.batches = std::make_unique<RepeatedBatch>(
        RepeatedBatch::uniform_random(a.batch, a.seq_len, config->vocab_size, a.seed));
    inputs.track_memory = false;
    TrainingSession session(
        create_training_backend(cfg, a.backend == "cuda" ? BackendKind::cuda : BackendKind::cpu),
        cfg, std::move(inputs));

    std::printf("microtrain train: %s (%s), %zu params, B=%d T=%d on %s\n", a.preset.c_str(),
                config->describe().c_str(), session.n_params(), a.batch, a.seq_len,
                session.backend().device_name().c_str());
    if (const auto w = threads_beyond_cores(session.backend()))
        std::printf("  warning: the CPU backend %s: %s\n", w->what.c_str(), w->fix.c_str());
    std::printf("initial loss should be near ln(V) = %.3f\n", std::log(double(config->vocab_size)));
    StepLoopOptions steps;
    steps.on_step = [](const TrainingSession::CompletedStep& done) {
        const StepRecord& rec = done.record;
        std::printf("step %4d  loss %.4f  %.1f ms/step\n", rec.step + 1, rec.loss,
                    rec.times.wall_ms);
        std::fflush(stdout);
    };
    const LoopOutcome outcome = StepLoop(session, std::move(steps)).run(0, a.steps);
    if (outcome.end == LoopOutcome::End::non_finite) {
        std::fprintf(stderr, "microtrain train: %s is not finite at step %d\n",
                     outcome.non_finite.in_loss ? "loss" : "gradient norm", outcome.step + 1);
        return 1;
    }
    return 0;  // (no stop signal is handled here: Ctrl-C ends the smoke test the ordinary way)
}

// FILE mode: the flags the one-batch test has and a training run does not are refused (their
// settings live in the file); --steps, --threads and --backend become overrides.
int run_file(const TrainArgs& a, const CLI::App& cmd) {
    for (const char* flag : {"--preset", "--batch", "--seq-len", "--lr", "--seed"})
        if (cmd.count(flag) > 0) {
            std::fprintf(stderr,
                         "microtrain train: %s is a flag of the one-batch smoke test (no FILE, or "
                         "--one-batch); with FILE set it in the file or with --set, e.g. --set "
                         "optim.lr=1e-3\n",
                         flag);
            return 2;
        }
    TrainRunOptions o;
    o.file = a.file;
    o.variant = a.variant;
    o.out_dir = a.out_dir;
    o.resume_dir = a.resume;
    o.overrides = a.overrides;
    if (!a.init_from.empty()) o.overrides.push_back("model.init_from=" + a.init_from);
    if (cmd.count("--steps") > 0) o.steps = a.steps;
    if (cmd.count("--threads") > 0)
        o.overrides.push_back("run.threads=" + std::to_string(a.threads));
    if (cmd.count("--backend") > 0) o.overrides.push_back("backend=" + a.backend);
    return run_training(o);
}

// The one-batch smoke test refuses the training run's flags rather than ignoring them.
int run_one_batch_checked(const TrainArgs& a, const CLI::App& cmd) {
    for (const char* flag : {"--variant", "--out-dir", "--resume", "--set", "--init-from"})
        if (cmd.count(flag) > 0) {
            std::fprintf(stderr,
                         "microtrain train: %s needs an experiment file: microtrain train "
                         "FILE.yaml %s ...\n",
                         flag, flag);
            return 2;
        }
    try {
        return run_one_batch(a);
    } catch (const ResourceError& e) {  // does not fit / too many threads: the user can fix it
        std::fprintf(stderr, "microtrain train: %s\n", e.what());
        return 2;
    } catch (const SpecError& e) {  // a flag its key refuses (--lr)
        std::fprintf(stderr, "microtrain train: %s\n", e.what());
        return 2;
    }
}

}  // namespace

void register_train_command(CLI::App& app, int& exit_code) {
    auto args = std::make_shared<TrainArgs>();
    CLI::App* cmd = app.add_subcommand(
        "train",
        "Train the config of an experiment file with validation, train.csv, checkpoints and "
        "--resume; without FILE (or --one-batch), a smoke test on one repeated batch");
    cmd->add_option("file", args->file, "Experiment file (YAML); omit for the one-batch test")
        ->check(CLI::ExistingFile);
    cmd->add_flag("--one-batch", args->one_batch,
                  "The smoke test: one repeated random batch, loss and ms/step per step (the "
                  "default without FILE)");
    cmd->add_option("--variant", args->variant, "Train this variant (default: the base config)");
    cmd->add_option("--out-dir", args->out_dir,
                    "Run directory (default <report.out_dir>/<name>-train[-<variant>])");
    cmd->add_option("--resume", args->resume,
                    "Continue the run in DIR from its newest valid checkpoint");
    cmd->add_option("--init-from", args->init_from,
                    "Start from these weights (model.init_from): a train checkpoint or run "
                    "directory, nanoGPT weights, or a Hugging Face GPT-2 model.safetensors or "
                    "folder; a --resume keeps its own");
    add_set_option(cmd, args->overrides, "Override a key: --set optim.lr=1e-3 (repeatable)");
    cmd->add_option("--preset", args->preset, "Model preset (one-batch test)")
        ->capture_default_str()
        ->check(CLI::IsMember(gpt_preset_names()));
    cmd->add_option("--backend", args->backend, "cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("--batch,-B", args->batch, "Batch size (one-batch test)")
        ->capture_default_str()
        ->check(CLI::Range(1, kMaxBatch));
    cmd->add_option("--seq-len,-T", args->seq_len, "Sequence length (one-batch test)")
        ->capture_default_str()
        ->check(CLI::Range(1, kMaxSeqLen));
    cmd->add_option("--steps", args->steps, "Optimizer steps (with FILE: overrides train.steps)")
        ->capture_default_str()
        ->check(CLI::Range(1, kMaxSteps));
    cmd->add_option("--lr", args->lr, "Learning rate (one-batch test; optim.lr, > 0)")
        ->capture_default_str();
    cmd->add_option("--seed", args->seed, "Seed for weights and data (one-batch test)")
        ->capture_default_str();
    cmd->add_option("--threads", args->threads, "CPU threads (0 = all)")
        ->capture_default_str()
        ->check(CLI::Range(0, kMaxThreads));
    cmd->callback([args, cmd, &exit_code] {
        if (args->one_batch && !args->file.empty()) {
            std::fprintf(stderr,
                         "microtrain train: --one-batch takes no FILE (it trains a preset on one "
                         "random batch); drop one of them\n");
            exit_code = 2;
            return;
        }
        exit_code = args->file.empty() ? run_one_batch_checked(*args, *cmd) : run_file(*args, *cmd);
    });
}

}  // namespace mt
