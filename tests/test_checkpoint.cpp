// safetensors I/O and model checkpoints: round trips, the PyTorch-written nanoGPT fixture, and
// every rejection with its message (file, tensor, what was expected).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "io/safetensors.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "optim/adamw.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

#define EXPECT_CONTAINS(haystack, needle) \
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, std::string(needle), std::string(haystack))

// A fresh directory, removed with its contents at the end of the test.
class TempDir {
  public:
    TempDir() {
        std::string t = (fs::temp_directory_path() / "mt_ckpt_XXXXXX").string();
        if (!mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
        path_ = t;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    std::string file(const std::string& name) const { return (path_ / name).string(); }
    const fs::path& path() const { return path_; }

  private:
    fs::path path_;
};

// The CheckpointError message of f(), or a test failure if it does not throw one.
std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const CheckpointError& e) {
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected a CheckpointError, got another exception: " << e.what();
        return e.what();
    }
    ADD_FAILURE() << "expected a CheckpointError, nothing was thrown";
    return {};
}

std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file assembled by hand from a header JSON and a data blob, to craft corruption
// the writer would never produce.
std::string raw_file(const std::string& header, const std::string& data) {
    const uint64_t n = header.size();
    std::string out(reinterpret_cast<const char*>(&n), 8);
    return out + header + data;
}

std::string f32_bytes(std::initializer_list<float> v) {
    std::string s(v.size() * 4, '\0');
    std::memcpy(s.data(), std::data(v), s.size());
    return s;
}

// ---- SafeTensorsFile / SafeTensorsWriter --------------------------------------------------

TEST(SafeTensors, WriterRoundTripsTensorsAndMetadata) {
    TempDir dir;
    const std::string p = dir.file("a.safetensors");
    SafeTensorsWriter w;
    std::vector<float> a{1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f};
    w.add_f32("a", {2, 3}, std::span<const float>(a));
    w.add_i32("ids", {4}, std::vector<int32_t>{0, -1, 2147483647, 42});
    w.add_f32("empty", {0, 5}, std::vector<float>{});
    w.add_f32("scalar", {}, std::vector<float>{9.0f});
    w.set_metadata("step", "12");
    w.write(p);

    SafeTensorsFile f = SafeTensorsFile::open(p);
    ASSERT_EQ(f.tensors().size(), 4u);
    EXPECT_EQ(f.at("a").shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(f.at("a").dtype, SafeTensorsDType::F32);
    EXPECT_EQ(f.read_f32("a"), a);
    EXPECT_EQ(f.read_i32("ids"), (std::vector<int32_t>{0, -1, 2147483647, 42}));
    EXPECT_EQ(f.read_f32("empty").size(), 0u);
    EXPECT_EQ(f.read_f32("scalar"), (std::vector<float>{9.0f}));
    ASSERT_NE(f.metadata_value("step"), nullptr);
    EXPECT_EQ(*f.metadata_value("step"), "12");
    EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(SafeTensors, WriterProducesTheStandardLayoutWithAlignedData) {
    TempDir dir;
    const std::string p = dir.file("b.safetensors");
    SafeTensorsWriter w;
    w.add_f32("x", {3}, std::vector<float>{1, 2, 3});
    w.add_i32("y", {2}, std::vector<int32_t>{7, 8});
    w.write(p);
    const std::string bytes = read_bytes(p);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u) << "data region should be 8-byte aligned";
    ASSERT_EQ(bytes.size(), 8 + n + 12 + 8);
    auto h = nlohmann::json::parse(bytes.substr(8, n));
    EXPECT_EQ(h["x"]["dtype"], "F32");
    EXPECT_EQ(h["x"]["data_offsets"], nlohmann::json::array({0, 12}));
    EXPECT_EQ(h["y"]["dtype"], "I32");
    EXPECT_EQ(h["y"]["shape"], nlohmann::json::array({2}));
    EXPECT_EQ(h["y"]["data_offsets"], nlohmann::json::array({12, 20}));
    float x[3];
    std::memcpy(x, bytes.data() + 8 + n, 12);
    EXPECT_EQ(x[2], 3.0f);
}

TEST(SafeTensors, AtomicWriteReplacesTheFileAndLeavesNoTemporary) {
    TempDir dir;
    const std::string p = dir.file("c.safetensors");
    write_bytes(p, "old contents");
    SafeTensorsWriter w;
    w.add_f32("x", {1}, std::vector<float>{4});
    w.write(p);
    EXPECT_EQ(SafeTensorsFile::open(p).read_f32("x"), (std::vector<float>{4}));
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir.path())) {
        ++files;
        EXPECT_EQ(e.path().filename(), "c.safetensors");
    }
    EXPECT_EQ(files, 1);
}

