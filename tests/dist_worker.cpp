// mt_dist_worker: one data-parallel training run for tests/test_data_parallel.cpp, started by
// mpirun (N ranks) or as a plain process (one rank). It steps a TrainingSession exactly as
// `microtrain run` does and rank 0 writes what the tests compare:
//   OUT.params  the final fp32 parameters (raw bytes, the flat buffer)
//   OUT.json    per step: loss, grad norm, comm phase ms, comm busy ms, comm bytes; the world
//               size, the bucket count and the optimizer bytes of this rank
// Usage: mt_dist_worker OUT B STEPS [key=value ...]   (keys as in an experiment file: dist.zero=1,
// run.grad_accum=2, dist.simulate_link_gbps=1, ...)
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distributed/world.h"
#include "engine/training_session.h"
#include "experiment/spec.h"

int main(int argc, char** argv) {
    using namespace mt;
    std::unique_ptr<World> world;
    try {
        world = World::join(&argc, &argv);
        if (argc < 4) {
            std::fprintf(stderr, "usage: mt_dist_worker OUT B STEPS [key=value ...]\n");
            return 2;
        }
        const std::string out = argv[1];
        // A tiny model on learnable synthetic data; every knob can be overridden.
        std::vector<std::string> sets = {"backend=cpu",
                                         "model.n_layer=2",
                                         "model.n_embd=64",
                                         "model.n_head=2",
                                         "model.max_seq_len=32",
                                         "model.vocab_size=512",
                                         "data.seq_len=32",
                                         "run.threads=1",
                                         "dist.bucket_mb=0.05",
                                         "dist.timeout_s=60",
                                         "optim.lr=0.003",
                                         "optim.grad_clip=1.0",
                                         std::string("data.batch_size=") + argv[2]};
        for (int i = 4; i < argc; ++i) sets.push_back(argv[i]);
        const std::string yaml = out + ".yaml";
        if (world->rank() == 0 || !world->distributed()) {
            std::ofstream(yaml) << "name: worker\n";
        }
        double dummy = 0;
        world->allreduce_sum(&dummy, 1, 60, "the worker's start");  // the file exists
        const ExperimentSpec spec = load_experiment(yaml, sets);
        const RunConfig& cfg = spec.variants.at(0);
        TrainingInputs inputs;
        inputs.world = world.get();
        inputs.track_memory = true;
        TrainingSession session(create_training_backend(cfg, BackendKind::cpu), cfg,
                                std::move(inputs));
        nlohmann::json j;
        j["world"] = world->size();
        j["buckets"] = session.gradient_sync() ? session.gradient_sync()->buckets().size() : 0;
        j["optimizer_bytes"] =
            session.backend().memory_stats().current[static_cast<int>(MemoryCategory::optimizer)];
        const int steps = std::stoi(argv[3]);
        for (int s = 0; s < steps; ++s) {
            const StepRecord rec = session.step(s, false);
            j["loss"].push_back(rec.loss);
            j["grad_norm"].push_back(rec.grad_norm);
            j["comm_ms"].push_back(rec.times[Phase::comm]);
            j["busy_ms"].push_back(rec.comm_busy_ms);
            j["bytes"].push_back(rec.comm_bytes);
            j["buckets_in_backward"].push_back(rec.comm_buckets_in_backward);
        }
        if (world->rank() == 0) {
            const std::vector<float> p = session.model().get_params();
            std::ofstream(out + ".params", std::ios::binary)
                .write(reinterpret_cast<const char*>(p.data()),
                       static_cast<std::streamsize>(p.size() * sizeof(float)));
            std::ofstream(out + ".json") << j.dump(1);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "mt_dist_worker: rank %d: %s\n", world ? world->rank() : -1, e.what());
        if (world && world->distributed()) world->abort(1);
        return 1;
    }
    return 0;
}
