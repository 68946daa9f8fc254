// Checkpoints of models that train a subset (model.lora, optim.freeze, model.quantize_frozen:
// int8), and `microtrain export` of LoRA adapters: merged into the weights and alone.
//
// What is pinned: a checkpoint holds every weight (int8 ones dequantised, which a load
// quantises back to the same int8 values and scales) and the AdamW moments of the tensors
// that train only; a stopped and resumed `microtrain train` of such a model is bitwise the
// uninterrupted one; the merged export is a plain GPT-2 checkpoint whose loss is the LoRA
// model's (in microtrain and, where torch is installed, in PyTorch with strict=True); the
// adapters export applied to the base again gives the same merged file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "io/safetensors.h"
#include "kernels/quantize.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "tests/test_util.h"

namespace mt {
namespace {

std::string q(const std::string& s) {
    return "'" + s + "'";
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::exception& e) {
        return e.what();
    }
    return "(no error)";
}

GPTConfig small() {
    GPTConfig c;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 32;
    c.max_seq_len = 16;
    c.vocab_size = 200;  // padded to 256: the merged export cuts wte back to 200 rows
    return c;
}

TrainableOptions lora_options(bool int8 = false) {
    TrainableOptions t;
    t.lora.rank = 4;
    t.lora.alpha = 8.0f;
    t.lora.targets = {LoraTarget::mlp_c_fc, LoraTarget::attn_c_attn};  // not in table order
    if (int8) t.quantize_frozen = QuantizeFrozen::int8;
    return t;
}

ModelOptions model_options(const TrainableOptions& t) {
    ModelOptions o;
    o.trainable = t;
    return o;
}

// A model, its optimizer and a fixed batch on a fresh CPU backend.
struct Rig {
    std::unique_ptr<Backend> backend = create_backend(BackendKind::cpu);
    GPT model;
    AdamW opt;
    DeviceBuffer in, tg;
    int B = 2, T = 8;
    Rig(const GPTConfig& c, const TrainableOptions& t)
        : model(*backend, c, model_options(t)), opt(model, [] {
              AdamWConfig oc;
              oc.lr = 1e-2f;
              return oc;
          }()) {
        model.init_weights(1234);
        model.allocate_activations(B, T);
        std::mt19937 rng(5);
        std::vector<int> ids(static_cast<size_t>(B) * T), tgt(ids.size());
        for (auto& x : ids) x = static_cast<int>(rng() % c.vocab_size);
        for (auto& x : tgt) x = static_cast<int>(rng() % c.vocab_size);
        in = DeviceBuffer(*backend, ids.size() * 4, MemoryCategory::data);
        tg = DeviceBuffer(*backend, ids.size() * 4, MemoryCategory::data);
        backend->copy_to_device(in.get(), ids.data(), ids.size() * 4);
        backend->copy_to_device(tg.get(), tgt.data(), tgt.size() * 4);
    }
    float loss() {
        model.forward(in.as<int>(), tg.as<int>(), B, T);
        return model.loss();
    }
    void train_step() {
        model.zero_grad();
        model.forward(in.as<int>(), tg.as<int>(), B, T);
        model.backward();
        opt.step();
    }
};

// ---- checkpoints of a trainable subset ----------------------------------------------------

TEST(TrainableCheckpoint, LoraCheckpointHoldsEveryWeightAndTheAdaptersMomentsOnly) {
    TempDir dir;
    const std::string p = dir.file("lora.safetensors");
    Rig a(small(), lora_options());
    a.train_step();
    a.train_step();
    save_checkpoint(p, a.model, &a.opt);

    const SafeTensorsFile f = SafeTensorsFile::open(p);
    EXPECT_EQ(*f.metadata_value("lora_rank"), "4");
    EXPECT_EQ(*f.metadata_value("lora_alpha"), "8");
    EXPECT_EQ(*f.metadata_value("lora_targets"), "attn.c_attn,mlp.c_fc");  // table order
    EXPECT_NE(f.find("transformer.h.1.mlp.c_fc.weight"), nullptr);
    EXPECT_NE(f.find("transformer.h.1.mlp.c_fc.lora_B.weight"), nullptr);
    EXPECT_NE(f.find("optim.m.transformer.h.0.attn.c_attn.lora_A.weight"), nullptr);
    EXPECT_EQ(f.find("optim.m.transformer.h.0.attn.c_attn.weight"), nullptr);  // frozen
    size_t moments = 0;
    for (const auto& t : f.tensors()) moments += t.name.rfind("optim.", 0) == 0;
    EXPECT_EQ(moments, 2u * 2 * 2 * 2);  // m, v x 2 layers x 2 targets x (A, B)

    const LoraConfig l = read_checkpoint_lora(f, read_checkpoint_config(f));
    EXPECT_EQ(l.rank, 4);
    EXPECT_EQ(l.alpha, 8.0f);
    EXPECT_EQ(l.targets, (std::vector<LoraTarget>{LoraTarget::attn_c_attn, LoraTarget::mlp_c_fc}));

    Rig b(small(), lora_options());
    b.model.init_weights(999);
    const CheckpointLoadInfo info = load_checkpoint(p, b.model, &b.opt);
    EXPECT_EQ(info.step, 2);
    EXPECT_EQ(b.model.get_params(), a.model.get_params());
    EXPECT_EQ(b.opt.get_m(), a.opt.get_m());
    EXPECT_EQ(b.opt.get_v(), a.opt.get_v());
    a.train_step();
    b.train_step();
    EXPECT_EQ(b.model.get_params(), a.model.get_params());
}

// int8 weights are written dequantised (s q); a load quantises s q back: max |s q| over a row
// is 127 s, so the scale comes back as fl(fl(127 s)/127) = s and every q as itself (checked
// exhaustively over every fp32 mantissa of s when this test was written). So a resumed int8 run
// is bitwise the uninterrupted one.
TEST(TrainableCheckpoint, Int8BaseRoundTripsBitwiseThroughACheckpoint) {
    TempDir dir;
    const std::string p1 = dir.file("a.safetensors"), p2 = dir.file("b.safetensors");
    Rig a(small(), lora_options(/*int8=*/true));
    a.train_step();
    save_checkpoint(p1, a.model, &a.opt);
    Rig b(small(), lora_options(true));
    b.model.init_weights(999);
    load_checkpoint(p1, b.model, &b.opt);
    EXPECT_EQ(b.model.get_params(), a.model.get_params());
    EXPECT_EQ(b.loss(), a.loss());
    save_checkpoint(p2, b.model, &b.opt);
    const SafeTensorsFile f1 = SafeTensorsFile::open(p1), f2 = SafeTensorsFile::open(p2);
    for (const auto& t : f1.tensors())
        EXPECT_EQ(f1.read_raw(t), f2.read_raw(f2.at(t.name))) << t.name;
    a.train_step();
    b.train_step();
    EXPECT_EQ(b.model.get_params(), a.model.get_params());

    // The same argument on rows of every magnitude, including an all-zero row.
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    const int rows = 64, cols = 33;
    std::vector<float> w(static_cast<size_t>(rows) * cols);
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
            w[static_cast<size_t>(r) * cols + c] = r == 0 ? 0.0f : std::ldexp(normal(rng), r - 32);
    std::vector<int8_t> q1(w.size()), q2(w.size());
    std::vector<float> s1(rows), s2(rows), deq(w.size());
    quantize_int8_per_row(w.data(), rows, cols, q1.data(), s1.data());
    for (size_t i = 0; i < w.size(); ++i) deq[i] = dequantize_int8(q1[i], s1[i / cols]);
    quantize_int8_per_row(deq.data(), rows, cols, q2.data(), s2.data());
    EXPECT_EQ(q1, q2);
    EXPECT_EQ(s1, s2);
}

TEST(TrainableCheckpoint, MomentsOfAnotherTrainableSetAreRefusedWithAnOptimizer) {
    TempDir dir;
    const std::string p = dir.file("full.safetensors");
    Rig full(small(), {});
    full.train_step();
    save_checkpoint(p, full.model, &full.opt);
    TrainableOptions frozen;
    frozen.freeze = {"wte", "h.0"};
    Rig f(small(), frozen);
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(p, f.model, &f.opt); }),
                    "holds AdamW moments of 'transformer.wte.weight', which this model does not "
                    "train");
    load_checkpoint(p, f.model);  // the weights alone load
    EXPECT_EQ(f.model.get_params(), full.model.get_params());
}

