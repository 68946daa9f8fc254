// `microtrain step`: run N AdamW steps on one given batch from given weights and write the loss,
// the first step's gradients and the final parameters, so microtrain can be checked tensor by
// tensor against another implementation (tools/make_reference.py writes PyTorch's answer in
// the same format; tests/test_step_cli.cpp compares them).
//
//   W (--weights)  safetensors with nanoGPT names; config from its __metadata__ (see
//                  checkpoint/checkpoint.h: a PyTorch nanoGPT state_dict loads as it is). LoRA
//                  adapters in W (<linear>.lora_A/B.weight, __metadata__ lora_alpha) make a
//                  LoRA model that trains only them; --freeze freezes parameters by name.
//   X (--batch)    int32 `inputs` and `targets`, both (B, T), T <= max_seq_len, ids in [0, V)
//   O (--out)      `loss` F32 [N] (the loss before each step), `grad.<name>` (gradients of the
//                  first step, of the tensors that train only), `<name>` (every parameter after
//                  the last step). The steps run through a StepLoop (engine/step_loop.h): a
//                  non-finite loss or gradient norm stops it at that step, and O then holds the
//                  steps that ran (its `loss` is shorter; exit code 1). Tensors have the
//                  model's shapes, except that wte and its gradient keep W's row count (a
//                  nanoGPT wte of vocab_size rows stays unpadded). Written atomically.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "engine/divergence.h"
#include "engine/step_loop.h"
#include "engine/training_session.h"
#include "experiment/spec.h"
#include "io/safetensors.h"
#include "kernels/enum_names.h"
#include "kernels/text.h"

