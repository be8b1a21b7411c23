// GGUF v3 writer. Metadata in insertion order, then tensor infos, then each tensor's bytes
// padded to `alignment`. Written to "<path>.tmp" and renamed, so a reader never sees half a file.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <limits>
#include <thread>
#include <vector>

#include "alloy/error.h"
#include "format/gguf.h"
#include "format/quant.h"

namespace alloy::gguf {

namespace {

constexpr uint32_t kDefaultAlignment = 32;

class Bytes {
public:
    template <class T>
    void put(T v) {
        const size_t at = b_.size();
        b_.resize(at + sizeof(T));
        std::memcpy(b_.data() + at, &v, sizeof(T));
    }
    void put_str(const std::string& s) {
        put<uint64_t>(s.size());
        b_.insert(b_.end(), s.begin(), s.end());
    }
    void pad_to(size_t alignment) {
        while (b_.size() % alignment) b_.push_back(0);
    }
    const std::vector<uint8_t>& data() const { return b_; }

private:
    std::vector<uint8_t> b_;
};

// Range of each integer type as [lo, hi] in int64 (UINT64 handled separately).
bool int_fits(ValueType t, int64_t v) {
    switch (t) {
        case ValueType::UINT8: return v >= 0 && v <= 0xFF;
        case ValueType::INT8: return v >= -128 && v <= 127;
        case ValueType::UINT16: return v >= 0 && v <= 0xFFFF;
        case ValueType::INT16: return v >= -32768 && v <= 32767;
        case ValueType::UINT32: return v >= 0 && v <= int64_t{0xFFFFFFFF};
        case ValueType::INT32: return v >= INT32_MIN && v <= INT32_MAX;
        case ValueType::INT64: return true;
        case ValueType::BOOL: return v == 0 || v == 1;
        default: return false;
    }
}

void put_int(Bytes& b, ValueType t, int64_t v) {
    switch (t) {
        case ValueType::UINT8:
        case ValueType::INT8:
        case ValueType::BOOL: b.put<uint8_t>(static_cast<uint8_t>(v)); break;
        case ValueType::UINT16:
        case ValueType::INT16: b.put<uint16_t>(static_cast<uint16_t>(v)); break;
        case ValueType::UINT32:
        case ValueType::INT32: b.put<uint32_t>(static_cast<uint32_t>(v)); break;
        default: b.put<uint64_t>(static_cast<uint64_t>(v)); break;
    }
}

void put_value(Bytes& b, const Value& v, const std::string& where) {
    auto bad = [&](const std::string& what) { throw Error(where + ": " + what); };
    b.put<uint32_t>(static_cast<uint32_t>(v.type));
    switch (v.type) {
        case ValueType::STRING: b.put_str(v.s); return;
        case ValueType::FLOAT32: b.put<float>(static_cast<float>(v.f)); return;
        case ValueType::FLOAT64: b.put<double>(v.f); return;
        case ValueType::UINT64: b.put<uint64_t>(v.u); return;
        case ValueType::UINT8:
        case ValueType::UINT16:
        case ValueType::UINT32: {
            if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
                !int_fits(v.type, static_cast<int64_t>(v.u))) {
                bad("value " + std::to_string(v.u) + " does not fit in " + value_type_name(v.type));
            }
            put_int(b, v.type, static_cast<int64_t>(v.u));
            return;
        }
        case ValueType::INT8:
        case ValueType::INT16:
        case ValueType::INT32:
        case ValueType::INT64:
        case ValueType::BOOL:
            if (!int_fits(v.type, v.i)) bad("value " + std::to_string(v.i) + " does not fit in " + value_type_name(v.type));
            put_int(b, v.type, v.i);
            return;
        case ValueType::ARRAY: break;
    }
    b.put<uint32_t>(static_cast<uint32_t>(v.elem_type));
    b.put<uint64_t>(v.array_size());
    switch (v.elem_type) {
        case ValueType::ARRAY: throw Error(where + ": nested arrays are not supported");
        case ValueType::STRING:
            for (const std::string& s : v.strs) b.put_str(s);
            return;
        case ValueType::FLOAT32:
            for (double f : v.floats) b.put<float>(static_cast<float>(f));
            return;
        case ValueType::FLOAT64:
            for (double f : v.floats) b.put<double>(f);
            return;
        default:
            for (int64_t x : v.ints) {
                if (v.elem_type != ValueType::UINT64 && !int_fits(v.elem_type, x)) {
                    bad("array element " + std::to_string(x) + " does not fit in " + value_type_name(v.elem_type));
                }
                put_int(b, v.elem_type, x);
            }
            return;
    }
}

// Byte size of a tensor of `type` and shape `ne`, validating the shape (throws naming it).
size_t tensor_nbytes(const std::string& name, GgmlType type, const std::vector<int64_t>& ne) {
    const std::string where = "gguf::Writer: tensor '" + name + "'";
    if (ne.empty() || ne.size() > 4) throw Error(where + ": needs 1..4 dims, got " + std::to_string(ne.size()));
    const TypeTraits& tr = type_traits(type);
    uint64_t n = 1;
    for (int64_t d : ne) {
        if (d < 0) throw Error(where + ": negative dimension " + std::to_string(d));
        if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) throw Error(where + ": element count overflows");
    }
    if (ne[0] % tr.block_elems != 0) {
        throw Error(where + ": ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the " + tr.name +
                    " block size " + std::to_string(tr.block_elems));
    }
    return static_cast<size_t>(n / tr.block_elems) * tr.block_bytes;
}

}  // namespace

void Writer::set(const std::string& key, Value v) {
    for (auto& kv : kv_) {
        if (kv.first == key) {
            kv.second = std::move(v);
            return;
        }
    }
    kv_.emplace_back(key, std::move(v));
}

