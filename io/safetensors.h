// The safetensors file format (https://github.com/huggingface/safetensors): a reader that
// validates the whole file before touching any tensor, and an atomic writer. microtrain uses it
// for checkpoints (checkpoint/checkpoint.h), for the batches and outputs of `microtrain step`, and
// for the PyTorch fixtures of the parity tests.
//
// Layout:
//   bytes [0, 8)         N, the header length, unsigned 64-bit little-endian
//   bytes [8, 8+N)       a JSON object: { "<tensor>": {"dtype": "F32", "shape": [d0, d1, ...],
//                        "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v", ...} }
//                        (may be padded with trailing spaces)
//   bytes [8+N, EOF)     the data region: each tensor's raw little-endian, row-major bytes at
//                        [begin, end) relative to the region start. Tensors cover the region
//                        contiguously without overlap; end - begin = prod(shape) * dtype size.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/enum_names.h"

namespace mt {

// Every safetensors error: the message names the file, the tensor (or key), and what was
// expected.
struct SafeTensorsError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The element type of a tensor in the file: the header's "dtype" field.
enum class SafeTensorsDType { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64 };

// The spellings the header uses (kernels/enum_names.h).
template <>
struct EnumSpelling<SafeTensorsDType> {
    static constexpr std::array<std::string_view, 13> names{
        "BOOL", "U8", "I8", "U16", "I16", "F16", "BF16", "U32", "I32", "F32", "U64", "I64", "F64"};
};

const char* to_string(SafeTensorsDType);  // "F32"
size_t dtype_size(SafeTensorsDType);      // bytes per element
bool is_floating(SafeTensorsDType);       // F16, BF16, F32 or F64

struct TensorEntry {
    std::string name;
    SafeTensorsDType dtype = SafeTensorsDType::F32;
    std::vector<int64_t> shape;
    size_t begin = 0, end = 0;  // byte offsets into the data region
    size_t numel() const;
};

std::string shape_string(const std::vector<int64_t>& shape);  // "[3, 64]"

// A parsed, validated safetensors file. open() reads and checks only the header; a tensor's
// bytes are read (pread) from the open file when asked for, so a file truncated while it is
// read gives an error naming it, never SIGBUS (why not mmap: safetensors.cpp). open() checks the
// whole structure up front: header length vs file size, JSON syntax, entry fields, known dtypes,
// byte size = prod(shape) * dtype size, offsets within the data region, no overlap, contiguous
// coverage of the region.
class SafeTensorsFile {
  public:
    static SafeTensorsFile open(const std::string& path);  // throws SafeTensorsError
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
    const TensorEntry& at(const std::string& name) const;    // throws SafeTensorsError

    // The tensor's raw bytes, read from the file. Every read throws SafeTensorsError naming the
    // file and the tensor if the file has become shorter since open().
    std::vector<std::byte> read_raw(const TensorEntry& t) const;
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
    struct File;
    // Reads t's bytes, checked against the data region, into dst (t.end - t.begin bytes).
    void read_bytes(const TensorEntry& t, void* dst) const;
    std::string path_;
    std::unique_ptr<File> file_;
    uint64_t data_offset_ = 0;  // file offset of the data region: 8 + header length
    size_t data_size_ = 0;
    std::vector<TensorEntry> tensors_;
    std::map<std::string, size_t> index_;
    std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file and writes it atomically: a temporary file in the target's
// directory, fsync, rename over the target, fsync of the directory (io/atomic_file.h). A crash
// leaves either the old file or the new one, never a half-written one.
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
    // Throws SafeTensorsError (naming the path and the OS error) on failure; the target is then
    // untouched and no temporary file is left behind.
    void write(const std::string& path) const;

  private:
    struct Item {
        std::string name;
        SafeTensorsDType dtype;
        std::vector<int64_t> shape;
        std::span<const std::byte> bytes;
    };
    void add(const std::string& name, SafeTensorsDType dtype, std::vector<int64_t> shape,
             std::span<const std::byte> bytes);
    std::vector<Item> items_;
    std::vector<std::shared_ptr<void>> owned_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace mt