namespace mt {
namespace {

// The most steps one `step` call runs: the loss of each is kept and written.
constexpr int kMaxSteps = 1000000;

struct StepArgs {
    std::string weights, batch, out;
    std::string backend = "cpu";
    int steps = 1;
    int threads = 0;
    // The AdamW flags as typed. Each is the value of an experiment key and is read by that key's
    // parser (set_knob, experiment/spec.h), so a flag takes exactly what the file's key takes:
    // the same range, and nothing the 32-bit float field would turn into inf or 0.
    std::string lr = format_float(AdamWConfig{}.lr);
    std::string beta1 = format_float(AdamWConfig{}.beta1);
    std::string beta2 = format_float(AdamWConfig{}.beta2);
    std::string eps = format_float(AdamWConfig{}.eps);
    std::string weight_decay = format_float(AdamWConfig{}.weight_decay);
    std::string grad_clip = "0";  // no clipping unless asked
    std::string impl = "fused";
    std::vector<std::string> freeze;  // optim.freeze
    std::string quantize_frozen = "none";
};

// Reads and validates X against the model config: both tensors present, integer, 2-D and of
// the same shape, 1 <= T <= max_seq_len, every id in [0, vocab_size).
RepeatedBatch read_batch(const std::string& path, const GPTConfig& cfg,
                         const std::string& weights) {
    SafeTensorsFile x = SafeTensorsFile::open(path);
    const TensorEntry* tensors[2] = {x.find("inputs"), x.find("targets")};
    const char* names[2] = {"inputs", "targets"};
    for (int i = 0; i < 2; ++i) {
        if (!tensors[i])
            throw CheckpointError(path + ": missing tensor '" + names[i] +
                                  "' (expected I32 token ids of shape (B, T); the batch file "
                                  "holds 'inputs' and 'targets')");
        if (tensors[i]->shape.size() != 2 || tensors[i]->shape[0] < 1 || tensors[i]->shape[1] < 1)
            throw CheckpointError(path + ": tensor '" + names[i] + "' has shape " +
                                  shape_string(tensors[i]->shape) +
                                  ", expected (B, T) with B >= 1 and T >= 1");
    }
    if (tensors[0]->shape != tensors[1]->shape)
        throw CheckpointError(path + ": 'inputs' has shape " + shape_string(tensors[0]->shape) +
                              " but 'targets' has shape " + shape_string(tensors[1]->shape) +
                              "; they must have the same shape (B, T)");
    // The data region holds B*T ids, so B*T < 2^40; the model indexes them with int.
    if (tensors[0]->shape[0] * tensors[0]->shape[1] > INT32_MAX)
        throw CheckpointError(path + ": 'inputs' has shape " + shape_string(tensors[0]->shape) +
                              ", more than 2^31-1 token ids (B*T); use a smaller batch");
    const int B = static_cast<int>(tensors[0]->shape[0]);
    const int T = static_cast<int>(tensors[0]->shape[1]);
    if (T > cfg.max_seq_len)
        throw CheckpointError(path + ": sequence length T=" + std::to_string(T) + " (shape " +
                              shape_string(tensors[0]->shape) + ") exceeds max_seq_len=" +
                              std::to_string(cfg.max_seq_len) + " of the model in " + weights);
    std::vector<int32_t> ids_of[2] = {x.read_i32("inputs"), x.read_i32("targets")};
    for (int i = 0; i < 2; ++i) {
        const auto& ids = ids_of[i];
        for (size_t k = 0; k < ids.size(); ++k)
            if (ids[k] < 0 || ids[k] >= cfg.vocab_size)
                throw CheckpointError(
                    path + ": tensor '" + names[i] + "' has token id " + std::to_string(ids[k]) +
                    " at (b=" + std::to_string(k / T) + ", t=" + std::to_string(k % T) +
                    "), outside [0, vocab_size=" + std::to_string(cfg.vocab_size) +
                    ") of the model in " + weights);
    }
    return RepeatedBatch(B, T, std::move(ids_of[0]), std::move(ids_of[1]));
}

// --optim-impl: one of the AdamWImpl spellings (optim/adamw.h), never a silent default.
AdamWImpl parse_impl(const std::string& s) {
    if (auto impl = parse_enum<AdamWImpl>(s)) return *impl;
    throw std::invalid_argument("--optim-impl '" + s + "' is not an AdamW implementation; " +
                                "expected one of " + enum_choices<AdamWImpl>());
}

std::string fmt_float(float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
    return buf;
}

// The RunConfig of `step`: W's model, X's shape, one micro-batch per step, the given AdamW with
// a constant LR, no trace.
RunConfig step_config(const StepArgs& a, const GPTConfig& model, const Batch& batch) {
    RunConfig c;
    c.variant = "step";
    c.model = model;
    c.data.batch_size = batch.B;
    c.data.seq_len = batch.T;
    const std::pair<const char*, const std::string*> knobs[] = {
        {"optim.lr", &a.lr},
        {"optim.eps", &a.eps},
        {"optim.weight_decay", &a.weight_decay},
        {"optim.grad_clip", &a.grad_clip},
    };
    const char* flags[] = {"--lr", "--eps", "--weight-decay", "--grad-clip"};
    for (size_t i = 0; i < std::size(knobs); ++i)
        set_knob(c, knobs[i].first, *knobs[i].second,
                 std::string(flags[i]) + " " + *knobs[i].second);
    set_knob(c, "optim.betas", "[" + a.beta1 + ", " + a.beta2 + "]",
             "--beta1 " + a.beta1 + " --beta2 " + a.beta2);
    c.optim.impl = parse_impl(a.impl);
    c.optim.schedule = LRSchedule{};  // constant LR
    c.run.threads = a.threads;
    c.profile.trace = false;
    c.trainable.freeze = a.freeze;
    c.trainable.quantize_frozen = *parse_enum<QuantizeFrozen>(a.quantize_frozen);
    return c;
}

// "  trains 12 of 40 tensors (LoRA rank 4, alpha 8)\n" when not everything trains, else "".
std::string trainable_line(const ParameterTable& table, const TrainableOptions& t) {
    size_t trained = 0;
    for (const auto& p : table.tensors()) trained += p.trainable;
    if (trained == table.tensors().size()) return "";
    std::string how = t.lora.enabled() ? "LoRA rank " + std::to_string(t.lora.rank) + ", alpha " +
                                             fmt_float(t.lora.alpha)
                                       : "--freeze";
    if (t.quantize_frozen == QuantizeFrozen::int8) how += ", frozen Linear weights int8";
    return "  trains " + std::to_string(trained) + " of " + std::to_string(table.tensors().size()) +
           " tensors (" + how + ")\n";
}

// Refuses an --out that is the same file as an input, by filesystem identity (device and inode),
// so a relative path, a symlink or a hard link to --weights or --batch is caught like the same
// string: writing O would replace the input.
void check_out_is_not_an_input(const StepArgs& a) {
    struct stat out {};
    if (::stat(a.out.c_str(), &out) != 0) return;  // does not exist yet: cannot be an input
    const std::pair<const char*, const std::string*> inputs[] = {{"--weights", &a.weights},
                                                                 {"--batch", &a.batch}};
    for (const auto& [flag, path] : inputs) {
        struct stat in {};
        if (::stat(path->c_str(), &in) == 0 && in.st_dev == out.st_dev && in.st_ino == out.st_ino)
            throw std::invalid_argument("--out '" + a.out + "' is the same file as " + flag + " '" +
                                        *path +
                                        "': writing the output would replace the input; choose "
                                        "another --out path");
    }
}

// O's __metadata__: the model, the run (`steps`: the steps that ran) and where it ran.
void set_output_metadata(SafeTensorsWriter& out, const GPTConfig& cfg, const AdamWConfig& oc,
                         int ran, const std::string& device) {
    out.set_metadata("n_layer", std::to_string(cfg.n_layer));
    out.set_metadata("n_head", std::to_string(cfg.n_head));
    out.set_metadata("n_embd", std::to_string(cfg.n_embd));
    out.set_metadata("vocab_size", std::to_string(cfg.vocab_size));
    out.set_metadata("max_seq_len", std::to_string(cfg.max_seq_len));
    out.set_metadata("steps", std::to_string(ran));
    out.set_metadata("lr", fmt_float(oc.lr));
    out.set_metadata("beta1", fmt_float(oc.beta1));
    out.set_metadata("beta2", fmt_float(oc.beta2));
    out.set_metadata("eps", fmt_float(oc.eps));
    out.set_metadata("weight_decay", fmt_float(oc.weight_decay));
    out.set_metadata("grad_clip", fmt_float(oc.grad_clip));
    out.set_metadata("optim_impl", to_string(oc.impl));
    out.set_metadata("device", device);
    out.set_metadata("source", "microtrain step");
}

int run_step(const StepArgs& a) {
    check_out_is_not_an_input(a);
    SafeTensorsFile w = SafeTensorsFile::open(a.weights);
    auto batch =
        std::make_unique<RepeatedBatch>(read_batch(a.batch, read_checkpoint_config(w), a.weights));
    RunConfig rc = step_config(a, read_checkpoint_config(w), batch->batch());
    rc.trainable.lora = read_checkpoint_lora(w, rc.model);
    const GPTConfig& cfg = rc.model;
    const AdamWConfig& oc = rc.optim;
    const int B = rc.data.batch_size, T = rc.data.seq_len;

    TrainingInputs inputs;
    inputs.batches = std::move(batch);
    CheckpointLoadInfo info;  // W's wte row count, for the output shapes
    inputs.load_weights = [&](GPT& model) { info = load_checkpoint(w, model, nullptr); };
    inputs.track_memory = false;
    TrainingSession session(
        create_training_backend(rc, a.backend == "cuda" ? BackendKind::cuda : BackendKind::cpu), rc,
        std::move(inputs));

    // Each step's loss is read back before the next step; the gradients of the first are copied
    // out once they are complete, before its optimizer update. A non-finite loss (or gradient
    // norm) stops the loop at that step: O then holds the steps that ran.
    std::vector<float> losses;
    losses.reserve(static_cast<size_t>(a.steps));
    std::vector<float> first_grads;
    StepLoopOptions loop;
    loop.gradients_ready = [&](int s, GPT& model) {
        if (s == 0) first_grads = model.get_grads();
    };
    // Steps numbered from 1, as the "loss before step N" lines number them.
    DivergenceWatch divergence(cfg.vocab_size);
    loop.on_step = [&](const TrainingSession::CompletedStep& done) {
        losses.push_back(static_cast<float>(done.record.loss));
        divergence.observe(done.record.step + 1, done.record.loss, done.record.grad_norm);
    };
    const LoopOutcome outcome = StepLoop(session, std::move(loop)).run(0, a.steps);
    const int ran = static_cast<int>(losses.size());
    GPT& model = session.model();
    const std::vector<float> params = model.get_params();

    // O: loss, grad.<name>, <name>. Spans into the host vectors above (alive until write()).
    SafeTensorsWriter out;
    out.add_f32("loss", {ran}, std::span<const float>(losses));
    const ParameterTable& table = model.parameter_table();
    auto shape_of = [&](const ParameterInfo& p) {
        std::vector<int64_t> s = p.shape;
        if (p.name == "transformer.wte.weight") s[0] = info.wte_rows;  // W's rows (maybe unpadded)
        return s;
    };
    auto count_of = [](const std::vector<int64_t>& s) {
        size_t c = 1;
        for (auto d : s) c *= static_cast<size_t>(d);
        return c;
    };
    for (const auto& p : table.tensors()) {
        if (!p.trainable) continue;  // a frozen tensor has no gradient
        auto s = shape_of(p);
        out.add_f32("grad." + p.name, s,
                    std::span<const float>(first_grads.data() + p.offset, count_of(s)));
    }
    for (const auto& p : table.tensors()) {
        auto s = shape_of(p);
        out.add_f32(p.name, s, std::span<const float>(params.data() + p.offset, count_of(s)));
    }
    set_output_metadata(out, cfg, oc, ran, session.backend().device_name());
    out.write(a.out);

    std::printf("microtrain step: %s, batch %dx%d, %d AdamW step%s (%s, lr %g) on %s\n",
                cfg.describe().c_str(), B, T, a.steps, a.steps == 1 ? "" : "s", to_string(oc.impl),
                static_cast<double>(oc.lr), session.backend().device_name().c_str());
    std::printf("%s", trainable_line(table, rc.trainable).c_str());
    for (int s = 0; s < ran; ++s) std::printf("  loss before step %d: %.6f\n", s + 1, losses[s]);
    std::printf("wrote %s\n", a.out.c_str());
    if (outcome.end == LoopOutcome::End::non_finite) {
        std::fprintf(stderr,
                     "microtrain step: warning: %s is not finite at step %d; the steps after it "
                     "did not run (%s holds %d of %d)\n",
                     outcome.non_finite.in_loss ? "a loss" : "the gradient norm", outcome.step + 1,
                     a.out.c_str(), ran, a.steps);
        return 1;
    }
    if (divergence.found()) {
        std::fprintf(stderr, "microtrain step: warning: %s\n",
                     divergence_warning(*divergence.found()).c_str());
        return 1;
    }
    return 0;  // (no stop signal is handled here: Ctrl-C ends `step` the ordinary way)
}

}  // namespace

void register_step_command(CLI::App& app, int& exit_code) {
    auto a = std::make_shared<StepArgs>();
    CLI::App* cmd = app.add_subcommand(
        "step",
        "Run N AdamW steps on one batch from given weights; write the losses, the first step's "
        "gradients and the final parameters (to compare against another implementation)");
    cmd->add_option("--weights", a->weights,
                    "W.safetensors: parameters with nanoGPT names, config in __metadata__")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--batch", a->batch,
                    "X.safetensors: int32 'inputs' and 'targets' of shape (B, T)")
        ->required()
        ->check(CLI::ExistingFile);
    cmd->add_option("--out", a->out,
                    "O.safetensors to write: 'loss' [N], 'grad.<name>' (first step), '<name>' "
                    "(after the last step)")
        ->required();
    cmd->add_option("--steps", a->steps,
                    "Number of AdamW steps N (1.." + std::to_string(kMaxSteps) + ")")
        ->capture_default_str()
        ->check(CLI::Range(1, kMaxSteps));
    // Checked by their keys' parser when the command runs (step_config), not by CLI11 here.
    cmd->add_option("--lr", a->lr, "Learning rate (constant; optim.lr, > 0)")
        ->capture_default_str();
    cmd->add_option("--beta1", a->beta1, "AdamW beta1 (optim.betas[0], in [0, 1))")
        ->capture_default_str();
    cmd->add_option("--beta2", a->beta2, "AdamW beta2 (optim.betas[1], in [0, 1))")
        ->capture_default_str();
    cmd->add_option("--eps", a->eps, "AdamW epsilon (optim.eps, > 0)")->capture_default_str();
    cmd->add_option("--weight-decay", a->weight_decay,
                    "Decoupled weight decay (2-D parameters only, as nanoGPT; optim.weight_decay)")
        ->capture_default_str();
    cmd->add_option("--grad-clip", a->grad_clip,
                    "Clip the global gradient L2 norm to this value (0 = no clipping; "
                    "optim.grad_clip)")
        ->capture_default_str();
    cmd->add_option("--optim-impl", a->impl, "AdamW implementation")
        ->capture_default_str()
        ->check(CLI::IsMember({"fused", "multi_tensor", "unfused"}));
    cmd->add_option("--freeze", a->freeze,
                    "Freeze these parameters (optim.freeze: names or prefixes such as wte, h.0, "
                    "h.1.mlp; comma-separated or repeated)")
        ->delimiter(',');
    cmd->add_option("--quantize-frozen", a->quantize_frozen,
                    "Store frozen Linear weights as int8 (model.quantize_frozen)")
        ->capture_default_str()
        ->check(CLI::IsMember({"none", "int8"}));
    cmd->add_option("--backend", a->backend, "cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option(
           "--threads", a->threads,
           "CPU threads (0 = OpenMP's default, at most " + std::to_string(kMaxThreads) + ")")
        ->capture_default_str()
        ->check(CLI::Range(0, kMaxThreads));
    cmd->callback([a, &exit_code] {
        try {
            exit_code = run_step(*a);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "microtrain step: error: %s\n", e.what());
            exit_code = 2;
        }
    });
}

RepeatedBatch read_step_batch(const std::string& path, const GPTConfig& model,
                              const std::string& weights) {
    return read_batch(path, model, weights);
}

}  // namespace mt
