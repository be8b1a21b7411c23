// GGUF reader: every count, length, dimension and offset is checked against the bytes
// that are actually there before anything is allocated or dereferenced, with overflow-safe
// arithmetic, because the file is untrusted input. Layout: spec/GGUF.md section 1.
#include "format/gguf.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "alloy/error.h"
#include "format/mapped_file.h"

namespace alloy::gguf {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read little-endian
constexpr int64_t kMaxDims = 4;
// Smallest possible encodings, used to reject absurd counts before allocating.
constexpr size_t kMinKvBytes = 8 + 4;               // key length + value type
constexpr size_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // name len, n_dims, ne[0], type, offset

std::string num(uint64_t v) { return std::to_string(v); }

// Byte size of a fixed-size value type; 0 for STRING and ARRAY.
size_t fixed_size(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
        case ValueType::INT8:
        case ValueType::BOOL: return 1;
        case ValueType::UINT16:
        case ValueType::INT16: return 2;
        case ValueType::UINT32:
        case ValueType::INT32:
        case ValueType::FLOAT32: return 4;
        case ValueType::UINT64:
        case ValueType::INT64:
        case ValueType::FLOAT64: return 8;
        case ValueType::STRING:
        case ValueType::ARRAY: return 0;
    }
    return 0;
}

bool is_integer(ValueType t) {
    switch (t) {
        case ValueType::UINT8:
        case ValueType::INT8:
        case ValueType::UINT16:
        case ValueType::INT16:
        case ValueType::UINT32:
        case ValueType::INT32:
        case ValueType::UINT64:
        case ValueType::INT64: return true;
        default: return false;
    }
}