TEST(TrainableCheckpoint, AdaptersAndTheirConfigMustMatchTheModel) {
    TempDir dir;
    const std::string p = dir.file("lora.safetensors");
    Rig a(small(), lora_options());
    save_checkpoint(p, a.model, &a.opt);
    Rig plain(small(), {});
    const std::string e = error_of([&] { load_checkpoint(p, plain.model); });
    EXPECT_CONTAINS(e, "is a LoRA adapter, but the model has no LoRA adapters");
    EXPECT_CONTAINS(e, "microtrain export");
    TrainableOptions other = lora_options();
    other.lora.alpha = 16.0f;
    Rig b(small(), other);
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(p, b.model); }),
                    "the checkpoint's LoRA alpha is 8 but the model's model.lora.alpha is 16");
    // A plain checkpoint has no adapters for a LoRA model: the missing tensor is named.
    const std::string pp = dir.file("plain.safetensors");
    save_checkpoint(pp, plain.model, nullptr);
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(pp, a.model); }),
                    "missing tensor 'transformer.h.0.attn.c_attn.lora_A.weight'");
    EXPECT_EQ(read_checkpoint_lora(SafeTensorsFile::open(pp), small()).rank, 0);
}

// ---- merge ----------------------------------------------------------------------------------

TEST(LoraExport, MergedWeightsGiveTheLoraModelsLoss) {
    TempDir dir;
    Rig a(small(), lora_options());
    for (int i = 0; i < 3; ++i) a.train_step();  // B is no longer zero
    const float lora_loss = a.loss();
    const std::string p = dir.file("merged.safetensors");
    save_plain_checkpoint(p, small(),
                          merge_lora(a.model.parameter_table(), a.model.options().trainable.lora,
                                     a.model.get_params(), small()));
    const SafeTensorsFile f = SafeTensorsFile::open(p);
    EXPECT_EQ(f.at("transformer.wte.weight").shape, (std::vector<int64_t>{200, 32}));
    EXPECT_NE(f.find("lm_head.weight"), nullptr);
    for (const auto& t : f.tensors()) EXPECT_EQ(t.name.find("lora"), std::string::npos) << t.name;
    Rig plain(small(), {});
    load_checkpoint(f, plain.model);
    EXPECT_NEAR(plain.loss(), lora_loss, 1e-5 * lora_loss);
    EXPECT_NE(plain.loss(), Rig(small(), {}).loss());  // the merge changed the weights
}

