// `microtrain train`: a plain training loop on synthetic or text data, printing loss and
// ms/step each step. The quickest way to see the model learn; `microtrain run` is the
// measured, reported experiment.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "harness/commands.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace mt {
namespace {

struct TrainArgs {
    std::string preset = "tiny";
    std::string backend = "cpu";
    int batch = 4, seq_len = 32, steps = 20, threads = 0;
    float lr = 1e-3f;
    uint64_t seed = 1337;
};

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
    BackendOptions bopt;
    bopt.num_threads = a.threads;
    auto backend = create_backend(a.backend == "cuda" ? BackendKind::cuda : BackendKind::cpu, bopt);
    GPT model(*backend, *config);
    model.init_weights(a.seed);
    model.allocate_activations(a.batch, a.seq_len);
    AdamWConfig oc;
    oc.lr = a.lr;
    AdamW opt(model, oc);

    // One fixed pseudo-random batch: repeated, the loss falls well below ln(V) as the model
    // memorises it, which is the visible sign that forward, backward and AdamW work together.
    const size_t n = static_cast<size_t>(a.batch) * a.seq_len;
    std::vector<int> tokens(n + 1);
    std::mt19937 rng(static_cast<uint32_t>(a.seed));
    for (auto& t : tokens) t = static_cast<int>(rng() % static_cast<uint32_t>(config->vocab_size));
    std::vector<int> inputs(tokens.begin(), tokens.end() - 1),
        targets(tokens.begin() + 1, tokens.end());
    DeviceBuffer d_in(*backend, n * sizeof(int), MemoryCategory::data);
    DeviceBuffer d_tg(*backend, n * sizeof(int), MemoryCategory::data);
    backend->copy_to_device(d_in.get(), inputs.data(), n * sizeof(int));
    backend->copy_to_device(d_tg.get(), targets.data(), n * sizeof(int));

    std::printf("microtrain train: %s (%s), %zu params, B=%d T=%d on %s\n", a.preset.c_str(),
                config->describe().c_str(), model.parameter_table().total_count(), a.batch,
                a.seq_len, backend->device_name().c_str());
    std::printf("initial loss should be near ln(V) = %.3f\n", std::log(double(config->vocab_size)));
    for (int step = 0; step < a.steps; ++step) {
        auto t0 = std::chrono::steady_clock::now();
        model.zero_grad();
        model.forward(d_in.as<int>(), d_tg.as<int>(), a.batch, a.seq_len);
        model.backward();
        opt.step();
        float loss = model.loss();
        auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                      .count();
        std::printf("step %4d  loss %.4f  %.1f ms/step\n", step + 1, loss, ms);
        std::fflush(stdout);
        if (!std::isfinite(loss)) {
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