TEST(SafeTensors, WriteIntoMissingDirectoryFailsNamingThePath) {
    TempDir dir;
    const std::string p = dir.file("no/such/dir/x.safetensors");
    SafeTensorsWriter w;
    w.add_f32("x", {1}, std::vector<float>{4});
    std::string msg = error_of([&] { w.write(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "No such file or directory");
}

TEST(SafeTensors, WriterRejectsDuplicateNamesAndWrongElementCounts) {
    SafeTensorsWriter w;
    w.add_f32("x", {2}, std::vector<float>{1, 2});
    EXPECT_CONTAINS(error_of([&] {
                        w.add_f32("x", {2}, std::vector<float>{1, 2});
                    }),
                    "'x' added twice");
    EXPECT_CONTAINS(error_of([&] {
                        w.add_f32("y", {2, 2}, std::vector<float>{1, 2});
                    }),
                    "needs 4 elements, got 2");
}

TEST(SafeTensors, ReadsF16BF16AndF64AsF32) {
    TempDir dir;
    const std::string p = dir.file("h.safetensors");
    // F16: 1.0 = 0x3C00, -2.0 = 0xC000, 2^-24 (smallest subnormal) = 0x0001, 65504 = 0x7BFF.
    // BF16: 0.5 = 0x3F00, -3.0 = 0xC040.
    const uint16_t f16[] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
    const uint16_t bf16[] = {0x3F00, 0xC040};
    const double f64[] = {0.25};
    std::string data(reinterpret_cast<const char*>(f16), 8);
    data += std::string(reinterpret_cast<const char*>(bf16), 4);
    data += std::string(reinterpret_cast<const char*>(f64), 8);
    write_bytes(p, raw_file(R"({"h":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},)"
                            R"("d":{"dtype":"F64","shape":[1],"data_offsets":[12,20]}})",
                            data));
    SafeTensorsFile f = SafeTensorsFile::open(p);
    EXPECT_EQ(f.read_f32("h"), (std::vector<float>{1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f}));
    EXPECT_EQ(f.read_f32("b"), (std::vector<float>{0.5f, -3.0f}));
    EXPECT_EQ(f.read_f32("d"), (std::vector<float>{0.25f}));
    std::string msg = error_of([&] { f.read_i32("h"); });
    EXPECT_CONTAINS(msg, "tensor 'h' has dtype F16, expected an integer dtype");
}

TEST(SafeTensors, ReadsI64AsI32AndRejectsValuesOutsideInt32) {
    TempDir dir;
    const std::string p = dir.file("i.safetensors");
    const int64_t v[] = {3, -4, int64_t(1) << 40};
    write_bytes(p, raw_file(R"({"ok":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                            R"("big":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})",
                            std::string(reinterpret_cast<const char*>(v), 24)));
    SafeTensorsFile f = SafeTensorsFile::open(p);
    EXPECT_EQ(f.read_i32("ok"), (std::vector<int32_t>{3, -4}));
    std::string msg = error_of([&] { f.read_i32("big"); });
    EXPECT_CONTAINS(msg, "tensor 'big' element 0 is 1099511627776, which does not fit in int32");
    EXPECT_CONTAINS(error_of([&] { f.read_f32("ok"); }),
                    "tensor 'ok' has dtype I64, expected a "
                    "floating-point dtype");
}

TEST(SafeTensors, RejectsMissingFileNamingIt) {
    std::string msg = error_of([] { SafeTensorsFile::open("/nonexistent/x.safetensors"); });
    EXPECT_CONTAINS(msg, "/nonexistent/x.safetensors: cannot open");
}

TEST(SafeTensors, RejectsFileShorterThanTheHeaderLength) {
    TempDir dir;
    const std::string p = dir.file("short.safetensors");
    write_bytes(p, "abc");
    std::string msg = error_of([&] { SafeTensorsFile::open(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "file is 3 bytes, shorter than the 8-byte header length");
}

TEST(SafeTensors, RejectsHeaderLengthBeyondTheFile) {
    TempDir dir;
    const std::string p = dir.file("len.safetensors");
    std::string f =
        raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32_bytes({1}));
    const uint64_t huge = 1000000;
    std::memcpy(f.data(), &huge, 8);
    write_bytes(p, f);
    std::string msg = error_of([&] { SafeTensorsFile::open(p); });
    EXPECT_CONTAINS(msg, "header length field says 1000000 bytes but only");
    EXPECT_CONTAINS(msg, "truncated");
}

TEST(SafeTensors, RejectsAHeaderThatIsNotJson) {
    TempDir dir;
    const std::string p = dir.file("json.safetensors");
    write_bytes(p, raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})",  // no '}'
                            f32_bytes({1})));
    std::string msg = error_of([&] { SafeTensorsFile::open(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "header is not valid JSON");
}

TEST(SafeTensors, RejectsAHeaderThatIsNotAnObject) {
    TempDir dir;
    const std::string p = dir.file("arr.safetensors");
    write_bytes(p, raw_file("[1, 2]", ""));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "the header is a JSON array, expected an object");
}

TEST(SafeTensors, RejectsUnknownDtypeNamingTheTensor) {
    TempDir dir;
    const std::string p = dir.file("dt.safetensors");
    write_bytes(
        p, raw_file(R"({"w":{"dtype":"F24","shape":[1],"data_offsets":[0,4]}})", f32_bytes({1})));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "tensor 'w' has unknown dtype \"F24\"");
}