// ---- the CLI: train, resume, export ---------------------------------------------------------

// The tiny preset with `trainable` lines in model: and `optim_extra` lines in optim:.
std::string lora_yaml(const TempDir& d, const std::string& trainable,
                      const std::string& optim_extra = "") {
    const std::string path = d.file("lora.yaml");
    std::ofstream(path) << "name: lora\nbackend: cpu\n"
                           "model:\n  preset: tiny\n"
                        << trainable
                        << "data:\n  source: synthetic\n  batch_size: 2\n  seq_len: 16\n"
                           "  val_fraction: 0.1\n"
                           "optim:\n  lr: 1.0e-2\n  schedule: cosine\n  warmup_steps: 2\n"
                           "  decay_steps: 10\n  grad_clip: 1.0\n"
                        << optim_extra
                        << "run:\n  seed: 7\n  threads: 1\n"
                           "train:\n  steps: 8\n  eval_every: 4\n  eval_batches: 1\n"
                           "  checkpoint_every: 3\n  keep_checkpoints: 2\n";
    return path;
}

std::string ckpt(const std::string& dir, int step) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "/checkpoints/step-%08d.safetensors", step);
    return dir + buf;
}

std::string file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

const char* kLora = "  lora: {rank: 4, alpha: 8, targets: [attn.c_attn, mlp.c_proj]}\n";