void Writer::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne, std::vector<uint8_t> bytes) {
    for (const PendingTensor& t : tensors_) {
        if (t.name == name) throw Error("gguf::Writer: duplicate tensor '" + name + "'");
    }
    const size_t nbytes = tensor_nbytes(name, type, ne);
    if (bytes.size() != nbytes) {
        throw Error("gguf::Writer: tensor '" + name + "': " + std::to_string(bytes.size()) + " bytes given, " +
                    type_traits(type).name + " shape needs " + std::to_string(nbytes));
    }
    tensors_.push_back({name, type, std::move(ne), std::move(bytes), nbytes, false});
}

void Writer::declare_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne) {
    for (const PendingTensor& t : tensors_) {
        if (t.name == name) throw Error("gguf::Writer: duplicate tensor '" + name + "'");
    }
    const size_t nbytes = tensor_nbytes(name, type, ne);
    tensors_.push_back({name, type, std::move(ne), {}, nbytes, true});
}

void Writer::encode_f32(GgmlType type, const std::vector<int64_t>& ne, const float* values, std::vector<uint8_t>& out) {
    out.resize(tensor_nbytes("encode_f32", type, ne));
    const int64_t row = ne.empty() ? 0 : ne[0];
    if (row <= 0) return;
    int64_t rows = 1;
    for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
    const size_t rb = row_bytes(type, row);
    uint8_t* bytes = out.data();
    auto run = [=](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) quantize_row(type, values + r * row, bytes + r * rb, row);
    };
    const int64_t threads =
        std::min<int64_t>(std::max(1u, std::thread::hardware_concurrency()), rows * row / (1 << 22) + 1);
    const int64_t per = (rows + threads - 1) / threads;
    std::vector<std::thread> pool;
    for (int64_t t = 1; t < threads; ++t) pool.emplace_back(run, std::min(rows, t * per), std::min(rows, (t + 1) * per));
    run(0, std::min(rows, per));
    for (std::thread& th : pool) th.join();
}

void Writer::add_tensor_f32(const std::string& name, GgmlType type, std::vector<int64_t> ne, const float* values) {
    tensor_nbytes(name, type, ne);  // checks the shape, naming the tensor
    std::vector<uint8_t> bytes;
    encode_f32(type, ne, values, bytes);
    add_tensor(name, type, std::move(ne), std::move(bytes));
}

void Writer::write(const std::string& path) const {
    write(path, [](size_t index, std::vector<uint8_t>&) {
        throw Error("gguf::Writer: tensor #" + std::to_string(index) + " was declared but no producer was given");
    });
}

void Writer::write(const std::string& path, const TensorBytes& produce) const {
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) {
        throw Error(path + ": alignment " + std::to_string(alignment_) + " is not a non-zero power of two");
    }
    // general.alignment must agree with the layout we write; add it when non-default.
    std::vector<std::pair<std::string, Value>> kv = kv_;
    bool has_alignment = false;
    for (const auto& [key, v] : kv) {
        if (key != "general.alignment") continue;
        has_alignment = true;
        if (v.type != ValueType::UINT32 || v.u != alignment_) {
            throw Error(path + ": key 'general.alignment' disagrees with the writer's alignment " +
                        std::to_string(alignment_));
        }
    }
    if (!has_alignment && alignment_ != kDefaultAlignment) kv.emplace_back("general.alignment", Value::u32(alignment_));

    Bytes h;
    h.put<uint32_t>(0x46554747);  // "GGUF"
    h.put<uint32_t>(3);
    h.put<uint64_t>(tensors_.size());
    h.put<uint64_t>(kv.size());
    for (const auto& [key, v] : kv) {
        h.put_str(key);
        put_value(h, v, path + ": key '" + key + "'");
    }
    uint64_t offset = 0;
    for (const PendingTensor& t : tensors_) {
        h.put_str(t.name);
        h.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
        for (int64_t d : t.ne) h.put<uint64_t>(static_cast<uint64_t>(d));
        h.put<uint32_t>(static_cast<uint32_t>(t.type));
        h.put<uint64_t>(offset);
        offset += (t.nbytes + alignment_ - 1) / alignment_ * alignment_;
    }
    h.pad_to(alignment_);

    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw Error(path + ": cannot create " + tmp + ": " + std::strerror(errno));
    bool ok = std::fwrite(h.data().data(), 1, h.data().size(), f) == h.data().size();
    static const uint8_t kZeros[256] = {};
    std::vector<uint8_t> produced;
    try {
        for (size_t i = 0; i < tensors_.size() && ok; ++i) {
            const PendingTensor& t = tensors_[i];
            const std::vector<uint8_t>* bytes = &t.bytes;
            if (t.declared) {
                produced.clear();
                produce(i, produced);
                if (produced.size() != t.nbytes) {
                    throw Error(path + ": tensor '" + t.name + "': producer gave " + std::to_string(produced.size()) +
                                " bytes, its shape needs " + std::to_string(t.nbytes));
                }
                bytes = &produced;
            }
            if (!bytes->empty()) ok = std::fwrite(bytes->data(), 1, bytes->size(), f) == bytes->size();
            for (size_t pad = (alignment_ - bytes->size() % alignment_) % alignment_; ok && pad > 0;) {
                const size_t n = pad < sizeof kZeros ? pad : sizeof kZeros;
                ok = std::fwrite(kZeros, 1, n, f) == n;
                pad -= n;
            }
        }
    } catch (...) {
        std::fclose(f);
        std::remove(tmp.c_str());
        throw;
    }
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        std::remove(tmp.c_str());
        throw Error(path + ": write failed: " + std::strerror(err));
    }
}

}  // namespace alloy::gguf
