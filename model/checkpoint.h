// safetensors files and model checkpoints.
//
// The safetensors format (https://github.com/huggingface/safetensors):
//   bytes [0, 8)         N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8+N)       a JSON object: { "<tensor>": {"dtype": "F32", "shape": [d0, d1, ...],
//                        "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v", ...} }
//                        (may be padded with trailing spaces)
//   bytes [8+N, EOF)     the data region: each tensor's raw little-endian, row-major bytes at
//                        [begin, end) relative to the region start. Tensors cover the region
//                        contiguously without overlap; end - begin = prod(shape) * dtype size.
//
// Model checkpoints use nanoGPT's state_dict names (model/gpt.h ParameterTable) for the weights,
// `optim.m.<name>` / `optim.v.<name>` for the AdamW moments, and __metadata__ keys n_layer,
// n_head, n_embd, vocab_size, max_seq_len and step (decimal strings). A nanoGPT state_dict
// saved from PyTorch loads too: its tied `lm_head.weight`, its causal-mask buffers
// `transformer.h.N.attn.bias` (and HF's `attn.masked_bias`) are accepted, and its wte of exactly
// vocab_size rows is padded with zero rows to padded_vocab_size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/gpt.h"

namespace mt {

class AdamW;

// Every checkpoint / safetensors error: the message names the file, the tensor (or key), and
// what was expected.
struct CheckpointError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

enum class DType { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64 };
const char* to_string(DType);
size_t dtype_size(DType);

struct TensorEntry {
    std::string name;
    DType dtype = DType::F32;
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0;  // byte offsets into the data region
    size_t numel() const;
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[3, 64]"

// A parsed, validated safetensors file, memory-mapped read-only (nothing is copied until a
// tensor is read). open() checks the whole structure up front: header length vs file size, JSON
// syntax, entry fields, known dtypes, byte size = prod(shape) * dtype size, offsets within the
// data region, no overlap, contiguous coverage of the region.
class SafeTensorsFile {
  public:
    static SafeTensorsFile open(const std::string& path);  // throws CheckpointError
    SafeTensorsFile(SafeTensorsFile&&) noexcept;
    SafeTensorsFile& operator=(SafeTensorsFile&&) noexcept;
    ~SafeTensorsFile();

    const std::string& path() const { return path_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // Metadata value or nullptr.
    const std::string* metadata_value(const std::string& key) const;
    // Tensors in data-offset order.
    const std::vector<TensorEntry>& tensors() const { return tensors_; }
    const TensorEntry* find(const std::string& name) const;  // nullptr if absent
    const TensorEntry& at(const std::string& name) const;    // throws CheckpointError

    // The tensor's raw bytes (valid while this object lives).
    std::span<const std::byte> raw(const TensorEntry& t) const;
    // The tensor as fp32. Accepts the floating dtypes F32 (copied), F16, BF16 and F64
    // (converted); any other dtype is an error naming the tensor.
    std::vector<float> read_f32(const std::string& name) const;
    void read_f32_into(const TensorEntry& t, float* dst) const;
    // The tensor as int32. Accepts I32, and I64 / I16 / I8 / U8 / U16 / U32 with every value
    // checked to fit in int32 (PyTorch's default integer dtype is int64).
    std::vector<int32_t> read_i32(const std::string& name) const;
    // Any numeric dtype widened to double (for checks such as the causal-mask buffer).
    std::vector<double> read_f64(const TensorEntry& t) const;

  private:
    SafeTensorsFile() = default;
    struct Mapping;
    std::string path_;
    std::unique_ptr<Mapping> map_;
    const std::byte* data_ = nullptr;  // start of the data region
    size_t data_size_ = 0;
    std::vector<TensorEntry> tensors_;
    std::map<std::string, size_t> index_;
    std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file and writes it atomically: a temporary file in the target's
// directory, fsync, rename over the target, fsync of the directory. A crash leaves either the
// old file or the new one, never a half-written one.
class SafeTensorsWriter {
  public:
    // Non-owning: `data` must stay valid until write() returns. numel(shape) elements.
    void add_f32(const std::string& name, std::vector<int64_t> shape, std::span<const float> data);
    void add_i32(const std::string& name, std::vector<int64_t> shape,
                 std::span<const int32_t> data);
    // Owning variants: the writer keeps the vector.
    void add_f32(const std::string& name, std::vector<int64_t> shape, std::vector<float>&& data);
    void add_i32(const std::string& name, std::vector<int64_t> shape, std::vector<int32_t>&& data);
    void set_metadata(const std::string& key, const std::string& value);
    // Throws CheckpointError (naming the path and the OS error) on failure; the target is then
    // untouched and no temporary file is left behind.
    void write(const std::string& path) const;

  private:
    struct Item {
        std::string name;
        DType dtype;
        std::vector<int64_t> shape;
        std::span<const std::byte> bytes;
    };
    void add(const std::string& name, DType dtype, std::vector<int64_t> shape,
             std::span<const std::byte> bytes);
    std::vector<Item> items_;
    std::vector<std::shared_ptr<void>> owned_;
    std::map<std::string, std::string> metadata_;
};

// ---- model checkpoints ----------------------------------------------------------------------

// The model config a checkpoint describes. From __metadata__ (n_layer, n_head, n_embd,
// vocab_size, max_seq_len) where present; a missing key is inferred from tensor shapes where that
// is unambiguous (n_embd and vocab_size from wte: a nanoGPT wte has exactly vocab_size rows;
// max_seq_len from wpe; n_layer from the transformer.h.N indices). n_head cannot be inferred
// from shapes and is required. Metadata and shapes that disagree are an error. The result is
// validated (GPTConfig::validate).
GPTConfig read_checkpoint_config(const SafeTensorsFile& file);
GPTConfig read_checkpoint_config(const std::string& path);

// Writes the model's parameters (nanoGPT names, the model's shapes: wte padded to
// padded_vocab_size rows), the config in __metadata__, and when `opt` is given its moments as
// optim.m.<name> / optim.v.<name> and its step count as __metadata__ "step". `extra` adds
// metadata (it may not override the config keys or "step"). Atomic (see SafeTensorsWriter).
void save_checkpoint(const std::string& path, GPT& model, AdamW* opt,
                     const std::map<std::string, std::string>& extra = {});

struct CheckpointLoadInfo {
    int64_t wte_rows = 0;              // rows of the file's wte: vocab_size (nanoGPT) or padded
    bool has_optimizer_state = false;  // the file holds optim.m.* / optim.v.*
    int step = 0;                      // __metadata__ "step" (0 if absent)
    std::map<std::string, std::string> metadata;
};

// Loads parameters into `model` (and, when `opt` is given, the AdamW moments and step, which
// must then all be present). Rejects: a config in the metadata that differs from the model's; a
// missing tensor; a wrong shape or a non-floating dtype; an unknown tensor; an lm_head.weight
// that is not equal to wte (microtrain ties them); a truncated or corrupt file. Accepts wte (and
// its optimizer moments) with vocab_size rows, padding to padded_vocab_size with zeros. Either
// everything loads or the model and optimizer are left untouched.
CheckpointLoadInfo load_checkpoint(const SafeTensorsFile& file, GPT& model, AdamW* opt = nullptr);
CheckpointLoadInfo load_checkpoint(const std::string& path, GPT& model, AdamW* opt = nullptr);

}  // namespace mt
