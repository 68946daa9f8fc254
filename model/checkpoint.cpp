// safetensors reader/writer and model checkpoints. See checkpoint.h for the format.
#include "model/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/atomic_file.h"
#include "optim/adamw.h"

namespace mt {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader assumes a little-endian host");

namespace {

// The reference implementation refuses headers above 100 MB; a longer length field means a
// corrupt file, and refusing it keeps a garbage length from becoming a giant allocation.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

const char* const kConfigKeys[] = {"n_layer", "n_head", "n_embd", "vocab_size", "max_seq_len"};

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw CheckpointError(path + ": " + what);
}

bool parse_dtype(const std::string& s, DType* out) {
    static const std::pair<const char*, DType> table[] = {
        {"BOOL", DType::BOOL}, {"U8", DType::U8},   {"I8", DType::I8},     {"U16", DType::U16},
        {"I16", DType::I16},   {"F16", DType::F16}, {"BF16", DType::BF16}, {"U32", DType::U32},
        {"I32", DType::I32},   {"F32", DType::F32}, {"U64", DType::U64},   {"I64", DType::I64},
        {"F64", DType::F64}};
    for (const auto& [name, d] : table)
        if (s == name) {
            *out = d;
            return true;
        }
    return false;
}

bool is_floating(DType d) {
    return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64;
}

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

// Strict decimal parse of a metadata value: the whole string, in [lo, INT_MAX].
bool parse_int(const std::string& s, int lo, int* out) {
    int v = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size() || v < lo) return false;
    *out = v;
    return true;
}

int& config_field(GPTConfig& c, const std::string& key) {
    if (key == "n_layer") return c.n_layer;
    if (key == "n_head") return c.n_head;
    if (key == "n_embd") return c.n_embd;
    if (key == "vocab_size") return c.vocab_size;
    return c.max_seq_len;
}

int config_value(const GPTConfig& c, const std::string& key) {
    return config_field(const_cast<GPTConfig&>(c), key);
}

int metadata_int(const SafeTensorsFile& f, const std::string& key, int lo) {
    const std::string* v = f.metadata_value(key);
    int out = 0;
    if (!parse_int(*v, lo, &out))
        fail(f.path(), "__metadata__ \"" + key + "\" is \"" + *v + "\", expected an integer >= " +
                           std::to_string(lo) + " written as a decimal string");
    return out;
}

// "transformer.h.<N>.<rest>" -> N (and rest), or -1.
int layer_index(const std::string& name, std::string* rest = nullptr) {
    static const std::string prefix = "transformer.h.";
    if (name.compare(0, prefix.size(), prefix) != 0) return -1;
    size_t i = prefix.size(), j = i;
    while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
    if (j == i || j - i > 6 || j >= name.size() || name[j] != '.') return -1;
    if (rest) *rest = name.substr(j + 1);
    return std::stoi(name.substr(i, j - i));
}

}  // namespace

// ---- dtype & shape helpers --------------------------------------------------------------------

const char* to_string(DType d) {
    switch (d) {
        case DType::BOOL:
            return "BOOL";
        case DType::U8:
            return "U8";
        case DType::I8:
            return "I8";
        case DType::U16:
            return "U16";
        case DType::I16:
            return "I16";
        case DType::F16:
            return "F16";
        case DType::BF16:
            return "BF16";
        case DType::U32:
            return "U32";
        case DType::I32:
            return "I32";
        case DType::F32:
            return "F32";
        case DType::U64:
            return "U64";
        case DType::I64:
            return "I64";
        case DType::F64:
            return "F64";
    }
    return "?";
}

