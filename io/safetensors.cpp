// The safetensors reader and writer. See safetensors.h for the file layout.
//
// Reading is validate-then-read: open() reads the header length and the JSON header, checks
// every entry (dtype, shape, byte size, offsets within the data region) and then that the
// entries tile the data region exactly. Only then may a tensor's bytes be read, so a corrupt or
// truncated file is an error naming what is wrong, never an out-of-bounds read.
//
// Tensor bytes are read with pread() from the descriptor open() keeps, straight into the
// caller's buffer, never through a memory mapping: a mapped file that is truncated while it is
// read (another process rewriting it in place) turns the next access into SIGBUS, which no check
// made at open() can prevent, whereas pread() simply returns fewer bytes, which becomes an error
// naming the file. A file replaced by rename (how microtrain writes every file) is not affected
// at all: the descriptor keeps the old file. The cost is one copy from the page cache, which the
// mapping's page faults paid too, and no double buffering: F32 tensors land in their destination.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/regular_file.h"

namespace mt {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader assumes a little-endian host");

namespace {

using DType = SafeTensorsDType;

// The reference implementation refuses headers above 100 MB; a longer length field means a
// corrupt file, and refusing it keeps a garbage length from becoming a giant allocation.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// A dimension above 2^40 cannot be real; refusing it keeps the size arithmetic far from overflow.
constexpr uint64_t kMaxDimension = 1ull << 40;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw SafeTensorsError(path + ": " + what);
}

// ---- element decoding -----------------------------------------------------------------------

// IEEE binary16 -> binary32, exact (every half is representable as a float).
float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;  // +-0
        } else {          // subnormal: renormalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | mant << 13;  // inf / nan
    } else {
        bits = sign | (exp + 127 - 15) << 23 | mant << 13;
    }
    return std::bit_cast<float>(bits);
}

float bf16_to_float(uint16_t b) {
    return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

template <class T>
T load_le(const std::byte* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));  // the data region need not be aligned
    return v;
}

// Element i of a tensor of dtype d as double (every dtype; 64-bit integers may round).
double element_f64(DType d, const std::byte* p, size_t i) {
    switch (d) {
        case DType::BOOL:
        case DType::U8:
            return static_cast<double>(load_le<uint8_t>(p + i));
        case DType::I8:
            return static_cast<double>(load_le<int8_t>(p + i));
        case DType::U16:
            return static_cast<double>(load_le<uint16_t>(p + 2 * i));
        case DType::I16:
            return static_cast<double>(load_le<int16_t>(p + 2 * i));
        case DType::F16:
            return half_to_float(load_le<uint16_t>(p + 2 * i));
        case DType::BF16:
            return bf16_to_float(load_le<uint16_t>(p + 2 * i));
        case DType::U32:
            return static_cast<double>(load_le<uint32_t>(p + 4 * i));
        case DType::I32:
            return static_cast<double>(load_le<int32_t>(p + 4 * i));
        case DType::F32:
            return load_le<float>(p + 4 * i);
        case DType::U64:
            return static_cast<double>(load_le<uint64_t>(p + 8 * i));
        case DType::I64:
            return static_cast<double>(load_le<int64_t>(p + 8 * i));
        case DType::F64:
            return load_le<double>(p + 8 * i);
    }
    return 0.0;
}

// ---- the steps of SafeTensorsFile::open -----------------------------------------------------