bool is_float(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

// A bounds-checked little-endian reader over the file bytes. Every failure names the
// field and the offset where it starts.
class Cursor {
public:
    Cursor(const uint8_t* data, size_t size, const std::string& path) : data_(data), size_(size), path_(path) {}

    size_t pos() const { return pos_; }
    size_t left() const { return size_ - pos_; }
    const uint8_t* here() const { return data_ + pos_; }
    void skip(size_t n) { pos_ += n; }  // caller has checked n <= left()

    [[noreturn]] void fail(const std::string& field, size_t at, const std::string& what) const {
        throw Error(path_ + ": " + field + " at offset " + num(at) + ": " + what);
    }

    void need(size_t n, const std::string& field) const {
        if (n > left()) {
            fail(field, pos_, "needs " + num(n) + " bytes but only " + num(left()) + " remain (truncated file)");
        }
    }

    template <class T>
    T get(const std::string& field) {
        need(sizeof(T), field);
        T v;
        std::memcpy(&v, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string get_string(const std::string& field) {
        const size_t at = pos_;
        const uint64_t len = get<uint64_t>(field + " (string length)");
        if (len > left()) {
            fail(field, at, "string length " + num(len) + " exceeds the " + num(left()) + " bytes remaining");
        }
        std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
        pos_ += static_cast<size_t>(len);
        return s;
    }

private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
    const std::string& path_;
};

ValueType read_value_type(Cursor& c, const std::string& field, const char* what) {
    const size_t at = c.pos();
    const uint32_t raw = c.get<uint32_t>(field);
    if (raw > static_cast<uint32_t>(ValueType::FLOAT64)) c.fail(field, at, "unknown " + std::string(what) + " " + num(raw));
    return static_cast<ValueType>(raw);
}

// Decodes one fixed-size scalar at p (bounds already checked) into the widened fields.
void decode_scalar(ValueType t, const uint8_t* p, int64_t& i, uint64_t& u, double& f) {
    auto load = [p](auto v) {
        std::memcpy(&v, p, sizeof(v));
        return v;
    };
    switch (t) {
        case ValueType::UINT8: u = load(uint8_t{}); break;
        case ValueType::UINT16: u = load(uint16_t{}); break;
        case ValueType::UINT32: u = load(uint32_t{}); break;
        case ValueType::UINT64: u = load(uint64_t{}); break;
        case ValueType::INT8: i = load(int8_t{}); break;
        case ValueType::INT16: i = load(int16_t{}); break;
        case ValueType::INT32: i = load(int32_t{}); break;
        case ValueType::INT64: i = load(int64_t{}); break;
        case ValueType::BOOL: i = load(uint8_t{}); break;
        case ValueType::FLOAT32: f = load(float{}); break;
        case ValueType::FLOAT64: f = load(double{}); break;
        case ValueType::STRING:
        case ValueType::ARRAY: break;
    }
    // Fill the other integer field when the value fits (documented in gguf.h).
    if (t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64) {
        if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) i = static_cast<int64_t>(u);
    } else if (i >= 0) {
        u = static_cast<uint64_t>(i);
    }
}

Value read_array(Cursor& c, const std::string& field) {
    Value v;
    v.type = ValueType::ARRAY;
    const size_t elem_at = c.pos();
    v.elem_type = read_value_type(c, field, "array element type");
    if (v.elem_type == ValueType::ARRAY) c.fail(field, elem_at, "nested arrays are not supported");
    const size_t count_at = c.pos();
    const uint64_t count = c.get<uint64_t>(field + " (array count)");

    if (v.elem_type == ValueType::STRING) {
        // Each string needs at least its 8-byte length.
        if (count > c.left() / 8) {
            c.fail(field, count_at, "array of " + num(count) + " strings cannot fit in the " + num(c.left()) +
                                        " bytes remaining");
        }
        v.strs.reserve(static_cast<size_t>(count));
        for (uint64_t k = 0; k < count; ++k) {
            const size_t at = c.pos();
            uint64_t len;
            if (c.left() < 8) c.fail(field, at, "string element " + num(k) + " truncated");
            std::memcpy(&len, c.here(), 8);
            if (len > c.left() - 8) {
                c.fail(field, at, "string element " + num(k) + " length " + num(len) + " exceeds the " +
                                      num(c.left() - 8) + " bytes remaining");
            }
            c.skip(8);
            v.strs.emplace_back(reinterpret_cast<const char*>(c.here()), static_cast<size_t>(len));
            c.skip(static_cast<size_t>(len));
        }
        return v;
    }

    const size_t esize = fixed_size(v.elem_type);
    if (count > c.left() / esize) {
        c.fail(field, count_at, "array of " + num(count) + " " + value_type_name(v.elem_type) +
                                    " cannot fit in the " + num(c.left()) + " bytes remaining");
    }
    const size_t n = static_cast<size_t>(count);
    if (is_float(v.elem_type)) {
        v.floats.resize(n);
    } else {
        v.ints.resize(n);
    }
    for (size_t k = 0; k < n; ++k) {
        int64_t i = 0;
        uint64_t u = 0;
        double f = 0;
        decode_scalar(v.elem_type, c.here() + k * esize, i, u, f);
        if (is_float(v.elem_type)) {
            v.floats[k] = f;
        } else if (v.elem_type == ValueType::UINT64) {
            v.ints[k] = static_cast<int64_t>(u);  // bit-cast, documented in gguf.h
        } else if (v.elem_type == ValueType::UINT8 || v.elem_type == ValueType::UINT16 ||
                   v.elem_type == ValueType::UINT32) {
            v.ints[k] = static_cast<int64_t>(u);
        } else {
            if (v.elem_type == ValueType::BOOL && i > 1) {
                c.fail(field, c.pos() + k, "bool element " + num(k) + " has value " + num(i) + " (not 0 or 1)");
            }
            v.ints[k] = i;
        }
    }
    c.skip(n * esize);
    return v;
}

Value read_value(Cursor& c, ValueType t, const std::string& field) {
    if (t == ValueType::ARRAY) return read_array(c, field);
    Value v;
    v.type = t;
    if (t == ValueType::STRING) {
        v.s = c.get_string(field);
        return v;
    }
    const size_t at = c.pos();
    c.need(fixed_size(t), field);
    decode_scalar(t, c.here(), v.i, v.u, v.f);
    if (t == ValueType::BOOL && v.i > 1) c.fail(field, at, "bool value " + num(v.i) + " is not 0 or 1");
    c.skip(fixed_size(t));
    return v;
}

bool checked_mul(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }
bool checked_add(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }

}  // namespace

int64_t TensorInfo::n_elements() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
}

