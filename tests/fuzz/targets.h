// What each fuzz target does with one input file, shared by the libFuzzer targets
// (tests/fuzz/fuzz_<target>.cpp) and by the regression test that replays the seed corpora and
// every input a fuzzer ever crashed on (tests/test_fuzz_regressions.cpp), so a fixed crash stays
// fixed in the ordinary test suite too.
//
// Each function must return normally or throw the parser's own error type (which names the
// file); it lets anything else escape, which the fuzzer reports as a crash and the test as a
// failure. Sanitizers, libFuzzer's -timeout and -malloc_limit_mb catch the rest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/pretrained.h"
#include "cli/commands.h"
#include "cli/training_run.h"
#include "engine/data.h"
#include "experiment/spec.h"
#include "io/safetensors.h"
#include "kernels/backend.h"
#include "optim/adamw.h"
#include "report/comparison.h"
#include "report/results.h"

namespace mt::fuzz {

// ---- safetensors: reader + checkpoint config + checkpoint loader ----------------------------

// Reads every tensor through each typed reader that accepts its dtype.
inline void read_every_tensor(const SafeTensorsFile& f) {
    for (const auto& t : f.tensors()) {
        (void)f.read_f64(t);
        (void)f.read_raw(t);
        if (is_floating(t.dtype)) {
            (void)f.read_f32(t.name);
        } else {
            try {
                (void)f.read_i32(t.name);
            } catch (const SafeTensorsError&) {  // BOOL, U64, or a value outside int32
            }
        }
    }
}

// The config the file describes, then the file loaded into a GPT of that config (CPU backend),
// weights only and with an AdamW to restore.
inline void load_into_model(const SafeTensorsFile& f) {
    const GPTConfig c = read_checkpoint_config(f);
    ModelOptions options;  // with the file's LoRA adapters, if it has any
    options.trainable.lora = read_checkpoint_lora(f, c);
    // read_checkpoint_config and read_checkpoint_lora checked every parameter against the file,
    // so the model is no larger than the input; this bound only keeps each execution fast.
    if (ParameterTable(c, options.trainable).total_count() > (size_t{1} << 20)) return;
    static const auto backend = [] {
        BackendOptions o;
        o.num_threads = 1;
        return create_backend(BackendKind::cpu, o);
    }();
    GPT model(*backend, c, options);
    try {
        load_checkpoint(f, model);
    } catch (const CheckpointError&) {
    }
    AdamW opt(model, AdamWConfig{});
    load_checkpoint(f, model, &opt);
}

inline void safetensors(const std::string& path) {
    try {
        const SafeTensorsFile f = SafeTensorsFile::open(path);
        read_every_tensor(f);
        load_into_model(f);
    } catch (const SafeTensorsError&) {  // = CheckpointError
    }
}

// ---- starting points: a Hugging Face GPT-2 folder, as model.init_from / sample / export read it
// --

// One input is a whole folder: config.json's text, the line kPretrainedSeparator, then
// model.safetensors' bytes (no separator: all of it is model.safetensors, with no config.json).
// Both files go into a private temporary folder, rewritten for every input.
inline const std::string kPretrainedSeparator = "\n#model.safetensors\n";

inline void pretrained(const std::string& path) {
    static const std::string dir = [] {
        std::string t =
            (std::filesystem::temp_directory_path() / "mt_fuzz_pretrained_XXXXXX").string();
        if (!mkdtemp(t.data())) std::abort();
        return t;
    }();
    std::ifstream in(path, std::ios::binary);
    const std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t cut = input.find(kPretrainedSeparator);
    std::filesystem::remove(dir + "/config.json");
    if (cut != std::string::npos)
        std::ofstream(dir + "/config.json", std::ios::binary) << input.substr(0, cut);
    const size_t weights = cut == std::string::npos ? 0 : cut + kPretrainedSeparator.size();
    std::ofstream(dir + "/model.safetensors", std::ios::binary) << input.substr(weights);
    try {
        const PretrainedInfo info = inspect_pretrained(dir);
        // The file's tensors were checked against the config: the model is no larger than the
        // input; this bound only keeps each execution fast.
        if (ParameterTable(info.config).total_count() > (size_t{1} << 20)) return;
        static const auto backend = [] {
            BackendOptions o;
            o.num_threads = 1;
            return create_backend(BackendKind::cpu, o);
        }();
        GPT model(*backend, info.config);
        load_pretrained(info, model, 1);
    } catch (const CheckpointError&) {
    }
}

// ---- the batch file of `microtrain step --batch` --------------------------------------------

inline void batch(const std::string& path) {
    const GPTConfig c;  // vocab_size 256, max_seq_len 32
    try {
        const RepeatedBatch b = read_step_batch(path, c, "weights.safetensors");
        const Batch& x = b.batch();
        for (int i = 0; i < x.B * x.T; ++i)
            if (x.inputs[i] < 0 || x.inputs[i] >= c.vocab_size || x.targets[i] < 0 ||
                x.targets[i] >= c.vocab_size)
                throw std::logic_error(path + ": a batch with an id outside the vocabulary");
    } catch (const CheckpointError&) {
    } catch (const DataError&) {
    }
}

// ---- llm.c token files ----------------------------------------------------------------------

// Both entry points, which must agree.
inline void tokens(const std::string& path) {
    size_t count = 0;
    bool counted = false;
    try {
        count = token_file_count(path);
        counted = true;
    } catch (const DataError&) {
    }
    try {
        const std::vector<uint16_t> t = read_token_file(path);
        if (!counted || t.size() != count)
            throw std::logic_error(path + ": read_token_file and token_file_count disagree");
    } catch (const DataError&) {
        if (counted)
            throw std::logic_error(path +
                                   ": token_file_count accepted what read_token_file "
                                   "rejected");
    }
}

// ---- experiment files -----------------------------------------------------------------------

// load_experiment with and without a --set override.
inline void experiment(const std::string& path) {
    try {
        const ExperimentSpec spec = load_experiment(path);
        for (const auto& v : spec.variants) (void)flatten(v);
        (void)load_experiment(path, {"model.n_layer=1"});
    } catch (const SpecError&) {
    }
}

// ---- the metadata of a training checkpoint, as `train --resume` reads it ----------------------

inline void train_checkpoint(const std::string& path) {
    try {
        const TrainCheckpointState s = read_train_checkpoint(SafeTensorsFile::open(path));
        if (s.step < 0) throw std::logic_error(path + ": a negative step was accepted");
    } catch (const SafeTensorsError&) {
    }
}

// ---- results.json, as `compare` reads it ------------------------------------------------------

// The file read, then compared with itself and rendered as `compare` prints it.
inline void results(const std::string& path) {
    try {
        const Results r = read_results(path);
        (void)render_comparison_md(compare_results(r, path, r, path, "", ""));
    } catch (const ReportError&) {
    }
}

}  // namespace mt::fuzz