// Reads exactly n bytes at file offset `offset` into dst (`what` names them in an error). open()
// checked that the file held them; getting fewer now means it was truncated since.
void read_exact(const std::string& path, int fd, uint64_t offset, void* dst, size_t n,
                const std::string& what) {
    auto* out = static_cast<char*>(dst);
    size_t done = 0;
    while (done < n) {
        const size_t chunk = std::min<size_t>(n - done, size_t{1} << 30);
        const ssize_t got = ::pread(fd, out + done, chunk, static_cast<off_t>(offset + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0)
            fail(path, "cannot read " + what + " (bytes [" + std::to_string(offset) + ", " +
                           std::to_string(offset + n) + ")): " + std::strerror(errno));
        if (got == 0)
            fail(path, "reading " + what + " (bytes [" + std::to_string(offset) + ", " +
                           std::to_string(offset + n) + ")) got only " + std::to_string(done) +
                           " of " + std::to_string(n) +
                           " bytes: the file is shorter than when it was opened (truncated or "
                           "rewritten in place); replace files atomically (write a temporary "
                           "file, then rename it)");
        done += static_cast<size_t>(got);
    }
}

// A JSON value for an error message, bounded: scalars as they are, the first elements of an
// array or object with nested containers elided. (dump() of a deeply nested value recurses once
// per level and could exhaust the stack on a hostile header.)
std::string brief(const nlohmann::json& v) {
    if (!v.is_structured()) return v.dump();
    const bool array = v.is_array();
    std::string s = array ? "[" : "{";
    size_t i = 0;
    for (auto it = v.begin(); it != v.end(); ++it, ++i) {
        if (i == 8) {
            s += ", ...";
            break;
        }
        if (i) s += ", ";
        if (!array) s += nlohmann::json(it.key()).dump() + ": ";
        s += it->is_array() ? "[...]" : it->is_object() ? "{...}" : it->dump();
    }
    return s + (array ? "]" : "}");
}

// Where the header and the data region lie, for the checks and their messages.
struct FileLayout {
    size_t file_size = 0;
    uint64_t header_size = 0;  // N, the JSON header's length
    size_t data_size = 0;      // file_size - 8 - N
};

// The header length N from the first 8 bytes, checked against the file size.
uint64_t read_header_length(const std::string& path, int fd, size_t size) {
    if (size < 8)
        fail(path, "file is " + std::to_string(size) +
                       " bytes, shorter than the 8-byte header length every safetensors file "
                       "starts with (truncated, or not a safetensors file)");
    std::byte first[8];
    read_exact(path, fd, 0, first, 8, "the header length");
    const uint64_t n = load_le<uint64_t>(first);
    if (n > size - 8)
        fail(path, "the header length field says " + std::to_string(n) + " bytes but only " +
                       std::to_string(size - 8) +
                       " bytes follow it (truncated, or not a safetensors file)");
    if (n > kMaxHeaderBytes)
        fail(path, "the header length field says " + std::to_string(n) +
                       " bytes, more than the 100 MiB safetensors allows (corrupt file)");
    if (n < 2)
        fail(path, "the header is " + std::to_string(n) +
                       " bytes, too short for a JSON object (expected at least \"{}\")");
    return n;
}

// The JSON header at bytes [8, 8+n), which must be an object.
nlohmann::json parse_header_json(const std::string& path, int fd, uint64_t n) {
    std::string text(n, '\0');
    read_exact(path, fd, 8, text.data(), n, "the JSON header");
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail(path, "the " + std::to_string(n) + "-byte header is not valid JSON (" + e.what() +
                       "): the file is corrupt or not a safetensors file");
    }
    if (!header.is_object())
        fail(path, std::string("the header is a JSON ") + header.type_name() +
                       ", expected an object mapping tensor names to {dtype, shape, data_offsets}");
    return header;
}

// The "__metadata__" entry: null, or an object of string values.
void parse_metadata(const std::string& path, const nlohmann::json& v,
                    std::map<std::string, std::string>& metadata) {
    if (v.is_null()) return;
    if (!v.is_object())
        fail(path, std::string("__metadata__ is a JSON ") + v.type_name() +
                       ", expected an object of string values");
    for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
            fail(path, "__metadata__ \"" + m.key() + "\" is a JSON " + m.value().type_name() +
                           ", expected a string (safetensors metadata values are strings)");
        metadata[m.key()] = m.value().get<std::string>();
    }
}

// An entry's "dtype": a string spelling one of SafeTensorsDType.
DType parse_dtype_field(const std::string& path, const std::string& where,
                        const nlohmann::json& v) {
    auto d = v.find("dtype");
    if (d == v.end() || !d->is_string())
        fail(path, where + " has no string \"dtype\" (expected e.g. \"F32\")");
    const std::optional<DType> dtype = parse_enum<DType>(d->get<std::string>());
    if (!dtype)
        fail(path, where + " has unknown dtype \"" + d->get<std::string>() +
                       "\" (expected one of " + enum_choices<DType>(" ") + ")");
    return *dtype;
}

// An entry's "shape": an array of non-negative dimensions whose product fits in size_t.
// Returns the element count.
size_t parse_shape_field(const std::string& path, const std::string& where, const nlohmann::json& v,
                         std::vector<int64_t>& shape) {
    auto s = v.find("shape");
    if (s == v.end() || !s->is_array()) fail(path, where + " has no \"shape\" array");
    size_t numel = 1;
    for (const auto& dim : *s) {
        if (!dim.is_number_unsigned() || dim.get<uint64_t>() > kMaxDimension)
            fail(path,
                 where + " has shape " + brief(*s) + ", expected non-negative integer dimensions");
        const uint64_t dv = dim.get<uint64_t>();
        if (dv != 0 && numel > std::numeric_limits<size_t>::max() / dv)
            fail(path, where + " has shape " + brief(*s) + " whose size overflows");
        numel *= dv;
        shape.push_back(static_cast<int64_t>(dv));
    }
    return numel;
}

