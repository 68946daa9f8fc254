// Shape jitter (data.seq_len_jitter) and the sample cache (data.cache): the jittered length of a
// batch is a pure function of (seed, batch index), within its bounds, the same on every rank and
// after a resume, and jitter 0 is the loader of before, bitwise; the cache hands out bitwise the
// batches of no cache, prepares each sample once, lives under the `data` memory category and is
// counted in the memory estimate. Then the consumers: a model planned for seq_len trains a
// shorter batch exactly like a model planned for it, the session counts the real tokens, and the
// report names the knob as the cause of the spread. No timing: work is counted, not measured.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/data.h"
#include "engine/training_session.h"
#include "experiment/spec.h"
#include "model/gpt.h"
#include "report/comparison.h"
#include "report/render.h"
#include "report/results.h"
#include "report/run_folder.h"
#include "report/step_files.h"
#include "report/suggestions.h"
#include "test_util.h"
#include "tests/hand_made_run.h"

namespace mt {
namespace {

// The batches as plain vectors (T, inputs, targets), for comparisons.
std::vector<std::vector<int>> take(DataLoader& loader, int n) {
    std::vector<std::vector<int>> out;
    for (int i = 0; i < n; ++i) {
        const Batch& b = loader.next();
        const size_t e = static_cast<size_t>(b.B) * b.T;
        std::vector<int> v{b.T};
        v.insert(v.end(), b.inputs, b.inputs + e);
        v.insert(v.end(), b.targets, b.targets + e);
        out.push_back(std::move(v));
    }
    return out;
}

// FNV-1a over the batches' lengths and tokens: a fingerprint of a loader's output.
uint64_t fingerprint(DataLoader& loader, int n) {
    uint64_t h = 1469598103934665603ull;
    for (const auto& v : take(loader, n))
        for (int x : v) h = (h ^ static_cast<uint32_t>(x)) * 1099511628211ull;
    return h;
}

// A token file whose token i is i % 60000 (so a row's values show where its window starts).
std::string counting_token_file(const TempDir& dir, size_t n) {
    std::vector<uint16_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % 60000);
    const std::string p = dir.file("count.bin");
    write_token_file(p, t);
    return p;
}

DataConfig tokens_config(const std::string& path, int B, int T) {
    DataConfig c;
    c.source = DataSource::tokens;
    c.path = path;
    c.batch_size = B;
    c.seq_len = T;
    return c;
}

// ---- shape jitter ---------------------------------------------------------------------------

TEST(ShapeJitter, LengthsStayWithinTheirBoundsAndReachBothEnds) {
    for (const auto& [jitter, lo] :
         std::vector<std::pair<float, int>>{{0.5f, 32}, {0.25f, 48}, {1.0f, 1}, {0.01f, 64}}) {
        std::set<int> seen;
        for (uint64_t i = 0; i < 4000; ++i) {
            const int L = jittered_seq_len(64, jitter, 7, i);
            ASSERT_GE(L, lo) << "jitter " << jitter << " batch " << i;
            ASSERT_LE(L, 64) << "jitter " << jitter << " batch " << i;
            seen.insert(L);
        }
        EXPECT_EQ(*seen.begin(), lo) << "jitter " << jitter;
        EXPECT_EQ(*seen.rbegin(), 64) << "jitter " << jitter;
        // Uniform over [lo, 64]: 4000 draws reach every length of the range.
        EXPECT_EQ(seen.size(), static_cast<size_t>(64 - lo + 1)) << "jitter " << jitter;
    }
}

TEST(ShapeJitter, ZeroJitterIsAlwaysSeqLen) {
    for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(jittered_seq_len(64, 0.0f, 3, i), 64);
}

TEST(ShapeJitter, LengthIsAPureFunctionOfSeedAndBatchIndex) {
    std::vector<int> a, b, other;
    for (uint64_t i = 0; i < 200; ++i) {
        a.push_back(jittered_seq_len(128, 0.5f, 11, i));
        other.push_back(jittered_seq_len(128, 0.5f, 12, i));
    }
    for (uint64_t i = 200; i-- > 0;) b.insert(b.begin(), jittered_seq_len(128, 0.5f, 11, i));
    EXPECT_EQ(a, b);  // any order of asking gives the same lengths
    EXPECT_NE(a, other);
}

TEST(ShapeJitter, OutOfRangeJitterIsRejectedByTheLoader) {
    TempDir dir("mt_jitter");
    for (float bad : {-0.1f, 1.5f, std::nanf("")}) {
        DataConfig c;
        c.seq_len_jitter = bad;
        try {
            DataLoader l(c, 256, 1);
            FAIL() << "seq_len_jitter " << bad << " accepted";
        } catch (const DataError& e) {
            EXPECT_CONTAINS(e.what(), "seq_len_jitter must be in [0, 1]");
        }
    }
}

TEST(ShapeJitter, JitteredRowsArePrefixesOfTheirWindows) {
    TempDir dir("mt_jitter");
    const int B = 3, T = 16;
    DataConfig c = tokens_config(counting_token_file(dir, 4000), B, T);
    c.seq_len_jitter = 0.75f;
    DataLoader loader(c, 60000, 5);
    std::set<int> lengths;
    for (uint64_t i = 0; i < 50; ++i) {
        const Batch& b = loader.next();
        ASSERT_EQ(b.T, jittered_seq_len(T, 0.75f, 5, i));
        lengths.insert(b.T);
        for (int r = 0; r < B; ++r) {
            const int start = b.inputs[r * b.T];
            EXPECT_EQ(start % T, 0);  // windows are still cut at multiples of seq_len
            for (int k = 0; k < b.T; ++k) {
                ASSERT_EQ(b.inputs[r * b.T + k], start + k);
                ASSERT_EQ(b.targets[r * b.T + k], start + k + 1);
            }
        }
    }
    EXPECT_GT(lengths.size(), 3u);
}

TEST(ShapeJitter, EveryRankGetsTheSameLengthAndItsRowsOfTheGlobalBatch) {
    TempDir dir("mt_jitter");
    const int B = 2, T = 12, world = 3;
    DataConfig c = tokens_config(counting_token_file(dir, 3000), B, T);
    c.seq_len_jitter = 0.5f;
    DataConfig g = c;
    g.batch_size = B * world;
    DataLoader global(g, 60000, 9);
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < world; ++r)
        ranks.push_back(std::make_unique<DataLoader>(c, 60000, 9, nullptr,
                                                     DataLoaderOptions{.rank = r, .world = world}));
    for (int i = 0; i < 40; ++i) {
        const Batch& all = global.next();
        for (int r = 0; r < world; ++r) {
            const Batch& mine = ranks[r]->next();
            ASSERT_EQ(mine.T, all.T) << "rank " << r << " batch " << i;
            const size_t rows = static_cast<size_t>(B) * mine.T;
            const std::vector<int> want(all.inputs + r * rows, all.inputs + (r + 1) * rows);
            EXPECT_EQ(std::vector<int>(mine.inputs, mine.inputs + rows), want)
                << "rank " << r << " batch " << i;
        }
    }
}