TEST(SafeTensors, RejectsByteSizeThatDoesNotMatchTheShape) {
    TempDir dir;
    const std::string p = dir.file("size.safetensors");
    write_bytes(p, raw_file(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
                            f32_bytes({1, 2, 3})));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "tensor 'w' has 12 data bytes but F32 [2, 2] needs 16 (4 x 4)");
}

TEST(SafeTensors, RejectsMissingFields) {
    TempDir dir;
    const std::string p = dir.file("fields.safetensors");
    write_bytes(p, raw_file(R"({"w":{"dtype":"F32","shape":[1]}})", ""));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "tensor 'w' needs \"data_offsets\": [begin, end]");
    write_bytes(p, raw_file(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", ""));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "expected non-negative integer dimensions");
}

TEST(SafeTensors, RejectsTruncatedData) {
    TempDir dir;
    const std::string p = dir.file("trunc.safetensors");
    SafeTensorsWriter w;
    w.add_f32("a", {4}, std::vector<float>{1, 2, 3, 4});
    w.add_f32("b", {4}, std::vector<float>{5, 6, 7, 8});
    w.write(p);
    std::string bytes = read_bytes(p);
    write_bytes(p, bytes.substr(0, bytes.size() - 5));
    std::string msg = error_of([&] { SafeTensorsFile::open(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "tensor 'b' ends at data byte 32 but the data region is only 27 bytes");
    EXPECT_CONTAINS(msg, "truncated");
}

TEST(SafeTensors, RejectsTheFileTruncatedAtEveryLength) {
    TempDir dir;
    const std::string p = dir.file("t.safetensors");
    SafeTensorsWriter w;
    w.add_f32("a", {3}, std::vector<float>{1, 2, 3});
    w.add_i32("b", {2}, std::vector<int32_t>{4, 5});
    w.set_metadata("k", "v");
    w.write(p);
    const std::string bytes = read_bytes(p);
    for (size_t len = 0; len < bytes.size(); ++len) {
        write_bytes(p, bytes.substr(0, len));
        SCOPED_TRACE("truncated to " + std::to_string(len) + " of " + std::to_string(bytes.size()) +
                     " bytes");
        EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }), p);
    }
}

TEST(SafeTensors, CorruptedHeaderBytesGiveAnErrorOrAValidFileNeverACrash) {
    TempDir dir;
    const std::string p = dir.file("c.safetensors");
    SafeTensorsWriter w;
    w.add_f32("weight", {2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
    w.add_f32("bias", {3}, std::vector<float>{7, 8, 9});
    w.write(p);
    const std::string bytes = read_bytes(p);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    std::mt19937 rng(11);
    int rejected = 0;
    for (int trial = 0; trial < 2000; ++trial) {
        std::string b = bytes;
        const int flips = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < flips; ++k) b[8 + rng() % n] = static_cast<char>(rng() % 128);
        write_bytes(p, b);
        try {
            SafeTensorsFile f = SafeTensorsFile::open(p);
            // Still structurally valid: every tensor must then be readable within the file.
            for (const auto& t : f.tensors()) EXPECT_LE(t.end, b.size() - 8 - n) << t.name;
        } catch (const CheckpointError& e) {
            ++rejected;
            EXPECT_CONTAINS(e.what(), p);
        }
    }
    EXPECT_GT(rejected, 1000) << "most random corruptions of the header must be detected";
}

TEST(SafeTensors, RejectsOverlappingTensors) {
    TempDir dir;
    const std::string p = dir.file("overlap.safetensors");
    write_bytes(p, raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            f32_bytes({1, 2, 3})));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "tensor 'b' data [4, 12) overlaps tensor 'a' [0, 8)");
}

TEST(SafeTensors, RejectsGapsAndTrailingBytes) {
    TempDir dir;
    const std::string p = dir.file("gap.safetensors");
    write_bytes(p, raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                            f32_bytes({1, 2, 3})));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "data bytes [4, 8) before tensor 'b' belong to no tensor");
    write_bytes(p, raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                            f32_bytes({1, 2})));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "the data region is 8 bytes but the tensors cover only 4");
}

TEST(SafeTensors, RejectsNonStringMetadata) {
    TempDir dir;
    const std::string p = dir.file("meta.safetensors");
    write_bytes(p, raw_file(R"({"__metadata__":{"n_layer":2}})", ""));
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(p); }),
                    "__metadata__ \"n_layer\" is a JSON number, expected a string");
}

// ---- model checkpoints ------------------------------------------------------------------

GPTConfig tiny() {
    return *gpt_preset("tiny");
}