// An entry's "data_offsets" [begin, end): begin <= end, end - begin = numel * dtype size, and
// end within the data region.
void parse_data_offsets_field(const std::string& path, const std::string& where,
                              const nlohmann::json& v, size_t numel, const FileLayout& layout,
                              TensorEntry& t) {
    auto o = v.find("data_offsets");
    if (o == v.end() || !o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() ||
        !(*o)[1].is_number_unsigned())
        fail(path, where +
                       " needs \"data_offsets\": [begin, end] of non-negative integers, "
                       "got " +
                       (o == v.end() ? std::string("nothing") : brief(*o)));
    const uint64_t b = (*o)[0].get<uint64_t>(), e = (*o)[1].get<uint64_t>();
    if (b > e)
        fail(path, where + " has data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                       "] with begin > end");
    if (numel > kMaxDimension)
        fail(path, where + " has shape " + shape_string(t.shape) + " of " + std::to_string(numel) +
                       " elements, more than 2^40 (corrupt header)");
    const size_t want = numel * dtype_size(t.dtype);  // < 2^43: no overflow
    if (e - b != want)
        fail(path, where + " has " + std::to_string(e - b) + " data bytes but " +
                       to_string(t.dtype) + " " + shape_string(t.shape) + " needs " +
                       std::to_string(want) + " (" + std::to_string(numel) + " x " +
                       std::to_string(dtype_size(t.dtype)) + ")");
    if (e > layout.data_size)
        fail(path, where + " ends at data byte " + std::to_string(e) +
                       " but the data region is only " + std::to_string(layout.data_size) +
                       " bytes (the file is truncated: expected at least " +
                       std::to_string(8 + layout.header_size + e) + " bytes, found " +
                       std::to_string(layout.file_size) + ")");
    t.begin = b;
    t.end = e;
}

// One tensor entry of the header, every field checked against the file.
TensorEntry parse_tensor_entry(const std::string& path, const std::string& name,
                               const nlohmann::json& v, const FileLayout& layout) {
    const std::string where = "tensor '" + name + "'";
    if (!v.is_object())
        fail(path, where + " is a JSON " + v.type_name() +
                       ", expected an object {dtype, shape, data_offsets}");
    TensorEntry t;
    t.name = name;
    t.dtype = parse_dtype_field(path, where, v);
    const size_t numel = parse_shape_field(path, where, v, t.shape);
    parse_data_offsets_field(path, where, v, numel, layout, t);
    return t;
}

// Sorts the tensors by offset and checks that each starts where the previous one ended and the
// last ends at the end of the data region: no overlap, no gap, no trailing bytes.
void sort_and_check_coverage(const std::string& path, std::vector<TensorEntry>& tensors,
                             size_t data_size) {
    std::sort(tensors.begin(), tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    size_t expect = 0;
    const TensorEntry* prev = nullptr;
    for (const auto& t : tensors) {
        if (t.begin < expect)
            fail(path, "tensor '" + t.name + "' data [" + std::to_string(t.begin) + ", " +
                           std::to_string(t.end) + ") overlaps tensor '" + prev->name + "' [" +
                           std::to_string(prev->begin) + ", " + std::to_string(prev->end) + ")");
        if (t.begin > expect)
            fail(path, "data bytes [" + std::to_string(expect) + ", " + std::to_string(t.begin) +
                           ") before tensor '" + t.name +
                           "' belong to no tensor (expected tensors to cover the data region "
                           "contiguously)");
        expect = t.end;
        prev = &t;
    }
    if (expect != data_size)
        fail(path, "the data region is " + std::to_string(data_size) +
                       " bytes but the tensors cover only " + std::to_string(expect) + " (" +
                       std::to_string(data_size - expect) +
                       " trailing bytes belong to no tensor: corrupt file)");
}

}  // namespace

// ---- dtype & shape helpers ------------------------------------------------------------------

const char* to_string(SafeTensorsDType d) {
    return enum_name(d).data();  // every spelling is a literal, so NUL-terminated
}

size_t dtype_size(SafeTensorsDType d) {
    switch (d) {
        case DType::BOOL:
        case DType::U8:
        case DType::I8:
            return 1;
        case DType::U16:
        case DType::I16:
        case DType::F16:
        case DType::BF16:
            return 2;
        case DType::U32:
        case DType::I32:
        case DType::F32:
            return 4;
        case DType::U64:
        case DType::I64:
        case DType::F64:
            return 8;
    }
    return 0;
}

bool is_floating(SafeTensorsDType d) {
    return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64;
}