TEST(ShapeJitter, AResumedLoaderContinuesWithTheSameLengthsAndBatches) {
    TempDir dir("mt_jitter");
    DataConfig c = tokens_config(counting_token_file(dir, 3000), 4, 16);
    c.seq_len_jitter = 0.5f;
    DataLoader whole(c, 60000, 21);
    const auto all = take(whole, 30);
    DataLoader resumed(c, 60000, 21, nullptr, DataLoaderOptions{.first_batch = 12});
    EXPECT_EQ(take(resumed, 18), std::vector<std::vector<int>>(all.begin() + 12, all.end()));
}

// Pinned from the loader before shape jitter and the cache existed (commit 9c79a89): jitter 0
// and no cache must give the same batches, bit for bit, for every source and worker count.
TEST(ShapeJitter, ZeroJitterWithoutCacheIsTheLoaderOfBeforeBitwise) {
    TempDir dir("mt_jitter");
    const std::string file = counting_token_file(dir, 5000);
    DataConfig tok = tokens_config(file, 4, 16);
    DataConfig syn;
    syn.batch_size = 4;
    syn.seq_len = 16;
    for (int workers : {0, 2}) {
        tok.workers = syn.workers = workers;
        DataLoader a(tok, 60000, 13), b(syn, 256, 13);
        EXPECT_EQ(fingerprint(a, 200), 0xc8809241016c9b83ull) << "tokens, workers " << workers;
        EXPECT_EQ(fingerprint(b, 50), 0x94b4152371202d42ull) << "synthetic, workers " << workers;
    }
}