// A model, its optimizer and a fixed batch on a fresh CPU backend.
struct Rig {
    std::unique_ptr<Backend> backend = create_backend(BackendKind::cpu);
    GPT model;
    AdamW opt;
    DeviceBuffer in, tg;
    int B = 2, T = 8;
    explicit Rig(const GPTConfig& c, AdamWConfig oc = {}) : model(*backend, c), opt(model, oc) {
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
    void train_step() {
        model.zero_grad();
        model.forward(in.as<int>(), tg.as<int>(), B, T);
        model.backward();
        opt.step();
    }
};

// The tensors of a model as an editable list, to write checkpoints with one thing wrong.
struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> data;
    bool as_i32 = false;
};
std::vector<Entry> model_entries(GPT& model) {
    const auto params = model.get_params();
    std::vector<Entry> out;
    for (const auto& p : model.parameter_table().tensors())
        out.push_back(
            {p.name, p.shape,
             std::vector<float>(params.begin() + p.offset, params.begin() + p.offset + p.count)});
    return out;
}
Entry* find(std::vector<Entry>& es, const std::string& name) {
    for (auto& e : es)
        if (e.name == name) return &e;
    return nullptr;
}
void write_entries(const std::string& path, const std::vector<Entry>& es, const GPTConfig* c,
                   const std::map<std::string, std::string>& extra_meta = {}) {
    SafeTensorsWriter w;
    for (const auto& e : es) {
        if (e.as_i32)
            w.add_i32(e.name, e.shape, std::vector<int32_t>(e.data.begin(), e.data.end()));
        else
            w.add_f32(e.name, e.shape, std::span<const float>(e.data));
    }
    if (c) {
        w.set_metadata("n_layer", std::to_string(c->n_layer));
        w.set_metadata("n_head", std::to_string(c->n_head));
        w.set_metadata("n_embd", std::to_string(c->n_embd));
        w.set_metadata("vocab_size", std::to_string(c->vocab_size));
        w.set_metadata("max_seq_len", std::to_string(c->max_seq_len));
    }
    for (const auto& [k, v] : extra_meta) w.set_metadata(k, v);
    w.write(path);
}
std::vector<float> causal_mask(int S) {
    std::vector<float> m(static_cast<size_t>(S) * S);
    for (int i = 0; i < S; ++i)
        for (int j = 0; j < S; ++j) m[static_cast<size_t>(i) * S + j] = j <= i ? 1.0f : 0.0f;
    return m;
}

TEST(Checkpoint, RoundTripsParamsOptimizerStateAndStep) {
    TempDir dir;
    const std::string p = dir.file("ckpt.safetensors");
    AdamWConfig oc;
    oc.lr = 1e-3f;
    Rig a(tiny(), oc);
    a.train_step();
    a.train_step();
    save_checkpoint(p, a.model, &a.opt, {{"note", "hello"}});

    SafeTensorsFile f = SafeTensorsFile::open(p);
    EXPECT_EQ(*f.metadata_value("step"), "2");
    EXPECT_EQ(*f.metadata_value("n_layer"), "2");
    EXPECT_EQ(*f.metadata_value("n_head"), "4");
    EXPECT_EQ(*f.metadata_value("note"), "hello");
    EXPECT_NE(f.find("optim.m.transformer.h.1.mlp.c_fc.weight"), nullptr);
    EXPECT_NE(f.find("optim.v.transformer.ln_f.bias"), nullptr);
    EXPECT_EQ(read_checkpoint_config(p), tiny());

    Rig b(read_checkpoint_config(p), oc);  // different init (same seed, then overwritten)
    b.model.init_weights(999);
    CheckpointLoadInfo info = load_checkpoint(p, b.model, &b.opt);
    EXPECT_TRUE(info.has_optimizer_state);
    EXPECT_EQ(info.step, 2);
    EXPECT_EQ(info.wte_rows, 256);
    EXPECT_EQ(b.model.get_params(), a.model.get_params());
    EXPECT_EQ(b.opt.get_m(), a.opt.get_m());
    EXPECT_EQ(b.opt.get_v(), a.opt.get_v());
    EXPECT_EQ(b.opt.steps_taken(), 2);
    // Restored state continues training bitwise identically (bias correction uses the step).
    a.train_step();
    b.train_step();
    EXPECT_EQ(b.model.get_params(), a.model.get_params());
}