TEST(TrainableTrainCli, StoppedAndResumedRunIsBitwiseTheUninterruptedOne) {
    for (const std::string& trainable :
         {std::string(kLora), std::string(kLora) + "  quantize_frozen: int8\n"}) {
        SCOPED_TRACE(trainable);
        TempDir d;
        const std::string yaml = lora_yaml(d, trainable);
        const std::string full = d.file("full"), part = d.file("part");
        CliResult r = run_microtrain("train " + q(yaml) + " --out-dir " + q(full));
        ASSERT_EQ(r.rc, 0) << r.output;
        r = run_microtrain("train " + q(yaml) + " --out-dir " + q(part) + " --steps 4");
        ASSERT_EQ(r.rc, 0) << r.output;
        r = run_microtrain("train " + q(yaml) + " --resume " + q(part));
        ASSERT_EQ(r.rc, 0) << r.output;
        EXPECT_CONTAINS(r.output, "resumed from " + ckpt(part, 4) + " at step 4");
        EXPECT_CONTAINS(r.output, "export the adapters: microtrain export " + ckpt(part, 8));
        // The whole file: weights, the adapters' moments, the metadata (checksum included).
        EXPECT_EQ(file_bytes(ckpt(full, 8)), file_bytes(ckpt(part, 8)));
        const SafeTensorsFile f = SafeTensorsFile::open(ckpt(full, 8));
        EXPECT_EQ(f.find("optim.m.transformer.h.0.mlp.c_fc.weight"), nullptr);
        EXPECT_NE(f.find("optim.m.transformer.h.0.mlp.c_proj.lora_A.weight"), nullptr);
        // int8 too: the merge is onto the dequantised base the adapters were trained against.
        r = run_microtrain("export " + q(ckpt(full, 8)) + " --merged " + q(d.file("m")));
        EXPECT_EQ(r.rc, 0) << r.output;
    }
}

TEST(TrainableTrainCli, FrozenRunResumesBitwise) {
    TempDir d;
    const std::string yaml = lora_yaml(d, "", "  freeze: [wte, wpe, h.0]\n");
    const std::string set;
    const std::string full = d.file("full"), part = d.file("part");
    CliResult r = run_microtrain("train " + q(yaml) + set + " --out-dir " + q(full));
    ASSERT_EQ(r.rc, 0) << r.output;
    ASSERT_EQ(run_microtrain("train " + q(yaml) + set + " --out-dir " + q(part) + " --steps 4").rc,
              0);
    r = run_microtrain("train " + q(yaml) + set + " --resume " + q(part));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_EQ(file_bytes(ckpt(full, 8)), file_bytes(ckpt(part, 8)));
    const SafeTensorsFile f = SafeTensorsFile::open(ckpt(full, 8));
    EXPECT_EQ(f.find("optim.m.transformer.h.0.mlp.c_fc.weight"), nullptr);
    EXPECT_NE(f.find("optim.m.transformer.h.1.mlp.c_fc.weight"), nullptr);
}

TEST(TrainableTrainCli, ExportWritesTheMergedModelAndTheAdaptersWhichReapplyToTheBase) {
    TempDir d;
    const std::string run = d.file("run");
    ASSERT_EQ(run_microtrain("train " + q(lora_yaml(d, kLora)) + " --out-dir " + q(run)).rc, 0);
    const std::string c = ckpt(run, 8), merged = d.file("merged.safetensors"),
                      adapters = d.file("adapters.safetensors");
    CliResult r =
        run_microtrain("export " + q(c) + " --merged " + q(merged) + " --adapters " + q(adapters));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "LoRA rank 4, alpha 8, scale 2");

    const SafeTensorsFile m = SafeTensorsFile::open(merged);
    for (const auto& t : m.tensors()) {
        EXPECT_EQ(t.name.find("lora"), std::string::npos) << t.name;
        EXPECT_NE(t.name.rfind("optim.", 0), 0u) << t.name;
    }
    EXPECT_EQ(m.metadata_value("lora_rank"), nullptr);
    const SafeTensorsFile a = SafeTensorsFile::open(adapters);
    EXPECT_EQ(a.tensors().size(), 2u * 2 * 2);  // 2 layers x 2 targets x (A, B)
    EXPECT_EQ(*a.metadata_value("lora_targets"), "attn.c_attn,mlp.c_proj");
    EXPECT_EQ(*a.metadata_value("n_embd"), "64");

    // The adapters applied again to the base weights they were trained on: the same file.
    const SafeTensorsFile ck = SafeTensorsFile::open(c);
    const GPTConfig cfg = read_checkpoint_config(ck);
    TrainableOptions lora;
    lora.lora = read_checkpoint_lora(ck, cfg);
    const ParameterTable table(cfg, lora);
    SafeTensorsWriter base;
    for (const auto& p : table.tensors())
        if (!p.lora) base.add_f32(p.name, p.shape, ck.read_f32(p.name));
    base.set_metadata("n_head", std::to_string(cfg.n_head));
    base.write(d.file("base.safetensors"));
    r = run_microtrain("export " + q(adapters) + " --merged " + q(d.file("x.safetensors")));
    EXPECT_EQ(r.rc, 2);
    EXPECT_CONTAINS(r.output, "without base weights (an adapters file); give the base");
    const std::string again = d.file("again.safetensors");
    r = run_microtrain("export " + q(adapters) + " --base " + q(d.file("base.safetensors")) +
                       " --merged " + q(again));
    ASSERT_EQ(r.rc, 0) << r.output;
    const SafeTensorsFile g = SafeTensorsFile::open(again);
    for (const auto& t : m.tensors()) EXPECT_EQ(m.read_raw(t), g.read_raw(g.at(t.name))) << t.name;
}