// ---- the sample cache -----------------------------------------------------------------------

TEST(SampleCache, GivesBitwiseTheBatchesOfNoCache) {
    TempDir dir("mt_cache");
    const std::string file = counting_token_file(dir, 2000);
    {
        std::ofstream t(dir.file("t.txt"), std::ios::binary);
        for (int i = 0; i < 300; ++i) t << "line " << i << ": caf\xc3\xa9 au lait\n";
    }
    for (DataSource src : {DataSource::tokens, DataSource::text, DataSource::synthetic}) {
        for (float jitter : {0.0f, 0.6f}) {
            DataConfig c = tokens_config(src == DataSource::text ? dir.file("t.txt") : file, 4, 12);
            c.source = src;
            c.seq_len_jitter = jitter;
            DataLoader plain(c, 60000, 4);
            const auto want = take(plain, 150);  // several epochs of the files
            for (int workers : {0, 1, 3}) {
                DataConfig cc = c;
                cc.cache = true;
                cc.workers = workers;
                cc.prefetch = 3;
                DataLoader cached(cc, 60000, 4);
                EXPECT_EQ(take(cached, 150), want)
                    << to_string(src) << " jitter " << jitter << " workers " << workers;
            }
        }
    }
}

TEST(SampleCache, PreparesEachSampleOnceWhateverTheEpochsAndWorkers) {
    TempDir dir("mt_cache");
    const int B = 4, T = 8;
    DataConfig c = tokens_config(counting_token_file(dir, 40 * T + 1), B, T);  // 40 windows
    const int batches = 3 * 40 / B;                                            // 3 epochs
    DataLoader plain(c, 60000, 2);
    take(plain, batches);
    EXPECT_EQ(plain.samples_prepared(), static_cast<uint64_t>(batches) * B);  // every use
    for (int workers : {0, 1, 3}) {
        DataConfig cc = c;
        cc.cache = true;
        cc.workers = workers;
        cc.preprocess_us = workers == 3 ? 20 : 0;  // widen the window for two threads at once
        DataLoader cached(cc, 60000, 2);
        take(cached, 40 / B);  // the first epoch: every window, once
        EXPECT_EQ(cached.samples_prepared(), 40u) << "workers " << workers;
        take(cached, batches - 40 / B);  // two more epochs: nothing prepared again
        EXPECT_EQ(cached.samples_prepared(), 40u) << "workers " << workers;
    }
}

TEST(SampleCache, IsHostMemoryUnderTheDataCategoryAsLargeAsItsEstimate) {
    TempDir dir("mt_cache");
    const std::string file = counting_token_file(dir, 4001);
    {
        std::ofstream t(dir.file("t.txt"), std::ios::binary);
        for (int i = 0; i < 200; ++i) t << "the quick brown fox " << i << "\n";
    }
    std::unique_ptr<Backend> backend = create_backend(BackendKind::cpu);
    const int data = static_cast<int>(MemoryCategory::data);
    for (DataSource src : {DataSource::tokens, DataSource::text, DataSource::synthetic}) {
        for (float val : {0.0f, 0.2f}) {
            DataConfig c = tokens_config(src == DataSource::text ? dir.file("t.txt") : file, 4, 16);
            c.source = src;
            c.val_fraction = val;
            c.cache = true;
            const size_t before = backend->memory_stats().current[data];
            {
                DataLoader l(c, 60000, 1, backend.get());
                // W windows of the training part x (T + 1 tokens x 4 bytes + 1 state byte).
                const size_t want = static_cast<size_t>(l.num_windows()) * (17 * 4 + 1);
                EXPECT_EQ(l.cache_bytes(), want) << to_string(src) << " val " << val;
                EXPECT_EQ(sample_cache_bytes(c), want) << to_string(src) << " val " << val;
                EXPECT_GE(backend->memory_stats().current[data] - before, want);
            }
            EXPECT_EQ(backend->memory_stats().current[data], before);
            c.cache = false;
            EXPECT_EQ(sample_cache_bytes(c), 0u);
        }
    }
}