std::unique_ptr<File> File::open(const std::string& path, TensorData where, uint64_t memory_limit) {
    std::unique_ptr<File> f(new File());
    f->path_ = path;
    f->map_ = map_file(path, f->map_size_);
    const auto* base = static_cast<const uint8_t*>(f->map_);
    f->parse_all(base, f->map_size_);
    if (where == TensorData::Resident && !f->tensors_.empty()) {
        // One read of the span from the first tensor's byte to the last one's end (validated
        // above to lie inside the file); the mapping keeps serving the metadata.
        size_t lo = f->map_size_, hi = 0;
        for (const TensorInfo& t : f->tensors_) {
            lo = std::min(lo, size_t(t.data - base));
            hi = std::max(hi, size_t(t.data - base) + t.nbytes);
        }
        if (memory_limit == 0) memory_limit = ResidentBytes::available_memory();
        const bool fits = memory_limit == 0 || double(hi - lo) <= 0.9 * double(memory_limit);
        if (hi > lo && fits) {
            f->resident_ = ResidentBytes::read(path, lo, hi - lo);
            for (TensorInfo& t : f->tensors_) t.data = f->resident_.data() + (t.data - base - lo);
        }
    }
    return f;
}

std::unique_ptr<File> File::parse(const uint8_t* data, size_t size, const std::string& name) {
    std::unique_ptr<File> f(new File());
    f->path_ = name;
    f->parse_all(data, data ? size : 0);
    return f;
}

File::~File() { unmap_file(map_, map_size_); }

