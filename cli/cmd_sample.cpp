// `microtrain sample CKPT [--prompt TEXT | --prompt-tokens 1,2,3] [-n N] [--temperature T]
// [--top-k K] [--seed S]`: what a model has learned, as text (or token ids).
//
// CKPT is anything model.init_from takes (checkpoint/pretrained.h). Each new token is drawn from
// the model's next-token distribution at the last position of the context:
//   p_i ∝ exp(logit_i / T) over the K largest logits (all V with --top-k 0), drawn with one
//   uniform number per token from a seeded generator (std::mt19937_64: the same stream on every
//   platform), so a seed gives the same tokens every time; T = 0 takes the argmax (greedy;
//   the lowest id on a tie). The padded vocabulary rows (model/gpt.h) are never drawn.
// The context is the prompt and what has been generated, its last max_seq_len tokens when longer
// (nanoGPT's generate). There is no KV cache: each token is one forward over the whole context,
// on the same backend and kernels as training (speed: bench/README.md).
//
// Output: --prompt (a byte-level model: one token per byte) prints the prompt and its
// continuation as text; --prompt-tokens prints the generated ids on the last line,
// space-separated. What was loaded and the speed go to stderr.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/pretrained.h"
#include "cli/commands.h"
#include "kernels/backend.h"