TEST(SampleCache, DestructorReturnsWhileWorkersPrepareAndWait) {
    // Workers 3 over a 2-window file: they fill the same windows, one preparing, the others
    // waiting for it, each sample spinning 10 s of simulated preprocessing. Destroying the
    // loader must stop them all (the test would hang otherwise).
    TempDir dir("mt_cache");
    DataConfig c = tokens_config(counting_token_file(dir, 2 * 8 + 1), 1, 8);
    c.cache = true;
    c.workers = 3;
    c.prefetch = 4;
    c.preprocess_us = 10'000'000;
    { DataLoader l(c, 60000, 1); }
    SUCCEED();
}

RunConfig tiny_run() {
    RunConfig c;
    c.backend = BackendChoice::cpu;
    c.model = *gpt_preset("tiny");  // L2 C64 H4 T32 V256
    c.data.batch_size = 2;
    c.data.seq_len = 32;
    c.run.threads = 1;
    return c;
}

TEST(SampleCache, IsCountedUnderDataInTheMemoryEstimate) {
    RunConfig c = tiny_run();
    std::unique_ptr<Backend> backend = create_training_backend(c, BackendKind::cpu);
    MemoryEstimate without, with;
    check_memory_fits(c, *backend, &without);
    c.data.cache = true;
    check_memory_fits(c, *backend, &with);
    EXPECT_EQ(with.data - without.data, sample_cache_bytes(c.data));
    EXPECT_GT(sample_cache_bytes(c.data), 0u);
    EXPECT_EQ(with.activations, without.activations);
}