void File::parse_all(const uint8_t* data, size_t size) {
    static const uint8_t kEmpty = 0;
    if (!data) data = &kEmpty;  // empty file: every read fails the bounds check
    Cursor c(data, size, path_);

    const uint32_t magic = c.get<uint32_t>("magic");
    if (magic != kMagic) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "0x%08x", magic);
        c.fail("magic", 0, std::string("expected \"GGUF\" (0x46554747), got ") + buf);
    }
    version_ = c.get<uint32_t>("version");
    if (version_ != 2 && version_ != 3) {
        if (version_ == 0x02000000 || version_ == 0x03000000) c.fail("version", 4, "big-endian GGUF is not supported");
        c.fail("version", 4, "unsupported version " + num(version_) + " (expected 3, or 2)");
    }
    const uint64_t tensor_count = c.get<uint64_t>("tensor_count");
    const uint64_t kv_count = c.get<uint64_t>("kv_count");
    // Both counts are bounded by the remaining bytes first, so the sum below cannot overflow.
    if (kv_count > c.left() / kMinKvBytes) {
        c.fail("kv_count", 16, "count " + num(kv_count) + " cannot fit in the " + num(c.left()) + " bytes remaining");
    }
    if (tensor_count > c.left() / kMinTensorInfoBytes ||
        kv_count * kMinKvBytes + tensor_count * kMinTensorInfoBytes > c.left()) {
        c.fail("tensor_count", 8,
               "count " + num(tensor_count) + " cannot fit in the " + num(c.left()) + " bytes remaining");
    }

    // ---- metadata ----
    kv_.reserve(static_cast<size_t>(kv_count));
    for (uint64_t k = 0; k < kv_count; ++k) {
        const size_t key_at = c.pos();
        std::string key = c.get_string("key #" + num(k));
        const std::string field = "key '" + key + "'";
        if (kv_index_.count(key)) c.fail(field, key_at, "duplicate key");
        const size_t type_at = c.pos();
        const ValueType t = read_value_type(c, field, "value type");
        const size_t value_at = c.pos();
        Value v = read_value(c, t, field);
        if (key == "general.alignment") {
            if (t != ValueType::UINT32) {
                c.fail(field, type_at, std::string("expected uint32, got ") + value_type_name(t));
            }
            if (v.u == 0 || (v.u & (v.u - 1)) != 0) {
                c.fail(field, value_at, "alignment " + num(v.u) + " is not a non-zero power of two");
            }
            alignment_ = static_cast<uint32_t>(v.u);
        }
        kv_index_.emplace(key, kv_.size());
        kv_.emplace_back(std::move(key), std::move(v));
    }

    // ---- tensor infos ----
    std::vector<size_t> offset_at;  // where each tensor's offset field starts, for errors
    tensors_.reserve(static_cast<size_t>(tensor_count));
    offset_at.reserve(static_cast<size_t>(tensor_count));
    for (uint64_t k = 0; k < tensor_count; ++k) {
        const size_t name_at = c.pos();
        TensorInfo ti;
        ti.name = c.get_string("tensor #" + num(k) + " name");
        const std::string field = "tensor '" + ti.name + "'";
        if (tensor_index_.count(ti.name)) c.fail(field, name_at, "duplicate tensor name");

        const size_t dims_at = c.pos();
        const uint32_t n_dims = c.get<uint32_t>(field + " n_dims");
        if (n_dims < 1 || n_dims > kMaxDims) {
            c.fail(field, dims_at, "n_dims " + num(n_dims) + " outside 1.." + num(kMaxDims));
        }
        uint64_t n_elem = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const size_t ne_at = c.pos();
            const uint64_t ne = c.get<uint64_t>(field + " ne[" + num(d) + "]");
            if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                c.fail(field, ne_at, "ne[" + num(d) + "] = " + num(ne) + " is negative as int64");
            }
            if (!checked_mul(n_elem, ne, n_elem) || n_elem > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                c.fail(field, ne_at, "element count overflows int64 at ne[" + num(d) + "] = " + num(ne));
            }
            ti.ne.push_back(static_cast<int64_t>(ne));
        }

        const size_t type_at = c.pos();
        const uint32_t raw_type = c.get<uint32_t>(field + " type");
        if (!type_supported(raw_type)) {
            c.fail(field, type_at, "unsupported ggml type " + type_name(raw_type) + " (id " + num(raw_type) + ")");
        }
        ti.type = static_cast<GgmlType>(raw_type);
        const TypeTraits& tr = type_traits(ti.type);
        if (ti.ne[0] % tr.block_elems != 0) {
            c.fail(field, dims_at, "ne[0] = " + num(ti.ne[0]) + " is not a multiple of the " + tr.name +
                                       " block size " + num(tr.block_elems));
        }
        uint64_t nbytes = static_cast<uint64_t>(ti.ne[0] / tr.block_elems);
        bool ok = checked_mul(nbytes, tr.block_bytes, nbytes);
        for (size_t d = 1; d < ti.ne.size() && ok; ++d) ok = checked_mul(nbytes, static_cast<uint64_t>(ti.ne[d]), nbytes);
        if (!ok || nbytes > std::numeric_limits<size_t>::max()) c.fail(field, dims_at, "byte size overflows");
        ti.nbytes = static_cast<size_t>(nbytes);

        offset_at.push_back(c.pos());
        ti.offset = c.get<uint64_t>(field + " offset");

        tensor_index_.emplace(ti.name, tensors_.size());
        tensors_.push_back(std::move(ti));
    }

    // ---- data section ----
    // data_start = first multiple of alignment >= end of infos; c.pos() <= size < 2^63, no overflow.
    const uint64_t infos_end = c.pos();
    const uint64_t data_start = (infos_end + alignment_ - 1) / alignment_ * alignment_;
    std::vector<size_t> order(tensors_.size());
    for (size_t k = 0; k < tensors_.size(); ++k) {
        TensorInfo& ti = tensors_[k];
        const std::string field = "tensor '" + ti.name + "'";
        if (ti.offset % alignment_ != 0) {
            c.fail(field, offset_at[k], "offset " + num(ti.offset) + " is not a multiple of the alignment " +
                                            num(alignment_));
        }
        uint64_t begin, end;
        if (!checked_add(data_start, ti.offset, begin) || !checked_add(begin, ti.nbytes, end) || end > size) {
            const std::string b = checked_add(data_start, ti.offset, begin) ? num(begin) : "overflow";
            const std::string e = checked_add(begin, ti.nbytes, end) ? num(end) : "overflow";
            c.fail(field, offset_at[k], "data [" + b + ", " + e + ") past end of file (" + num(size) + " bytes)");
        }
        ti.data = data + begin;
        order[k] = k;
    }
    // No two tensors may share bytes: sort by offset and compare neighbours.
    std::sort(order.begin(), order.end(), [this](size_t a, size_t b) {
        return tensors_[a].offset < tensors_[b].offset ||
               (tensors_[a].offset == tensors_[b].offset && tensors_[a].nbytes < tensors_[b].nbytes);
    });
    // Compare each tensor with the furthest-reaching earlier one; empty tensors own no bytes.
    const TensorInfo* reach = nullptr;
    for (size_t k = 0; k < order.size(); ++k) {
        const TensorInfo& cur = tensors_[order[k]];
        if (cur.nbytes == 0) continue;
        if (reach && cur.offset < reach->offset + reach->nbytes) {
            c.fail("tensor '" + cur.name + "'", offset_at[order[k]],
                   "data [" + num(data_start + cur.offset) + ", " + num(data_start + cur.offset + cur.nbytes) +
                       ") overlaps tensor '" + reach->name + "' [" + num(data_start + reach->offset) + ", " +
                       num(data_start + reach->offset + reach->nbytes) + ")");
        }
        if (!reach || cur.offset + cur.nbytes > reach->offset + reach->nbytes) reach = &cur;
    }
}