size_t dtype_size(DType d) {
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

// ---- SafeTensorsFile --------------------------------------------------------------------------

// A read-only private mapping of the whole file; unmapped on destruction.
struct SafeTensorsFile::Mapping {
    void* addr = nullptr;
    size_t size = 0;
    ~Mapping() {
        if (addr) munmap(addr, size);
    }
};

SafeTensorsFile::SafeTensorsFile(SafeTensorsFile&&) noexcept = default;
SafeTensorsFile& SafeTensorsFile::operator=(SafeTensorsFile&&) noexcept = default;
SafeTensorsFile::~SafeTensorsFile() = default;

SafeTensorsFile SafeTensorsFile::open(const std::string& path) {
    SafeTensorsFile f;
    f.path_ = path;
    f.map_ = std::make_unique<Mapping>();

    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, "cannot open: " + std::string(std::strerror(errno)));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        fail(path, "cannot stat: " + std::string(std::strerror(e)));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(path, "not a regular file");
    }
    const size_t size = static_cast<size_t>(st.st_size);
    if (size > 0) {
        void* a = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (a == MAP_FAILED) {
            const int e = errno;
            ::close(fd);
            fail(path, "cannot mmap " + std::to_string(size) + " bytes: " + std::strerror(e));
        }
        f.map_->addr = a;
        f.map_->size = size;
    }
    ::close(fd);  // the mapping stays valid
    const auto* bytes = static_cast<const std::byte*>(f.map_->addr);

    // -- header length --
    if (size < 8)
        fail(path, "file is " + std::to_string(size) +
                       " bytes, shorter than the 8-byte header length every safetensors file "
                       "starts with (truncated, or not a safetensors file)");
    const uint64_t n = load_le<uint64_t>(bytes);
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

    // -- JSON header --
    nlohmann::json header;
    try {
        const char* h = reinterpret_cast<const char*>(bytes + 8);
        header = nlohmann::json::parse(h, h + n);
    } catch (const nlohmann::json::exception& e) {
        fail(path, "the " + std::to_string(n) + "-byte header is not valid JSON (" + e.what() +
                       "): the file is corrupt or not a safetensors file");
    }
    if (!header.is_object())
        fail(path, std::string("the header is a JSON ") + header.type_name() +
                       ", expected an object mapping tensor names to {dtype, shape, data_offsets}");

    f.data_ = bytes + 8 + n;
    f.data_size_ = size - 8 - n;
    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& name = it.key();
        const nlohmann::json& v = it.value();
        if (name == "__metadata__") {
            if (v.is_null()) continue;
            if (!v.is_object())
                fail(path, std::string("__metadata__ is a JSON ") + v.type_name() +
                               ", expected an object of string values");
            for (auto m = v.begin(); m != v.end(); ++m) {
                if (!m.value().is_string())
                    fail(path, "__metadata__ \"" + m.key() + "\" is a JSON " +
                                   m.value().type_name() +
                                   ", expected a string (safetensors metadata values are strings)");
                f.metadata_[m.key()] = m.value().get<std::string>();
            }
            continue;
        }
        const std::string where = "tensor '" + name + "'";
        if (!v.is_object())
            fail(path, where + " is a JSON " + v.type_name() +
                           ", expected an object {dtype, shape, data_offsets}");
        TensorEntry t;
        t.name = name;
        // dtype
        auto d = v.find("dtype");
        if (d == v.end() || !d->is_string())
            fail(path, where + " has no string \"dtype\" (expected e.g. \"F32\")");
        if (!parse_dtype(d->get<std::string>(), &t.dtype))
            fail(path, where + " has unknown dtype \"" + d->get<std::string>() +
                           "\" (expected one of BOOL U8 I8 U16 I16 F16 BF16 U32 I32 F32 U64 I64 "
                           "F64)");
        // shape
        auto s = v.find("shape");
        if (s == v.end() || !s->is_array()) fail(path, where + " has no \"shape\" array");
        size_t numel = 1;
        for (const auto& dim : *s) {
            if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (1ull << 40))
                fail(path, where + " has shape " + s->dump() +
                               ", expected non-negative integer dimensions");
            const uint64_t dv = dim.get<uint64_t>();
            if (dv != 0 && numel > std::numeric_limits<size_t>::max() / dv)
                fail(path, where + " has shape " + s->dump() + " whose size overflows");
            numel *= dv;
            t.shape.push_back(static_cast<int64_t>(dv));
        }
        // data_offsets
        auto o = v.find("data_offsets");
        if (o == v.end() || !o->is_array() || o->size() != 2 || !(*o)[0].is_number_unsigned() ||
            !(*o)[1].is_number_unsigned())
            fail(path, where +
                           " needs \"data_offsets\": [begin, end] of non-negative integers, "
                           "got " +
                           (o == v.end() ? std::string("nothing") : o->dump()));
        const uint64_t b = (*o)[0].get<uint64_t>(), e = (*o)[1].get<uint64_t>();
        if (b > e)
            fail(path, where + " has data_offsets [" + std::to_string(b) + ", " +
                           std::to_string(e) + "] with begin > end");
        const size_t want = numel * dtype_size(t.dtype);
        if (numel > std::numeric_limits<size_t>::max() / 8 || e - b != want)
            fail(path, where + " has " + std::to_string(e - b) + " data bytes but " +
                           to_string(t.dtype) + " " + shape_string(t.shape) + " needs " +
                           std::to_string(want) + " (" + std::to_string(numel) + " x " +
                           std::to_string(dtype_size(t.dtype)) + ")");
        if (e > f.data_size_)
            fail(path, where + " ends at data byte " + std::to_string(e) +
                           " but the data region is only " + std::to_string(f.data_size_) +
                           " bytes (the file is truncated: expected at least " +
                           std::to_string(8 + n + e) + " bytes, found " + std::to_string(size) +
                           ")");
        t.begin = b;
        t.end = e;
        f.tensors_.push_back(std::move(t));
    }

    // -- coverage: sorted by offset, each tensor starts where the previous one ended --
    std::sort(f.tensors_.begin(), f.tensors_.end(), [](const TensorEntry& a, const TensorEntry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    size_t expect = 0;
    const TensorEntry* prev = nullptr;
    for (const auto& t : f.tensors_) {
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
    if (expect != f.data_size_)
        fail(path, "the data region is " + std::to_string(f.data_size_) +
                       " bytes but the tensors cover only " + std::to_string(expect) + " (" +
                       std::to_string(f.data_size_ - expect) +
                       " trailing bytes belong to no tensor: corrupt file)");
    for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
    return f;
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

std::span<const std::byte> SafeTensorsFile::raw(const TensorEntry& t) const {
    return {data_ + t.begin, t.end - t.begin};
}

void SafeTensorsFile::read_f32_into(const TensorEntry& t, float* dst) const {
    if (!is_floating(t.dtype))
        fail(path_, "tensor '" + t.name + "' has dtype " + to_string(t.dtype) +
                        ", expected a floating-point dtype (F32, or F16/BF16/F64, converted)");
    const std::byte* p = data_ + t.begin;
    const size_t n = t.numel();
    if (t.dtype == DType::F32) {
        if (n) std::memcpy(dst, p, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(element_f64(t.dtype, p, i));
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
    const std::byte* p = data_ + t.begin;
    switch (t.dtype) {
        case DType::I32:
            if (n) std::memcpy(out.data(), p, n * sizeof(int32_t));
            return out;
        case DType::I64:
        case DType::U32:
        case DType::I16:
        case DType::U16:
        case DType::I8:
        case DType::U8:
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
        default:
            fail(path_, "tensor '" + t.name + "' has dtype " + to_string(t.dtype) +
                            ", expected an integer dtype (I32, or I64 etc. converted)");
    }
}

std::vector<double> SafeTensorsFile::read_f64(const TensorEntry& t) const {
    std::vector<double> out(t.numel());
    for (size_t i = 0; i < out.size(); ++i) out[i] = element_f64(t.dtype, data_ + t.begin, i);
    return out;
}

// ---- SafeTensorsWriter ------------------------------------------------------------------------

void SafeTensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape,
                            std::span<const std::byte> bytes) {
    if (name.empty() || name == "__metadata__")
        throw CheckpointError("safetensors writer: invalid tensor name '" + name + "'");
    for (const auto& it : items_)
        if (it.name == name)
            throw CheckpointError("safetensors writer: tensor '" + name + "' added twice");
    size_t numel = 1;
    for (auto d : shape) {
        if (d < 0)
            throw CheckpointError("safetensors writer: tensor '" + name + "' has negative shape " +
                                  shape_string(shape));
        numel *= static_cast<size_t>(d);
    }
    if (numel * dtype_size(dtype) != bytes.size())
        throw CheckpointError("safetensors writer: tensor '" + name + "' " + shape_string(shape) +
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
        throw CheckpointError(e.what());
    }
}

// ---- model checkpoints ------------------------------------------------------------------------

GPTConfig read_checkpoint_config(const SafeTensorsFile& f) {
    // What the tensor shapes imply (nanoGPT: wte (V, C) with exactly V rows, wpe (T, C)).
    std::map<std::string, int> inferred;
    std::map<std::string, std::string> how;
    if (const TensorEntry* wte = f.find("transformer.wte.weight"); wte && wte->shape.size() == 2) {
        inferred["vocab_size"] = static_cast<int>(wte->shape[0]);
        inferred["n_embd"] = static_cast<int>(wte->shape[1]);
        how["vocab_size"] = how["n_embd"] = "transformer.wte.weight " + shape_string(wte->shape);
    }
    if (const TensorEntry* wpe = f.find("transformer.wpe.weight"); wpe && wpe->shape.size() == 2) {
        inferred["max_seq_len"] = static_cast<int>(wpe->shape[0]);
        how["max_seq_len"] = "transformer.wpe.weight " + shape_string(wpe->shape);
    }
    int max_layer = -1;
    for (const auto& t : f.tensors()) max_layer = std::max(max_layer, layer_index(t.name));
    if (max_layer >= 0) {
        inferred["n_layer"] = max_layer + 1;
        how["n_layer"] = "the transformer.h.N tensors";
    }

    GPTConfig c;
    for (const char* key : kConfigKeys) {
        if (f.metadata_value(key)) {
            config_field(c, key) = metadata_int(f, key, 1);
        } else if (inferred.count(key)) {
            config_field(c, key) = inferred[key];
        } else if (std::string(key) == "n_head") {
            fail(f.path(),
                 "no __metadata__ \"n_head\": the number of attention heads cannot be inferred "
                 "from tensor shapes; add it to the file's metadata (e.g. \"n_head\": \"12\" for "
                 "GPT-2 124M)");
        } else {
            fail(f.path(), std::string("no __metadata__ \"") + key +
                               "\" and no tensor to infer it from (expected "
                               "transformer.wte.weight, transformer.wpe.weight and "
                               "transformer.h.N.* tensors)");
        }
    }
    try {
        c.validate();
    } catch (const std::exception& e) {
        fail(f.path(), std::string("the model config it describes (") + c.describe() +
                           ") is invalid: " + e.what());
    }
    return c;
}

GPTConfig read_checkpoint_config(const std::string& path) {
    return read_checkpoint_config(SafeTensorsFile::open(path));
}

void save_checkpoint(const std::string& path, GPT& model, AdamW* opt,
                     const std::map<std::string, std::string>& extra) {
    const GPTConfig& c = model.config();
    const ParameterTable& table = model.parameter_table();
    SafeTensorsWriter w;
    for (const auto& [k, v] : extra) {
        for (const char* key : kConfigKeys)
            if (k == key)
                throw CheckpointError(path + ": extra metadata may not override \"" + k + "\"");
        if (k == "step") throw CheckpointError(path + ": extra metadata may not override \"step\"");
        w.set_metadata(k, v);
    }
    for (const char* key : kConfigKeys) w.set_metadata(key, std::to_string(config_value(c, key)));
    w.set_metadata("format", "pt");  // what Hugging Face tooling expects of a PyTorch file

    // Host copies; the writer references them, so they live until write() returns.
    const std::vector<float> params = model.get_params();
    std::vector<float> m, v;
    for (const auto& p : table.tensors())
        w.add_f32(p.name, p.shape, std::span<const float>(params.data() + p.offset, p.count));
    if (opt) {
        m = opt->get_m();
        v = opt->get_v();
        for (const auto& p : table.tensors())
            w.add_f32("optim.m." + p.name, p.shape,
                      std::span<const float>(m.data() + p.offset, p.count));
        for (const auto& p : table.tensors())
            w.add_f32("optim.v." + p.name, p.shape,
                      std::span<const float>(v.data() + p.offset, p.count));
        w.set_metadata("step", std::to_string(opt->steps_taken()));
    }
    w.write(path);
}

CheckpointLoadInfo load_checkpoint(const SafeTensorsFile& f, GPT& model, AdamW* opt) {
    const GPTConfig& c = model.config();
    const ParameterTable& table = model.parameter_table();
    const std::string& path = f.path();
    const std::string wte_name = "transformer.wte.weight";
    const int64_t V = c.vocab_size;

    // 1. The config in the metadata (where present) must be the model's.
    for (const char* key : kConfigKeys) {
        if (!f.metadata_value(key)) continue;
        const int have = metadata_int(f, key, 1);
        const int want = config_value(c, key);
        if (have != want)
            fail(path, std::string("the checkpoint is for ") + key + "=" + std::to_string(have) +
                           " but the model has " + key + "=" + std::to_string(want) +
                           " (build the model from read_checkpoint_config(file))");
    }

    // 2. Every tensor must be known: a parameter, its optimizer moments, or a nanoGPT extra.
    bool any_optim = false;
    for (const auto& t : f.tensors()) {
        const std::string& n = t.name;
        if (table.find(n) || n == "lm_head.weight") continue;
        if ((n.rfind("optim.m.", 0) == 0 || n.rfind("optim.v.", 0) == 0) &&
            table.find(n.substr(8))) {
            any_optim = true;
            continue;
        }
        std::string rest;
        const int l = layer_index(n, &rest);
        if (l >= 0 && l < c.n_layer && (rest == "attn.bias" || rest == "attn.masked_bias"))
            continue;
        fail(path, "unknown tensor '" + n + "' " + to_string(t.dtype) + " " +
                       shape_string(t.shape) + ": a " + c.describe() +
                       " checkpoint holds only the nanoGPT parameters (transformer.wte.weight, "
                       "transformer.h.0..." +
                       std::to_string(c.n_layer - 1) +
                       ".*, transformer.ln_f.*), optim.m.<name> / optim.v.<name>, lm_head.weight "
                       "and the transformer.h.N.attn.bias mask buffers");
    }

    // Shape rule: the model's shape, except that wte (and its moments) may have exactly
    // vocab_size rows (nanoGPT does not pad) instead of padded_vocab_size.
    auto check = [&](const std::string& name, const ParameterInfo& p) -> const TensorEntry& {
        const TensorEntry* t = f.find(name);
        std::vector<int64_t> unpadded = p.shape;
        if (p.name == wte_name) unpadded[0] = V;
        const std::string expect =
            "F32 " + shape_string(p.shape) +
            (unpadded != p.shape ? " or " + shape_string(unpadded) + " (unpadded)" : "");
        if (!t) fail(path, "missing tensor '" + name + "' (expected " + expect + ")");
        if (!is_floating(t->dtype))
            fail(path, "tensor '" + name + "' has dtype " + to_string(t->dtype) + ", expected " +
                           expect + " (F16, BF16 and F64 are also accepted and converted)");
        if (t->shape != p.shape && t->shape != unpadded) {
            std::string hint;
            if (t->shape.size() == 2 && p.shape.size() == 2 && t->shape[0] == p.shape[1] &&
                t->shape[1] == p.shape[0])
                hint =
                    "; it looks transposed (Hugging Face GPT-2 stores Conv1D weights as "
                    "(in, out): transpose them to PyTorch Linear's (out, in))";
            fail(path, "tensor '" + name + "' has shape " + shape_string(t->shape) + ", expected " +
                           expect + hint);
        }
        return *t;
    };
    // Reads a parameter-shaped tensor into flat[p.offset ...]; unpadded wte rows beyond V stay 0.
    auto read_into = [&](const TensorEntry& t, const ParameterInfo& p, std::vector<float>& flat) {
        std::fill(flat.begin() + p.offset, flat.begin() + p.offset + p.count, 0.0f);
        f.read_f32_into(t, flat.data() + p.offset);
    };

    // 3. Parameters.
    CheckpointLoadInfo info;
    info.metadata = f.metadata();
    std::vector<float> params(table.total_count(), 0.0f);
    for (const auto& p : table.tensors()) {
        const TensorEntry& t = check(p.name, p);
        if (p.name == wte_name) info.wte_rows = t.shape[0];
        read_into(t, p, params);
    }

    // 4. The tied LM head nanoGPT's state_dict repeats must equal wte.
    if (const TensorEntry* head = f.find("lm_head.weight")) {
        const TensorEntry& wte = f.at(wte_name);
        if (head->shape != wte.shape)
            fail(path, "tensor 'lm_head.weight' has shape " + shape_string(head->shape) +
                           ", expected " + shape_string(wte.shape) +
                           " like transformer.wte.weight (microtrain ties the LM head to wte)");
        if (!is_floating(head->dtype))
            fail(path, std::string("tensor 'lm_head.weight' has dtype ") + to_string(head->dtype) +
                           ", expected a floating-point dtype like transformer.wte.weight");
        std::vector<float> h(head->numel());
        f.read_f32_into(*head, h.data());
        const float* e = params.data() + table.at(wte_name).offset;
        for (size_t i = 0; i < h.size(); ++i)
            if (std::bit_cast<uint32_t>(h[i]) != std::bit_cast<uint32_t>(e[i]))
                fail(path,
                     "tensor 'lm_head.weight' differs from transformer.wte.weight (first at "
                     "row " +
                         std::to_string(i / c.n_embd) + ", column " + std::to_string(i % c.n_embd) +
                         ": " + std::to_string(h[i]) + " vs " + std::to_string(e[i]) +
                         "); microtrain ties the LM head to the token embedding, so an "
                         "untied checkpoint cannot be loaded");
    }

    // 5. nanoGPT's causal-mask buffers: accepted if they are what the model computes anyway.
    for (int l = 0; l < c.n_layer; ++l) {
        const std::string h = "transformer.h." + std::to_string(l) + ".";
        if (const TensorEntry* b = f.find(h + "attn.bias")) {
            const int64_t S = c.max_seq_len;
            const std::vector<int64_t> want{1, 1, S, S};
            if (b->shape != want)
                fail(path, "tensor '" + b->name + "' has shape " + shape_string(b->shape) +
                               ", expected " + shape_string(want) +
                               " (nanoGPT's causal mask for max_seq_len " + std::to_string(S) +
                               ")");
            const std::vector<double> mask = f.read_f64(*b);
            for (int64_t i = 0; i < S; ++i)
                for (int64_t j = 0; j < S; ++j)
                    if ((mask[i * S + j] != 0) != (j <= i))
                        fail(path, "tensor '" + b->name + "' is not the causal mask tril(ones(" +
                                       std::to_string(S) + ", " + std::to_string(S) +
                                       ")): element (" + std::to_string(i) + ", " +
                                       std::to_string(j) + ") is " +
                                       std::to_string(mask[i * S + j]) +
                                       "; microtrain's attention is always causal");
        }
        if (const TensorEntry* mb = f.find(h + "attn.masked_bias"); mb && mb->numel() != 1)
            fail(path, "tensor '" + mb->name + "' has shape " + shape_string(mb->shape) +
                           ", expected a scalar (Hugging Face's masked_bias)");
    }

    // 6. Optimizer state: all or nothing; required when an optimizer is given.
    std::vector<float> m, v;
    info.has_optimizer_state = any_optim;
    if (f.metadata_value("step")) info.step = metadata_int(f, "step", 0);
    if (any_optim) {
        if (opt) {
            m.assign(table.total_count(), 0.0f);
            v.assign(table.total_count(), 0.0f);
        }
        for (const auto& p : table.tensors()) {
            const TensorEntry& tm = check("optim.m." + p.name, p);
            const TensorEntry& tv = check("optim.v." + p.name, p);
            if (opt) {
                read_into(tm, p, m);
                read_into(tv, p, v);
            }
        }
        if (!f.metadata_value("step"))
            fail(path,
                 "has optimizer state (optim.m.* / optim.v.*) but no __metadata__ \"step\" "
                 "(the AdamW step count, needed for bias correction)");
    } else if (opt) {
        fail(path,
             "has no optimizer state (no optim.m.<name> / optim.v.<name> tensors) but an "
             "optimizer was given to restore; load without one to restore the weights only");
    }

    // 7. Commit (nothing was changed before every check passed).
    model.set_params(params);
    if (opt) opt->set_state(m, v, info.step);
    return info;
}

CheckpointLoadInfo load_checkpoint(const std::string& path, GPT& model, AdamW* opt) {
    return load_checkpoint(SafeTensorsFile::open(path), model, opt);
}

}  // namespace mt