TEST(SampleCache, ACacheLargerThanTheMemoryIsRefusedNamingTheKnob) {
    // A sparse 1 TiB text file: nothing is read, but its cache would need ~4 TiB.
    TempDir dir("mt_cache");
    const std::string big = dir.file("big.txt");
    const int fd = ::open(big.c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    const bool sized = ::ftruncate(fd, off_t{1} << 40) == 0;
    ::close(fd);
    if (!sized) GTEST_SKIP() << "this filesystem cannot hold a sparse 1 TiB file";
    RunConfig c = tiny_run();
    c.data.source = DataSource::text;
    c.data.path = big;
    c.data.cache = true;
    std::unique_ptr<Backend> backend = create_training_backend(c, BackendKind::cpu);
    try {
        check_memory_fits(c, *backend);
        FAIL() << "a 4 TiB cache fits?";
    } catch (const ResourceError& e) {
        EXPECT_CONTAINS(e.what(), "the sample cache");
        EXPECT_CONTAINS(e.what(), "set data.cache: false");
    }
    EXPECT_EQ(backend->memory_stats().peak_total, 0u) << "something was allocated first";
}

// ---- the consumers --------------------------------------------------------------------------

// A backend of `kind` running kernel choice `k` (one OpenMP thread on the CPU).
std::unique_ptr<Backend> backend_with(BackendKind kind, const KernelChoice& k) {
    BackendOptions bo;
    bo.kernels = k;
    if (kind == BackendKind::cpu) bo.num_threads = 1;
    return create_backend(kind, bo);
}

// Loss and gradients of one forward/backward at (B, T) of a model whose activations were planned
// for (B, plan_T) with the backend's kernel choice. With plan_T > T a full-length (B, plan_T)
// step runs first, as in a jittered run, so the shorter step reuses arenas that hold a longer
// one's data.
std::pair<float, std::vector<float>> loss_and_grads(Backend& be, Recompute rc, int B, int plan_T,
                                                    int T) {
    ModelOptions mo;
    mo.recompute = rc;
    GPT model(be, *gpt_preset("tiny"), mo);
    model.init_weights(5);
    model.allocate_activations(B, plan_T);
    // Token ids for the longest shape; a (B, T) batch is the first B*T of them, row-major.
    std::vector<int> in(static_cast<size_t>(B) * plan_T), tg(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<int>((i * 37 + 11) % 256);
        tg[i] = static_cast<int>((i * 53 + 7) % 256);
    }
    DeviceBuffer d_in(be, in.size() * 4, MemoryCategory::data);
    DeviceBuffer d_tg(be, tg.size() * 4, MemoryCategory::data);
    be.copy_to_device(d_in.get(), in.data(), in.size() * 4);
    be.copy_to_device(d_tg.get(), tg.data(), tg.size() * 4);
    if (plan_T != T) {
        model.forward(d_in.as<int>(), d_tg.as<int>(), B, plan_T);
        model.backward();
    }
    model.zero_grad();
    model.forward(d_in.as<int>(), d_tg.as<int>(), B, T);
    model.backward();
    return {model.loss(), model.get_grads()};
}

TEST(ShapeJitter, AShorterBatchTrainsExactlyAsOnAModelPlannedForIt) {
    for (AttentionImpl a : {AttentionImpl::naive, AttentionImpl::flash}) {
        for (LayerNormImpl ln : {LayerNormImpl::separate, LayerNormImpl::fused_residual}) {
            for (Recompute rc : {Recompute::none, Recompute::layernorm_gelu}) {
                const std::unique_ptr<Backend> be =
                    backend_with(BackendKind::cpu, KernelChoice{.attention = a, .layernorm = ln});
                for (int T : {1, 7, 19}) {
                    const std::string what = std::string(to_string(a)) + " " + to_string(ln) + " " +
                                             to_string(rc) + " T " + std::to_string(T);
                    const auto exact = loss_and_grads(*be, rc, 2, T, T);
                    const auto planned_longer = loss_and_grads(*be, rc, 2, 32, T);
                    EXPECT_EQ(exact.first, planned_longer.first) << what;
                    EXPECT_EQ(exact.second, planned_longer.second) << what;
                }
            }
        }
    }
}

// The same on the CUDA backend (skipped without a GPU): the attention workspace, reserved for
// the longest shape, serves the shorter ones. Within fp32 rounding rather than bitwise, as a GPU
// kernel may order a reduction by the shape it was launched for.
TEST(ShapeJitter, AShorterBatchTrainsAsOnAModelPlannedForItOnCuda) {
    if (!cuda_available()) GTEST_SKIP() << "needs a GPU (the CUDA backend)";
    for (AttentionImpl a : {AttentionImpl::naive, AttentionImpl::flash}) {
        const std::unique_ptr<Backend> be =
            backend_with(BackendKind::cuda, KernelChoice{.attention = a});
        for (int T : {1, 7, 19}) {
            const std::string what = std::string(to_string(a)) + " T " + std::to_string(T);
            const auto exact = loss_and_grads(*be, Recompute::none, 2, T, T);
            const auto longer = loss_and_grads(*be, Recompute::none, 2, 32, T);
            EXPECT_NEAR(exact.first, longer.first, 1e-5 * std::fabs(exact.first)) << what;
            ASSERT_EQ(exact.second.size(), longer.second.size());
            float scale = 0, worst = 0;
            for (size_t i = 0; i < exact.second.size(); ++i) {
                scale = std::max(scale, std::fabs(exact.second[i]));
                worst = std::max(worst, std::fabs(exact.second[i] - longer.second[i]));
            }
            EXPECT_LE(worst, 1e-4f * scale + 1e-7f) << what;
        }
    }
}

TEST(ShapeJitter, TheSessionTrainsJitteredBatchesAndCountsTheirRealTokens) {
    RunConfig c = tiny_run();
    c.data.seq_len_jitter = 0.75f;
    c.run.grad_accum = 2;
    TrainingInputs in;
    in.track_memory = false;
    TrainingSession s(create_training_backend(c, BackendKind::cpu), c, std::move(in));
    uint64_t batch = 0;
    std::set<double> tokens;
    for (int step = 0; step < 6; ++step) {
        const StepRecord r = s.step(step, false);
        double want_tokens = 0, want_flops = 0;
        for (int m = 0; m < c.run.grad_accum; ++m, ++batch) {
            const int T = jittered_seq_len(32, 0.75f, c.run.seed, batch);
            want_tokens += 2.0 * T;
            want_flops += s.model().training_flops_per_step(2, T);
        }
        EXPECT_EQ(r.tokens, want_tokens) << "step " << step;
        EXPECT_EQ(r.model_flops, want_flops) << "step " << step;
        EXPECT_TRUE(std::isfinite(r.loss)) << "step " << step;
        tokens.insert(r.tokens);
    }
    EXPECT_GT(tokens.size(), 1u);  // the steps really had different lengths
}

TEST(ShapeJitter, ThroughputCountsTheRealTokensOfTheMeasuredSteps) {
    HandMadeRun r;
    r.config.data.batch_size = 4;
    r.config.data.seq_len = 64;
    r.config.data.seq_len_jitter = 0.5f;
    r.flops_per_step = 1000;
    for (int i = 0; i < 4; ++i) {
        StepRecord s;
        s.step = i;
        s.warmup = i == 0;
        s.times.wall_ms = 100;
        s.tokens = i == 0 ? 256 : 4.0 * (32 + 8 * i);  // warm-up not counted
        s.model_flops = s.tokens * 2;
        r.steps.push_back(s);
    }
    const VariantResult v = r.record();
    const double mean_tokens = 4.0 * (40 + 48 + 56) / 3;
    EXPECT_DOUBLE_EQ(v.stats.tokens_per_s, mean_tokens / 0.1);
    EXPECT_DOUBLE_EQ(v.flops.achieved_per_s, 2 * mean_tokens / 0.1);
    EXPECT_DOUBLE_EQ(v.stats.samples_per_s, 4 / 0.1);
    r.config.data.seq_len_jitter = 0;  // without jitter: the nominal batch, as before
    EXPECT_DOUBLE_EQ(r.record().stats.tokens_per_s, 4.0 * 64 / 0.1);
}

// A measured variant with the given step times, and data.seq_len_jitter when `jitter` is set.
HandMadeRun timed_run(const std::string& name, const std::vector<double>& walls,
                      const std::string& jitter = "") {
    HandMadeRun r;
    r.config.variant = name;
    r.config.data.batch_size = 4;
    r.config.data.seq_len = 64;
    if (!jitter.empty()) {
        r.config.data.seq_len_jitter = std::stof(jitter);
        r.config.changed = {{"data.seq_len_jitter", jitter}};
    }
    r.backend = "cpu";
    r.device_name = "CPU: Test";
    r.flops_per_step = 1e9;
    int step = 0;
    for (double w : walls) {
        StepRecord s;
        s.step = step++;
        s.times.wall_ms = w;
        s.times[Phase::forward] = 0.4 * w;
        s.times[Phase::backward] = 0.5 * w;
        s.loss = 5.0;
        s.tokens = 256 * w / 10;
        r.steps.push_back(s);
    }
    return r;
}

TEST(ShapeJitter, TheReportNamesTheKnobAsTheCauseOfTheSpread) {
    HandMadeExperiment ex;
    ex.name = "jitter";
    ex.baseline = "fixed";
    ex.runs.push_back(timed_run("fixed", {10, 10.1, 9.9, 10, 10.05, 10}));
    ex.runs.push_back(timed_run("jitter-50", {6, 10, 7.5, 9, 5.5, 8.5}, "0.5"));
    ex.runs.push_back(timed_run("noisy", {6, 10, 7.5, 9, 5.5, 8.5}));
    const Results res = ex.results();
    const Comparison cmp = build_comparison(res);
    std::string notes;
    for (const std::string& n : cmp.notes) notes += n + "\n";
    EXPECT_CONTAINS(notes, "'jitter-50' sets data.seq_len_jitter=0.5");
    EXPECT_CONTAINS(notes, "the cause of its jitter is variable shapes");
    EXPECT_CONTAINS(notes, "'noisy' step times jitter");  // no knob: the machine is blamed
    EXPECT_EQ(notes.find("'jitter-50' step times jitter"), std::string::npos) << notes;
    std::string sug;
    for (const std::string& s : suggestions_for(res.variants[1])) sug += s + "\n";
    EXPECT_CONTAINS(sug, "caused by variable shapes: `data.seq_len_jitter: 0.5`");
    sug.clear();
    for (const std::string& s : suggestions_for(res.variants[2])) sug += s + "\n";
    EXPECT_EQ(sug.find("seq_len_jitter"), std::string::npos) << sug;
    // The batch shape reports the mean real tokens per measured step, and the verdict compares
    // per token: the jittered variant's steps are shorter because its batches are.
    EXPECT_LT(res.variants[1].batch.tokens_per_step, 4 * 64);
    EXPECT_CONTAINS(cmp.rows[1].verdict, "its batches are shorter (data.seq_len_jitter=0.5)");
    EXPECT_CONTAINS(cmp.rows[1].verdict, "x the baseline's tokens/s");
    EXPECT_EQ(cmp.rows[2].verdict.find("tokens/s"), std::string::npos) << cmp.rows[2].verdict;
}

// ---- the experiment file --------------------------------------------------------------------

std::string spec_error(const std::string& yaml) {
    TempDir dir("mt_spec_jc");
    const std::string p = dir.file("e.yaml");
    std::ofstream(p) << yaml;
    try {
        load_experiment(p);
    } catch (const SpecError& e) {
        return e.what();
    }
    return "";
}

TEST(DataKnobs, BadValuesGiveErrorsNamingTheKeyAndTheRange) {
    const std::string head = "name: x\nbackend: cpu\nmodel: { preset: tiny }\n";
    for (const char* bad : {"1.5", "-0.2"}) {
        const std::string e = spec_error(head + "data: { seq_len_jitter: " + bad + " }\n");
        EXPECT_CONTAINS(e, "data.seq_len_jitter");
        EXPECT_CONTAINS(e, "expected a number in [0, 1], got " + std::string(bad));
    }
    EXPECT_CONTAINS(spec_error(head + "data: { seq_len_jitter: nan }\n"),
                    "key 'data.seq_len_jitter': expected a number, got 'nan'");
    const std::string e = spec_error(head + "data: { cache: sometimes }\n");
    EXPECT_CONTAINS(e, "data.cache");
    EXPECT_CONTAINS(e, "true or false");
    EXPECT_EQ(spec_error(head + "data: { seq_len_jitter: 0.5, cache: true }\n"), "");
    EXPECT_EQ(spec_error(head + "data: { seq_len_jitter: 1 }\n"), "");
}

TEST(DataKnobs, AreOneKnobVariantsThatRoundTripThroughSet) {
    TempDir dir("mt_spec_jc");
    const std::string p = dir.file("e.yaml");
    std::ofstream(p) << "name: x\nbackend: cpu\nmodel: { preset: tiny }\n"
                        "variants:\n  - name: base\n"
                        "  - name: jitter\n    set: { data.seq_len_jitter: 0.25 }\n"
                        "  - name: cache\n    set: { data.cache: true }\n";
    const ExperimentSpec spec = load_experiment(p);
    const std::vector<RunConfig>& runs = spec.variants;
    ASSERT_EQ(runs.size(), 3u);
    EXPECT_EQ(runs[1].data.seq_len_jitter, 0.25f);
    EXPECT_EQ(runs[1].changed.size(), 1u);
    EXPECT_EQ(runs[2].data.cache, true);
    EXPECT_EQ(runs[2].changed.size(), 1u);
    EXPECT_EQ(runs[0].data.seq_len_jitter, 0.0f);
    EXPECT_EQ(runs[0].data.cache, false);
    // --set reaches them like any key.
    const ExperimentSpec set = load_experiment(p, {"data.seq_len_jitter=0.5", "data.cache=true"});
    EXPECT_EQ(set.base.data.seq_len_jitter, 0.5f);
    EXPECT_TRUE(set.base.data.cache);
}

}  // namespace
}  // namespace mt