TEST(Checkpoint, WeightsOnlyCheckpointLoadsWithoutOptimizerAndIsRefusedWithOne) {
    TempDir dir;
    const std::string p = dir.file("w.safetensors");
    Rig a(tiny());
    save_checkpoint(p, a.model, nullptr);
    EXPECT_EQ(SafeTensorsFile::open(p).metadata_value("step"), nullptr);
    Rig b(tiny());
    b.model.init_weights(3);
    CheckpointLoadInfo info = load_checkpoint(p, b.model, nullptr);
    EXPECT_FALSE(info.has_optimizer_state);
    EXPECT_EQ(b.model.get_params(), a.model.get_params());
    std::string msg = error_of([&] { load_checkpoint(p, b.model, &b.opt); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "has no optimizer state");
}

TEST(Checkpoint, SaveRefusesExtraMetadataOverridingTheConfig) {
    TempDir dir;
    Rig a(tiny());
    EXPECT_CONTAINS(
        error_of([&] {
            save_checkpoint(dir.file("x.safetensors"), a.model, nullptr, {{"n_head", "8"}});
        }),
        "may not override \"n_head\"");
}

TEST(Checkpoint, RejectsMissingTensorNamingFileTensorAndExpectedShape) {
    TempDir dir;
    const std::string p = dir.file("missing.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    es.erase(es.begin() + 20);  // some tensor in the middle
    const std::string gone = model_entries(a.model)[20].name;
    write_entries(p, es, &a.model.config());
    const auto before = a.model.get_params();
    std::string msg = error_of([&] { load_checkpoint(p, a.model); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "missing tensor '" + gone + "' (expected F32 ");
    EXPECT_EQ(a.model.get_params(), before) << "a failed load must leave the model untouched";
}

TEST(Checkpoint, RejectsWrongShapeAndHintsAtTransposedWeights) {
    TempDir dir;
    const std::string p = dir.file("shape.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    find(es, "transformer.h.1.mlp.c_fc.weight")->shape = {64, 256};  // (in, out): HF Conv1D
    write_entries(p, es, &a.model.config());
    std::string msg = error_of([&] { load_checkpoint(p, a.model); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg,
                    "tensor 'transformer.h.1.mlp.c_fc.weight' has shape [64, 256], expected "
                    "F32 [256, 64]");
    EXPECT_CONTAINS(msg, "transposed");

    es = model_entries(a.model);
    find(es, "transformer.ln_f.bias")->shape = {8, 8};
    write_entries(p, es, &a.model.config());
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(p, a.model); }),
                    "tensor 'transformer.ln_f.bias' has shape [8, 8], expected F32 [64]");
}

TEST(Checkpoint, RejectsWrongDtype) {
    TempDir dir;
    const std::string p = dir.file("dtype.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    find(es, "transformer.h.0.ln_1.weight")->as_i32 = true;
    write_entries(p, es, &a.model.config());
    std::string msg = error_of([&] { load_checkpoint(p, a.model); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "tensor 'transformer.h.0.ln_1.weight' has dtype I32, expected F32 [64]");
}

TEST(Checkpoint, RejectsUnknownTensor) {
    TempDir dir;
    const std::string p = dir.file("unknown.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    es.push_back({"transformer.h.0.attn.rotary.inv_freq", {8}, std::vector<float>(8, 1.0f)});
    write_entries(p, es, &a.model.config());
    std::string msg = error_of([&] { load_checkpoint(p, a.model); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "unknown tensor 'transformer.h.0.attn.rotary.inv_freq' F32 [8]");
    // A layer the model does not have is unknown too.
    es = model_entries(a.model);
    es.push_back({"transformer.h.2.ln_1.weight", {64}, std::vector<float>(64, 1.0f)});
    write_entries(p, es, nullptr, {{"n_head", "4"}});
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(p, a.model); }),
                    "unknown tensor 'transformer.h.2.ln_1.weight'");
}

TEST(Checkpoint, RejectsTruncatedFile) {
    TempDir dir;
    const std::string p = dir.file("trunc.safetensors");
    Rig a(tiny());
    save_checkpoint(p, a.model, &a.opt);
    const std::string bytes = read_bytes(p);
    write_bytes(p, bytes.substr(0, bytes.size() / 2));
    std::string msg = error_of([&] { load_checkpoint(p, a.model, &a.opt); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "truncated");
    write_bytes(p, bytes.substr(0, 6));
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(p, a.model); }), "shorter than the 8-byte");
}

TEST(Checkpoint, RejectsCorruptHeader) {
    TempDir dir;
    const std::string p = dir.file("corrupt.safetensors");
    Rig a(tiny());
    save_checkpoint(p, a.model, nullptr);
    std::string bytes = read_bytes(p);
    bytes[8 + 10] = '\x01';  // a control character inside the JSON
    bytes[8 + 11] = '{';
    write_bytes(p, bytes);
    std::string msg = error_of([&] { load_checkpoint(p, a.model); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "not valid JSON");
}

TEST(Checkpoint, RejectsConfigInMetadataThatDiffersFromTheModel) {
    TempDir dir;
    const std::string p = dir.file("cfg.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    GPTConfig other = tiny();
    other.n_head = 8;
    write_entries(p, es, &other);
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(p, a.model); }),
                    "the checkpoint is for n_head=8 but the model has n_head=4");
    write_entries(p, es, nullptr, {{"n_head", "four"}});
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "__metadata__ \"n_head\" is \"four\", expected an integer >= 1");
}