// ---- lookups and typed getters ----

const Value* File::find(const std::string& key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::find_tensor(const std::string& name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::tensor(const std::string& name) const {
    const TensorInfo* t = find_tensor(name);
    if (!t) throw Error(path_ + ": tensor '" + name + "' not found");
    return *t;
}

namespace {

std::string type_desc(const Value& v) {
    if (v.type == ValueType::ARRAY) return std::string("array of ") + value_type_name(v.elem_type);
    return value_type_name(v.type);
}

[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const char* expected, const Value& v) {
    throw Error(path + ": key '" + key + "': expected " + expected + ", got " + type_desc(v));
}

}  // namespace

uint32_t File::get_u32(const std::string& key) const {
    const Value* v = find(key);
    if (!v) throw Error(path_ + ": key '" + key + "' is missing");
    return get_u32_or(key, 0);
}

uint32_t File::get_u32_or(const std::string& key, uint32_t dflt) const {
    const Value* v = find(key);
    if (!v) return dflt;
    if (!is_integer(v->type)) wrong_type(path_, key, "uint32", *v);
    const bool is_signed = v->type == ValueType::INT8 || v->type == ValueType::INT16 ||
                           v->type == ValueType::INT32 || v->type == ValueType::INT64;
    if (is_signed ? (v->i < 0 || v->i > int64_t{UINT32_MAX}) : v->u > UINT32_MAX) {
        throw Error(path_ + ": key '" + key + "': value " + (is_signed ? std::to_string(v->i) : num(v->u)) +
                    " (" + value_type_name(v->type) + ") does not fit in uint32");
    }
    return static_cast<uint32_t>(is_signed ? static_cast<uint64_t>(v->i) : v->u);
}

float File::get_f32(const std::string& key) const {
    if (!find(key)) throw Error(path_ + ": key '" + key + "' is missing");
    return get_f32_or(key, 0.0f);
}

float File::get_f32_or(const std::string& key, float dflt) const {
    const Value* v = find(key);
    if (!v) return dflt;
    if (!is_float(v->type)) wrong_type(path_, key, "float32", *v);
    return static_cast<float>(v->f);
}

bool File::get_bool_or(const std::string& key, bool dflt) const {
    const Value* v = find(key);
    if (!v) return dflt;
    if (v->type != ValueType::BOOL) wrong_type(path_, key, "bool", *v);
    return v->i != 0;
}

std::string File::get_string(const std::string& key) const {
    const Value* v = find(key);
    if (!v) throw Error(path_ + ": key '" + key + "' is missing");
    if (v->type != ValueType::STRING) wrong_type(path_, key, "string", *v);
    return v->s;
}

std::string File::get_string_or(const std::string& key, const std::string& dflt) const {
    if (!find(key)) return dflt;
    return get_string(key);
}

const std::vector<std::string>& File::get_string_array(const std::string& key) const {
    const Value* v = find(key);
    if (!v) throw Error(path_ + ": key '" + key + "' is missing");
    if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING) wrong_type(path_, key, "array of string", *v);
    return v->strs;
}

std::vector<int64_t> File::get_int_array(const std::string& key) const {
    const Value* v = find(key);
    if (!v) throw Error(path_ + ": key '" + key + "' is missing");
    if (v->type != ValueType::ARRAY || !(is_integer(v->elem_type) || v->elem_type == ValueType::BOOL)) {
        wrong_type(path_, key, "array of integers", *v);
    }
    if (v->elem_type == ValueType::UINT64) {
        for (size_t k = 0; k < v->ints.size(); ++k) {
            if (v->ints[k] < 0) {
                throw Error(path_ + ": key '" + key + "': element " + num(k) + " does not fit in int64");
            }
        }
    }
    return v->ints;
}

std::vector<float> File::get_float_array(const std::string& key) const {
    const Value* v = find(key);
    if (!v) throw Error(path_ + ": key '" + key + "' is missing");
    if (v->type != ValueType::ARRAY || !is_float(v->elem_type)) wrong_type(path_, key, "array of float", *v);
    return std::vector<float>(v->floats.begin(), v->floats.end());
}

}  // namespace alloy::gguf