TEST(TrainableTrainCli, ExportErrorsNameTheProblem) {
    TempDir d;
    const std::string run = d.file("run");
    ASSERT_EQ(run_microtrain("train " + q(lora_yaml(d, "")) + " --out-dir " + q(run)).rc, 0);
    CliResult r = run_microtrain("export " + q(ckpt(run, 8)) + " --adapters " + q(d.file("a")));
    EXPECT_EQ(r.rc, 2);
    EXPECT_CONTAINS(r.output, "holds no LoRA adapters");
    EXPECT_FALSE(std::filesystem::exists(d.file("a")));

    const std::string lrun = d.file("lrun");
    ASSERT_EQ(run_microtrain("train " + q(lora_yaml(d, kLora)) + " --out-dir " + q(lrun)).rc, 0);
    r = run_microtrain("export " + q(ckpt(lrun, 8)));
    EXPECT_EQ(r.rc, 2);
    EXPECT_CONTAINS(r.output, "nothing to export");
    r = run_microtrain("export " + q(ckpt(lrun, 8)) + " --merged " + q(d.file("no/such/dir/m")));
    EXPECT_EQ(r.rc, 2);
    EXPECT_CONTAINS(r.output, d.file("no/such/dir/m"));
    r = run_microtrain("export " + q(ckpt(lrun, 8)) + " --merged " + q(ckpt(lrun, 8)));
    EXPECT_EQ(r.rc, 2);
    EXPECT_CONTAINS(r.output, "is the same file as CHECKPOINT");
}

// `step` on the PyTorch fixtures: LoRA from the weights file, --freeze as optim.freeze; the
// output has gradients of the tensors that train only, and PyTorch's parameters after 3 steps
// (test_parity's tolerance, 2e-5).
TEST(TrainableStepCli, StepTrainsTheFixturesSubsetsLikePyTorch) {
    TempDir d;
    const std::string data = MT_TEST_DATA_DIR;
    const std::pair<std::string, std::string> cases[] = {
        {"tiny_lora", ""}, {"tiny_freeze", " --freeze wte,wpe --freeze h.0 --grad-clip 0.05"}};
    for (const auto& [name, flags] : cases) {
        SCOPED_TRACE(name);
        const std::string out = d.file(name + ".safetensors");
        const CliResult r =
            run_microtrain("step --weights " + q(data + "/" + name + "_weights.safetensors") +
                           " --batch " + q(data + "/" + name + "_batch.safetensors") +
                           " --steps 3 --lr 1e-3 --threads 1" + flags + " --out " + q(out));
        ASSERT_EQ(r.rc, 0) << r.output;
        EXPECT_CONTAINS(r.output, name == "tiny_lora"
                                      ? "trains 12 of 40 tensors (LoRA rank 4, alpha 8)"
                                      : "trains 14 of 28 tensors (--freeze)");
        const SafeTensorsFile o = SafeTensorsFile::open(out);
        const SafeTensorsFile e =
            SafeTensorsFile::open(data + "/" + name + "_expected.safetensors");
        size_t grads = 0;
        for (const auto& t : o.tensors()) {
            if (t.name == "loss") continue;
            if (t.name.rfind("grad.", 0) == 0) ++grads;
            ASSERT_NE(e.find(t.name), nullptr) << t.name << " (PyTorch has no such tensor)";
            if (t.name.rfind("grad.", 0) == 0) continue;
            const std::vector<float> got = o.read_f32(t.name), want = e.read_f32(t.name);
            ASSERT_EQ(got.size(), want.size()) << t.name;
            for (size_t i = 0; i < got.size(); ++i)
                ASSERT_NEAR(got[i], want[i], 2e-5) << t.name << "[" << i << "]";
        }
        EXPECT_EQ(grads, name == "tiny_lora" ? 12u : 14u);
    }
    const CliResult bad = run_microtrain(
        "step --weights " + q(data + "/tiny_freeze_weights.safetensors") + " --batch " +
        q(data + "/tiny_freeze_batch.safetensors") + " --freeze h.7 --out " + q(d.file("x")));
    EXPECT_EQ(bad.rc, 2);
    EXPECT_CONTAINS(bad.output, "optim.freeze: 'h.7' names no parameter");
}

