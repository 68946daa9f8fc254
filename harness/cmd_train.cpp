// `microtrain train`: a plain training loop on synthetic or text data, printing loss and
// ms/step each step. The quickest way to see the model learn; `microtrain run` is the
// measured, reported experiment.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "harness/commands.h"
#include "harness/training.h"

namespace mt {
namespace {

struct TrainArgs {
    std::string preset = "tiny";
    std::string backend = "cpu";
    int batch = 4, seq_len = 32, steps = 20, threads = 0;
    float lr = 1e-3f;
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
    c.optim.lr = a.lr;
    c.run.seed = a.seed;
    c.run.threads = a.threads;
    c.profile.trace = false;
    return c;
}

int run_train(const TrainArgs& a) {
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
    std::printf("initial loss should be near ln(V) = %.3f\n", std::log(double(config->vocab_size)));
    for (int step = 0; step < a.steps; ++step) {
        const StepRecord rec = session.step(step, /*warmup=*/false);
        std::printf("step %4d  loss %.4f  %.1f ms/step\n", step + 1, rec.loss, rec.times.wall_ms);
        std::fflush(stdout);
        if (!std::isfinite(rec.loss)) {
            std::fprintf(stderr, "microtrain train: loss is not finite at step %d\n", step + 1);
            return 1;
        }
    }
    return 0;
}

}  // namespace

void register_train_command(CLI::App& app, int& exit_code) {
    auto args = std::make_shared<TrainArgs>();
    CLI::App* cmd = app.add_subcommand(
        "train", "Train a small GPT on one repeated batch, printing loss and ms/step per step");
    cmd->add_option("--preset", args->preset, "Model preset")
        ->capture_default_str()
        ->check(CLI::IsMember(gpt_preset_names()));
    cmd->add_option("--backend", args->backend, "cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("--batch,-B", args->batch, "Batch size")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--seq-len,-T", args->seq_len, "Sequence length")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--steps", args->steps, "Optimizer steps")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--lr", args->lr, "Learning rate")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--seed", args->seed, "Seed for weights and data")->capture_default_str();
    cmd->add_option("--threads", args->threads, "CPU threads (0 = all)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    cmd->callback([args, &exit_code] { exit_code = run_train(*args); });
}

}  // namespace mt