TEST(Checkpoint, AcceptsTiedLmHeadAndCausalMaskBuffersAsNanoGptSavesThem) {
    TempDir dir;
    const std::string p = dir.file("nano.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    es.push_back({"lm_head.weight", {256, 64}, find(es, "transformer.wte.weight")->data});
    for (int l = 0; l < 2; ++l) {
        es.push_back(
            {"transformer.h." + std::to_string(l) + ".attn.bias", {1, 1, 32, 32}, causal_mask(32)});
        es.push_back({"transformer.h." + std::to_string(l) + ".attn.masked_bias",
                      {},
                      std::vector<float>{-1e4f}});
    }
    write_entries(p, es, &a.model.config());
    Rig b(tiny());
    b.model.init_weights(77);
    load_checkpoint(p, b.model);
    EXPECT_EQ(b.model.get_params(), a.model.get_params());
}

TEST(Checkpoint, RejectsLmHeadThatDiffersFromWte) {
    TempDir dir;
    const std::string p = dir.file("untied.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    std::vector<float> head = find(es, "transformer.wte.weight")->data;
    head[3 * 64 + 5] += 0.5f;
    es.push_back({"lm_head.weight", {256, 64}, head});
    write_entries(p, es, &a.model.config());
    std::string msg = error_of([&] { load_checkpoint(p, a.model); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg,
                    "tensor 'lm_head.weight' differs from transformer.wte.weight (first at "
                    "row 3, column 5");
    EXPECT_CONTAINS(msg, "untied");
}

TEST(Checkpoint, RejectsAMaskBufferThatIsNotCausal) {
    TempDir dir;
    const std::string p = dir.file("mask.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    auto mask = causal_mask(32);
    mask[2 * 32 + 7] = 1.0f;  // row 2 sees position 7: not causal
    es.push_back({"transformer.h.1.attn.bias", {1, 1, 32, 32}, mask});
    write_entries(p, es, &a.model.config());
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(p, a.model); }),
                    "tensor 'transformer.h.1.attn.bias' is not the causal mask tril(ones(32, 32)): "
                    "element (2, 7)");
}

TEST(Checkpoint, AcceptsUnpaddedWteAndPadsItWithZeros) {
    TempDir dir;
    const std::string p = dir.file("v200.safetensors");
    GPTConfig c = tiny();
    c.vocab_size = 200;  // padded to 256 rows in the model
    Rig a(c);
    auto es = model_entries(a.model);
    Entry* wte = find(es, "transformer.wte.weight");
    ASSERT_EQ(wte->shape, (std::vector<int64_t>{256, 64}));
    wte->shape = {200, 64};
    wte->data.resize(200 * 64);
    es.push_back({"lm_head.weight", {200, 64}, wte->data});
    write_entries(p, es, &c);
    EXPECT_EQ(read_checkpoint_config(p), c);

    Rig b(c);  // its own init has non-zero padding rows? The loader must zero them.
    CheckpointLoadInfo info = load_checkpoint(p, b.model);
    EXPECT_EQ(info.wte_rows, 200);
    const auto got = b.model.get_params();
    const auto want = a.model.get_params();
    for (size_t i = 0; i < 200 * 64; ++i) ASSERT_EQ(got[i], want[i]) << i;
    for (size_t i = 200 * 64; i < 256 * 64; ++i) ASSERT_EQ(got[i], 0.0f) << i;
    // Any other row count is a shape error that names both accepted shapes.
    wte->shape = {100, 64};
    wte->data.resize(100 * 64);
    es.pop_back();
    write_entries(p, es, &c);
    EXPECT_CONTAINS(error_of([&] { load_checkpoint(p, b.model); }),
                    "tensor 'transformer.wte.weight' has shape [100, 64], expected F32 [256, 64] "
                    "or [200, 64] (unpadded)");
}

// A run with optim.freeze saved moments for the tensors it trained only; a model that trains
// every tensor (`step --weights`, a start from those weights) loads its weights all the same,
// and only restoring an optimizer from it is refused.
TEST(Checkpoint, WeightsOfAFreezeRunLoadIntoAModelThatTrainsEverything) {
    TempDir dir;
    const std::string p = dir.file("frozen.safetensors");
    auto backend = create_backend(BackendKind::cpu);
    ModelOptions frozen;
    frozen.trainable.freeze = {"wte", "h.0"};
    GPT a(*backend, tiny(), frozen);
    a.init_weights(7);
    AdamW a_opt(a, AdamWConfig{});
    save_checkpoint(p, a, &a_opt);
    ASSERT_EQ(SafeTensorsFile::open(p).find("optim.m.transformer.wte.weight"), nullptr);
    Rig b(tiny());
    CheckpointLoadInfo info = load_checkpoint(p, b.model, nullptr);
    EXPECT_TRUE(info.has_optimizer_state);
    EXPECT_EQ(b.model.get_params(), a.get_params());
    std::string msg = error_of([&] { load_checkpoint(p, b.model, &b.opt); });
    EXPECT_CONTAINS(msg, "missing tensor 'optim.m.transformer.wte.weight'");
}

TEST(Checkpoint, RejectsPartialOptimizerState) {
    TempDir dir;
    const std::string p = dir.file("partial.safetensors");
    Rig a(tiny());
    auto es = model_entries(a.model);
    for (const auto& e : model_entries(a.model))
        es.push_back({"optim.m." + e.name, e.shape, std::vector<float>(e.data.size(), 0.0f)});
    write_entries(p, es, &a.model.config(), {{"step", "3"}});
    std::string msg = error_of([&] { load_checkpoint(p, a.model, &a.opt); });
    EXPECT_CONTAINS(msg, "missing tensor 'optim.v.transformer.wte.weight'");
}

TEST(Checkpoint, ConfigIsInferredFromShapesExceptNHeadWhichIsRequired) {
    TempDir dir;
    const std::string p = dir.file("nometa.safetensors");
    GPTConfig c = tiny();
    c.vocab_size = 200;
    c.max_seq_len = 24;
    c.n_layer = 3;
    Rig a(c);
    auto es = model_entries(a.model);
    Entry* wte = find(es, "transformer.wte.weight");
    wte->shape = {200, 64};
    wte->data.resize(200 * 64);
    write_entries(p, es, nullptr, {{"n_head", "4"}});
    EXPECT_EQ(read_checkpoint_config(p), c);
    write_entries(p, es, nullptr);
    std::string msg = error_of([&] { read_checkpoint_config(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "no __metadata__ \"n_head\"");
    EXPECT_CONTAINS(msg, "cannot be inferred");
}

// The committed fixtures were written by PyTorch (tools/make_reference.py) from a nanoGPT
// module's state_dict, including lm_head.weight and the attn.bias buffers.
TEST(Checkpoint, LoadsAStateDictWrittenByPyTorch) {
    const std::string p = std::string(MT_TEST_DATA_DIR) + "/tiny_weights.safetensors";
    SafeTensorsFile f = SafeTensorsFile::open(p);
    ASSERT_NE(f.find("lm_head.weight"), nullptr);
    ASSERT_NE(f.find("transformer.h.1.attn.bias"), nullptr);
    const GPTConfig c = read_checkpoint_config(f);
    EXPECT_EQ(c, tiny());
    auto backend = create_backend(BackendKind::cpu);
    GPT model(*backend, c);
    load_checkpoint(f, model);
    const auto params = model.get_params();
    const auto& lnw = model.parameter_table().at("transformer.h.0.ln_1.weight");
    EXPECT_EQ(
        std::vector<float>(params.begin() + lnw.offset, params.begin() + lnw.offset + lnw.count),
        f.read_f32("transformer.h.0.ln_1.weight"));
}

TEST(Checkpoint, LoadsAPyTorchStateDictWithUnpaddedVocab) {
    const std::string p = std::string(MT_TEST_DATA_DIR) + "/tiny_v200_weights.safetensors";
    const GPTConfig c = read_checkpoint_config(p);
    EXPECT_EQ(c.vocab_size, 200);
    EXPECT_EQ(c.padded_vocab_size(), 256);
    auto backend = create_backend(BackendKind::cpu);
    GPT model(*backend, c);
    CheckpointLoadInfo info = load_checkpoint(p, model);
    EXPECT_EQ(info.wte_rows, 200);
    const auto params = model.get_params();
    for (size_t i = 200 * 32; i < 256 * 32; ++i) ASSERT_EQ(params[i], 0.0f);
}

// ---- hostile files: what the fuzzers and issue #12 found ------------------------------------

// A file rewritten in place after open() (another process truncating it) used to be a mapped
// file that gave SIGBUS on the next read; tensors are now read with pread, which sees the
// shorter file and says so.
TEST(SafeTensors, AFileTruncatedAfterItWasOpenedIsAnErrorNotSigbus) {
    TempDir dir;
    const std::string p = dir.file("shrinks.safetensors");
    SafeTensorsWriter w;
    w.add_f32("a", {4}, std::vector<float>{1, 2, 3, 4});
    w.add_f32("b", {1024}, std::vector<float>(1024, 0.5f));
    w.write(p);
    const SafeTensorsFile f = SafeTensorsFile::open(p);
    fs::resize_file(p, fs::file_size(p) - 1000);
    EXPECT_EQ(f.read_f32("a"), (std::vector<float>{1, 2, 3, 4}));  // still within the file
    const std::string msg = error_of([&] { f.read_f32("b"); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "tensor 'b'");
    EXPECT_CONTAINS(msg, "the file is shorter than when it was opened");
    fs::resize_file(p, 0);
    EXPECT_CONTAINS(error_of([&] { f.read_raw(f.at("a")); }),
                    "reading tensor 'a' (bytes [128, 144)) got only 0 of 16 bytes");
}

// A FIFO (or a directory) given as a safetensors file is rejected at once, not waited on.
TEST(SafeTensors, AFifoIsRejectedWithoutWaitingForAWriter) {
    TempDir dir;
    const std::string p = dir.file("fifo.safetensors");
    ASSERT_EQ(mkfifo(p.c_str(), 0600), 0) << std::strerror(errno);
    EXPECT_CONTAINS(
        error_of([&] { SafeTensorsFile::open(p); }),
        p + ": is a FIFO (named pipe), not a regular file: expected a safetensors file");
    EXPECT_CONTAINS(error_of([&] { SafeTensorsFile::open(dir.path().string()); }),
                    "not a regular file");
}

// A file replaced by rename (how microtrain writes files) keeps being read from the old file.
TEST(SafeTensors, AFileReplacedAfterItWasOpenedIsStillReadWhole) {
    TempDir dir;
    const std::string p = dir.file("replaced.safetensors");
    SafeTensorsWriter w;
    w.add_f32("a", {3}, std::vector<float>{1, 2, 3});
    w.write(p);
    const SafeTensorsFile f = SafeTensorsFile::open(p);
    SafeTensorsWriter other;
    other.add_f32("z", {1}, std::vector<float>{9});
    other.write(p);
    EXPECT_EQ(f.read_f32("a"), (std::vector<float>{1, 2, 3}));
}

// Error messages quote the offending JSON briefly: a deeply nested shape must not recurse once
// per level (dump() did, which could exhaust the stack on a large header).
TEST(SafeTensors, RejectsADeeplyNestedShapeWithoutQuotingItWhole) {
    TempDir dir;
    const std::string p = dir.file("nested.safetensors");
    const std::string nested = std::string(200000, '[') + std::string(200000, ']');
    write_bytes(
        p, raw_file("{\"x\":{\"dtype\":\"F32\",\"shape\":" + nested + ",\"data_offsets\":[0,0]}}",
                    ""));
    const std::string msg = error_of([&] { SafeTensorsFile::open(p); });
    EXPECT_CONTAINS(msg, "tensor 'x' has shape [[...]], expected non-negative integer dimensions");
    EXPECT_LT(msg.size(), 400u);
}

// The metadata may not claim a model larger than its tensors (issue #12: n_layer 10^6, n_embd
// 10^6 or max_seq_len 2^31 made `step` allocate terabytes): read_checkpoint_config checks every
// dimension against the tensors before a model of that size exists.
TEST(Checkpoint, MetadataDimensionsThatTheTensorsDoNotHaveAreRejected) {
    TempDir dir;
    const std::string p = dir.file("claims.safetensors");
    Rig a(tiny());
    const auto es = model_entries(a.model);
    const GPTConfig c = tiny();
    // Beyond GPTConfig's bounds: refused as an invalid config, naming the bound.
    write_entries(p, es, &c, {{"n_layer", "1000000"}});
    std::string msg = error_of([&] { read_checkpoint_config(p); });
    EXPECT_CONTAINS(msg, p);
    EXPECT_CONTAINS(msg, "n_layer must be in [1, 1024], got 1000000");
    write_entries(p, es, &c, {{"n_embd", "1000000"}, {"n_head", "1"}});
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "n_embd must be in [1, 65536], got 1000000");
    write_entries(p, es, &c, {{"max_seq_len", "2147483647"}});
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "max_seq_len must be in [1, 1048576], got 2147483647");
    write_entries(p, es, &c, {{"max_seq_len", "2147483648"}});
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "__metadata__ \"max_seq_len\" is \"2147483648\", expected an integer >= 1");
    write_entries(p, es, &c, {{"vocab_size", "2147483600"}});
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "vocab_size must be in [2, 16777216], got 2147483600");
    // Within the bounds but not what the tensors hold: refused against the tensors.
    write_entries(p, es, &c, {{"n_layer", "1000"}});
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "n_layer=1000 but the file holds tensors of 2 layers");
    write_entries(p, es, &c, {{"n_embd", "8192"}, {"n_head", "1"}});
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "tensor 'transformer.wte.weight' has shape [256, 64], expected F32 "
                    "[256, 8192]");
    write_entries(p, es, &c, {{"max_seq_len", "1048576"}});
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "tensor 'transformer.wpe.weight' has shape [32, 64], expected F32 "
                    "[1048576, 64]");
}