// ---- PyTorch ----------------------------------------------------------------------------------

bool have_torch() {
    return run_shell("/usr/bin/python3 -c 'import torch'").rc == 0;
}

// "loss on X: 5.303883" -> 5.303883
double printed_loss(const std::string& output, const std::string& prefix) {
    const size_t at = output.find(prefix);
    if (at == std::string::npos) return NAN;
    return std::stod(output.substr(at + prefix.size()));
}

// The fixture tests/data/tiny_lora_* is a PyTorch LoRA model (tools/make_reference.py, its own
// LoRALinear): merged by microtrain, it loads into PyTorch's plain nanoGPT module with
// load_state_dict(strict=True) and gives PyTorch's LoRA loss; and microtrain's LoRA model gives
// the same loss on it.
TEST(LoraExportPyTorch, MergedCheckpointLoadsStrictlyAndGivesTheLoraModelsLoss) {
    if (!have_torch()) GTEST_SKIP() << "needs /usr/bin/python3 with torch (python3-torch)";
    TempDir d;
    const std::string w = std::string(MT_TEST_DATA_DIR) + "/tiny_lora_weights.safetensors";
    const std::string x = std::string(MT_TEST_DATA_DIR) + "/tiny_lora_batch.safetensors";
    const std::string merged = d.file("merged.safetensors");
    CliResult r = run_microtrain("export " + q(w) + " --merged " + q(merged));
    ASSERT_EQ(r.rc, 0) << r.output;
    r = run_shell("/usr/bin/python3 " MT_SOURCE_DIR "/tools/make_reference.py --check-load " +
                  q(merged) + " --batch " + q(x));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_CONTAINS(r.output, "loaded strictly into PyTorch nanoGPT");
    const double torch_merged = printed_loss(r.output, "loss on " + x + ": ");
    const SafeTensorsFile expected =
        SafeTensorsFile::open(std::string(MT_TEST_DATA_DIR) + "/tiny_lora_expected.safetensors");
    const double torch_lora = expected.read_f32("loss")[0];
    EXPECT_NEAR(torch_merged, torch_lora, 1e-5 * torch_lora);

    // microtrain's LoRA model on the same weights (step prints the loss before its step).
    r = run_microtrain("step --weights " + q(w) + " --batch " + q(x) + " --out " +
                       q(d.file("o.safetensors")) + " --threads 1");
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_NEAR(printed_loss(r.output, "loss before step 1: "), torch_lora, 1e-5 * torch_lora);

    // A checkpoint microtrain trained, merged: PyTorch's loss is microtrain's LoRA loss.
    const std::string run = d.file("run");
    ASSERT_EQ(run_microtrain("train " + q(lora_yaml(d, kLora)) + " --out-dir " + q(run)).rc, 0);
    ASSERT_EQ(run_microtrain("export " + q(ckpt(run, 8)) + " --merged " + q(merged)).rc, 0);
    // A batch of the tiny preset's vocabulary: the fixture's ids are < 200 <= 256.
    r = run_microtrain("step --weights " + q(ckpt(run, 8)) + " --batch " + q(x) + " --out " +
                       q(d.file("o2.safetensors")) + " --threads 1");
    ASSERT_EQ(r.rc, 0) << r.output;
    const double ours = printed_loss(r.output, "loss before step 1: ");
    r = run_shell("/usr/bin/python3 " MT_SOURCE_DIR "/tools/make_reference.py --check-load " +
                  q(merged) + " --batch " + q(x));
    ASSERT_EQ(r.rc, 0) << r.output;
    EXPECT_NEAR(printed_loss(r.output, "loss on " + x + ": "), ours, 1e-5 * ours);
}

}  // namespace
}  // namespace mt