size_t TensorEntry::numel() const {
    size_t n = 1;
    for (auto d : shape) n *= static_cast<size_t>(d);
    return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// ---- SafeTensorsFile ------------------------------------------------------------------------

// The open file: its descriptor (closed on destruction) and its size when it was opened.
struct SafeTensorsFile::File : ReadableFile {
    using ReadableFile::ReadableFile;
};

SafeTensorsFile::SafeTensorsFile(SafeTensorsFile&&) noexcept = default;
SafeTensorsFile& SafeTensorsFile::operator=(SafeTensorsFile&&) noexcept = default;
SafeTensorsFile::~SafeTensorsFile() = default;

SafeTensorsFile SafeTensorsFile::open(const std::string& path) {
    SafeTensorsFile f;
    f.path_ = path;
    // 1. Open the file and take its size; the descriptor stays open for the tensor reads. A FIFO
    // or a device is refused without blocking (io/regular_file.h).
    f.file_ = std::make_unique<File>(path);
    if (!f.file_->ok()) fail(path, f.file_->error() + ": expected a safetensors file");

    // 2. The header length and the JSON header.
    FileLayout layout;
    layout.file_size = f.file_->size();
    layout.header_size = read_header_length(path, f.file_->fd(), layout.file_size);
    const nlohmann::json header = parse_header_json(path, f.file_->fd(), layout.header_size);
    layout.data_size = layout.file_size - 8 - layout.header_size;
    f.data_offset_ = 8 + layout.header_size;
    f.data_size_ = layout.data_size;

    // 3. Every entry: the metadata, or a tensor checked against the data region.
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (it.key() == "__metadata__")
            parse_metadata(path, it.value(), f.metadata_);
        else
            f.tensors_.push_back(parse_tensor_entry(path, it.key(), it.value(), layout));
    }

    // 4. The tensors tile the data region exactly.
    sort_and_check_coverage(path, f.tensors_, f.data_size_);
    for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
    return f;
}

void SafeTensorsFile::read_bytes(const TensorEntry& t, void* dst) const {
    if (t.begin > t.end || t.end > data_size_)  // an entry of another file
        fail(path_, "tensor '" + t.name + "' [" + std::to_string(t.begin) + ", " +
                        std::to_string(t.end) + ") is not a tensor of this file (data region " +
                        std::to_string(data_size_) + " bytes)");
    read_exact(path_, file_->fd(), data_offset_ + t.begin, dst, t.end - t.begin,
               "tensor '" + t.name + "'");
}

const std::string* SafeTensorsFile::metadata_value(const std::string& key) const {
    auto it = metadata_.find(key);
    return it == metadata_.end() ? nullptr : &it->second;
}

const TensorEntry* SafeTensorsFile::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorEntry& SafeTensorsFile::at(const std::string& name) const {
    const TensorEntry* t = find(name);
    if (!t) fail(path_, "missing tensor '" + name + "'");
    return *t;
}

std::vector<std::byte> SafeTensorsFile::read_raw(const TensorEntry& t) const {
    std::vector<std::byte> bytes(t.end - t.begin);
    read_bytes(t, bytes.data());
    return bytes;
}

void SafeTensorsFile::read_f32_into(const TensorEntry& t, float* dst) const {
    if (!is_floating(t.dtype))
        fail(path_, "tensor '" + t.name + "' has dtype " + to_string(t.dtype) +
                        ", expected a floating-point dtype (F32, or F16/BF16/F64, converted)");
    if (t.dtype == DType::F32) {
        read_bytes(t, dst);
        return;
    }
    const std::vector<std::byte> bytes = read_raw(t);
    const size_t n = t.numel();
    for (size_t i = 0; i < n; ++i)
        dst[i] = static_cast<float>(element_f64(t.dtype, bytes.data(), i));
}

std::vector<float> SafeTensorsFile::read_f32(const std::string& name) const {
    const TensorEntry& t = at(name);
    std::vector<float> out(t.numel());
    read_f32_into(t, out.data());
    return out;
}