namespace mt {
namespace {

// A byte-level model reads one token per byte (data.source: text): 256 ids.
constexpr int kByteVocab = 256;
constexpr int kMaxNewTokens = 1 << 20;

struct SampleArgs {
    std::string input, prompt, prompt_tokens, backend = "cpu";
    int n = 200;
    double temperature = 1.0;
    int top_k = 0;
    uint64_t seed = 1337;
    int threads = 0;  // CPU threads (0 = all cores)
};

[[noreturn]] void fail(const std::string& what) {
    throw std::invalid_argument(what);
}

// "1,2,3" -> ids, each in [0, vocab).
std::vector<int32_t> parse_token_ids(const std::string& text, int vocab) {
    std::vector<int32_t> ids;
    size_t start = 0;
    while (start <= text.size()) {
        const size_t end = std::min(text.find(',', start), text.size());
        const std::string item = text.substr(start, end - start);
        size_t used = 0;
        long long v = -1;
        try {
            v = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (item.empty() || used != item.size() || v < 0 || v >= vocab)
            fail("--prompt-tokens: '" + item + "' is not a token id: expected comma-separated " +
                 "integers in [0, " + std::to_string(vocab) + ") (the model's vocab_size), e.g. " +
                 "--prompt-tokens 1,2,3");
        ids.push_back(static_cast<int32_t>(v));
        start = end + 1;
    }
    return ids;
}

// Whether the model reads bytes: a train checkpoint records its data.source; another file is
// byte-level when its vocabulary is exactly the 256 bytes.
bool is_byte_level(const PretrainedInfo& info) {
    const auto it = info.metadata.find("microtrain.config.data.source");
    if (it != info.metadata.end()) return it->second == "text";
    return info.config.vocab_size == kByteVocab;
}

std::vector<int32_t> prompt_ids(const SampleArgs& a, const PretrainedInfo& info) {
    if (!a.prompt.empty() && !a.prompt_tokens.empty())
        fail(
            "--prompt and --prompt-tokens both given; give one (text for a byte-level model, "
            "token ids for any)");
    if (a.prompt.empty() && a.prompt_tokens.empty())
        fail("no prompt: give --prompt TEXT (a byte-level model) or --prompt-tokens 1,2,3");
    if (!a.prompt_tokens.empty()) return parse_token_ids(a.prompt_tokens, info.config.vocab_size);
    if (!is_byte_level(info))
        fail(
            "--prompt encodes text as bytes (one token per byte), which only a byte-level model "
            "reads (data.source: text, vocab_size 256); " +
            info.weights_path + " has vocab_size " + std::to_string(info.config.vocab_size) +
            ": give its token ids with --prompt-tokens");
    std::vector<int32_t> ids;
    for (const unsigned char byte : a.prompt) ids.push_back(byte);
    return ids;
}

// The next token from one row of logits (V entries), as the header says.
int32_t draw(const float* logits, int V, const SampleArgs& a, std::mt19937_64& rng) {
    std::vector<int32_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    // Largest logit first, the lower id first among equal ones.
    auto before = [&](int32_t x, int32_t y) {
        return logits[x] > logits[y] || (logits[x] == logits[y] && x < y);
    };
    if (a.temperature == 0) return *std::min_element(order.begin(), order.end(), before);
    const size_t k = a.top_k == 0 ? order.size() : std::min<size_t>(a.top_k, order.size());
    std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
    std::vector<double> p(k);
    double sum = 0;
    for (size_t i = 0; i < k; ++i)  // minus the largest: exp never overflows
        sum += p[i] = std::exp((double(logits[order[i]]) - logits[order[0]]) / a.temperature);
    // A uniform double in [0, 1) from the generator's top 53 bits (not a std distribution,
    // whose algorithm differs between standard libraries).
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
    double acc = 0;
    for (size_t i = 0; i < k; ++i)
        if ((acc += p[i]) > u) return order[i];
    return order[k - 1];
}

int run_sample(const SampleArgs& a) {
    if (a.temperature < 0 || !std::isfinite(a.temperature))
        fail("--temperature " + std::to_string(a.temperature) +
             ": expected a finite number >= 0 (0 = greedy, 1 = the model's distribution)");
    const PretrainedInfo info = inspect_pretrained(a.input);
    std::vector<int32_t> tokens = prompt_ids(a, info);
    const size_t prompt_len = tokens.size();
    BackendOptions options;
    options.num_threads = a.threads;
    std::unique_ptr<Backend> backend =
        create_backend(a.backend == "cuda" ? BackendKind::cuda : BackendKind::cpu, options);
    GPT model(*backend, info.config);
    load_pretrained(info, model, a.seed);
    const int T_max = info.config.max_seq_len, V = info.config.vocab_size;
    const int Vp = info.config.padded_vocab_size();
    model.allocate_activations(1, T_max);
    DeviceBuffer in(*backend, T_max * sizeof(int32_t), MemoryCategory::data);
    std::vector<float> logits(static_cast<size_t>(Vp));
    std::mt19937_64 rng(a.seed);
    std::fprintf(stderr, "sampling %d tokens from %s (temperature %g, top-k %d, seed %llu)\n", a.n,
                 info.describe().c_str(), a.temperature, a.top_k,
                 static_cast<unsigned long long>(a.seed));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < a.n; ++i) {
        const size_t T = std::min(tokens.size(), static_cast<size_t>(T_max));
        const int32_t* context = tokens.data() + tokens.size() - T;
        backend->copy_to_device(in.get(), context, T * sizeof(int32_t));
        model.forward(in.as<int>(), nullptr, 1, static_cast<int>(T));
        const auto* last = static_cast<const std::byte*>(model.logits_device()) +
                           (T - 1) * static_cast<size_t>(Vp) * sizeof(float);
        backend->copy_to_host(logits.data(), last, logits.size() * sizeof(float));
        tokens.push_back(draw(logits.data(), V, a, rng));
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr,
                 "%d tokens in %.2f s (%.1f tokens/s; no KV cache: one forward per token)\n", a.n,
                 s, s > 0 ? a.n / s : 0.0);
    if (!a.prompt.empty()) {
        std::string text;
        for (const int32_t byte : tokens)
            text += static_cast<char>(static_cast<unsigned char>(byte));
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::printf("\n");
    } else {
        std::string line;
        for (size_t i = prompt_len; i < tokens.size(); ++i)
            line += (line.empty() ? "" : " ") + std::to_string(tokens[i]);
        std::printf("%s\n", line.c_str());
    }
    return 0;
}

}  // namespace

void register_sample_command(CLI::App& app, int& exit_code) {
    auto a = std::make_shared<SampleArgs>();
    CLI::App* cmd = app.add_subcommand(
        "sample",
        "Generate text (or token ids) from a checkpoint, nanoGPT weights or a Hugging Face GPT-2");
    cmd->add_option("checkpoint", a->input,
                    "What model.init_from takes: a train checkpoint or run directory, nanoGPT "
                    "weights, a Hugging Face model.safetensors or its folder")
        ->required()
        ->check(CLI::ExistingPath);
    cmd->add_option("--prompt", a->prompt,
                    "Text to continue (byte-level models: one token a byte)");
    cmd->add_option("--prompt-tokens", a->prompt_tokens,
                    "Token ids to continue, comma-separated (1,2,3); the generated ids are "
                    "printed on the last line");
    cmd->add_option("-n", a->n, "Tokens to generate")
        ->capture_default_str()
        ->check(CLI::Range(1, kMaxNewTokens));
    cmd->add_option("--temperature", a->temperature, "Softmax temperature; 0 = greedy (argmax)")
        ->capture_default_str();
    cmd->add_option("--top-k", a->top_k, "Draw from the K most likely tokens only (0 = all)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--seed", a->seed, "Seed of the draws (the same seed, the same tokens)")
        ->capture_default_str();
    cmd->add_option("--threads", a->threads, "CPU threads (0 = all cores)")
        ->capture_default_str()
        ->check(CLI::Range(0, kMaxThreads));
    cmd->add_option("--backend", a->backend, "cpu or cuda")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->callback([a, &exit_code] {
        try {
            exit_code = run_sample(*a);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "microtrain sample: error: %s\n", e.what());
            exit_code = 2;
        }
    });
}

}  // namespace mt