// A layer's tensors missing, or an extra layer, is caught by read_checkpoint_config too.
TEST(Checkpoint, ConfigIsRejectedWhenAParameterItImpliesIsMissing) {
    TempDir dir;
    const std::string p = dir.file("gap.safetensors");
    Rig a(tiny());
    std::vector<Entry> es = model_entries(a.model);
    const GPTConfig c = tiny();
    std::erase_if(es, [](const Entry& e) { return e.name == "transformer.h.1.mlp.c_fc.bias"; });
    write_entries(p, es, &c);
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "missing tensor 'transformer.h.1.mlp.c_fc.bias' (expected F32 [256])");
    es = model_entries(a.model);
    es.push_back({"transformer.h.7.ln_1.weight", {64}, std::vector<float>(64, 1.0f)});
    write_entries(p, es, &c);
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "n_layer=2 but the file holds tensors of 3 layers (transformer.h.N with N "
                    "from 0 to 7)");
}

// A dimension beyond int in a shape the config is inferred from is an error, not a truncation.
TEST(Checkpoint, InferredDimensionsBeyondIntAreRejected) {
    TempDir dir;
    const std::string p = dir.file("wide.safetensors");
    write_bytes(p, raw_file("{\"__metadata__\":{\"n_head\":\"1\"},\"transformer.wte.weight\":"
                            "{\"dtype\":\"F32\",\"shape\":[4294967298,0],\"data_offsets\":[0,0]}}",
                            ""));
    EXPECT_CONTAINS(error_of([&] { read_checkpoint_config(p); }),
                    "dimension 0 (vocab_size) does not fit in a 32-bit int");
}

}  // namespace
}  // namespace mt