std::vector<int32_t> SafeTensorsFile::read_i32(const std::string& name) const {
    const TensorEntry& t = at(name);
    const size_t n = t.numel();
    std::vector<int32_t> out(n);
    switch (t.dtype) {
        case DType::I32:
            read_bytes(t, out.data());
            return out;
        case DType::I64:
        case DType::U32:
        case DType::I16:
        case DType::U16:
        case DType::I8:
        case DType::U8: {
            const std::vector<std::byte> bytes = read_raw(t);
            const std::byte* p = bytes.data();
            for (size_t i = 0; i < n; ++i) {
                int64_t v = t.dtype == DType::I64 ? load_le<int64_t>(p + 8 * i)
                            : t.dtype == DType::U32
                                ? load_le<uint32_t>(p + 4 * i)
                                : static_cast<int64_t>(element_f64(t.dtype, p, i));
                if (v < std::numeric_limits<int32_t>::min() ||
                    v > std::numeric_limits<int32_t>::max())
                    fail(path_, "tensor '" + t.name + "' element " + std::to_string(i) + " is " +
                                    std::to_string(v) + ", which does not fit in int32");
                out[i] = static_cast<int32_t>(v);
            }
            return out;
        }
        default:
            fail(path_, "tensor '" + t.name + "' has dtype " + to_string(t.dtype) +
                            ", expected an integer dtype (I32, or I64 etc. converted)");
    }
}

std::vector<double> SafeTensorsFile::read_f64(const TensorEntry& t) const {
    const std::vector<std::byte> bytes = read_raw(t);
    std::vector<double> out(t.numel());
    for (size_t i = 0; i < out.size(); ++i) out[i] = element_f64(t.dtype, bytes.data(), i);
    return out;
}

// ---- SafeTensorsWriter ----------------------------------------------------------------------

void SafeTensorsWriter::add(const std::string& name, SafeTensorsDType dtype,
                            std::vector<int64_t> shape, std::span<const std::byte> bytes) {
    if (name.empty() || name == "__metadata__")
        throw SafeTensorsError("safetensors writer: invalid tensor name '" + name + "'");
    for (const auto& it : items_)
        if (it.name == name)
            throw SafeTensorsError("safetensors writer: tensor '" + name + "' added twice");
    size_t numel = 1;
    for (auto d : shape) {
        if (d < 0)
            throw SafeTensorsError("safetensors writer: tensor '" + name + "' has negative shape " +
                                   shape_string(shape));
        numel *= static_cast<size_t>(d);
    }
    if (numel * dtype_size(dtype) != bytes.size())
        throw SafeTensorsError("safetensors writer: tensor '" + name + "' " + shape_string(shape) +
                               " needs " + std::to_string(numel) + " elements, got " +
                               std::to_string(bytes.size() / dtype_size(dtype)));
    items_.push_back({name, dtype, std::move(shape), bytes});
}

void SafeTensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape,
                                std::span<const float> data) {
    add(name, DType::F32, std::move(shape), std::as_bytes(data));
}
void SafeTensorsWriter::add_i32(const std::string& name, std::vector<int64_t> shape,
                                std::span<const int32_t> data) {
    add(name, DType::I32, std::move(shape), std::as_bytes(data));
}
void SafeTensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape,
                                std::vector<float>&& data) {
    auto keep = std::make_shared<std::vector<float>>(std::move(data));
    add(name, DType::F32, std::move(shape), std::as_bytes(std::span<const float>(*keep)));
    owned_.push_back(keep);
}
void SafeTensorsWriter::add_i32(const std::string& name, std::vector<int64_t> shape,
                                std::vector<int32_t>&& data) {
    auto keep = std::make_shared<std::vector<int32_t>>(std::move(data));
    add(name, DType::I32, std::move(shape), std::as_bytes(std::span<const int32_t>(*keep)));
    owned_.push_back(keep);
}

void SafeTensorsWriter::set_metadata(const std::string& key, const std::string& value) {
    metadata_[key] = value;
}

void SafeTensorsWriter::write(const std::string& path) const {
    // Header in data order (ordered_json keeps insertion order, easier to read with `head`).
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata_.empty()) {
        nlohmann::ordered_json meta = nlohmann::ordered_json::object();
        for (const auto& [k, v] : metadata_) meta[k] = v;
        header["__metadata__"] = std::move(meta);
    }
    size_t offset = 0;
    for (const auto& it : items_) {
        header[it.name] = {{"dtype", to_string(it.dtype)},
                           {"shape", it.shape},
                           {"data_offsets", {offset, offset + it.bytes.size()}}};
        offset += it.bytes.size();
    }
    std::string h = header.dump();
    h.append((8 - h.size() % 8) % 8, ' ');  // align the data region to 8 bytes, as safetensors
    const uint64_t n = h.size();

    std::vector<std::span<const std::byte>> pieces;
    pieces.push_back(std::as_bytes(std::span(&n, 1)));
    pieces.push_back(std::as_bytes(std::span(h.data(), h.size())));
    for (const auto& it : items_) pieces.push_back(it.bytes);
    try {
        write_file_atomic(path, pieces);
    } catch (const std::runtime_error& e) {
        throw SafeTensorsError(e.what());
    }
}

}  // namespace mt
