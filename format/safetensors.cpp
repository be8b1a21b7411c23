// safetensors reader: the JSON header is untrusted, so every field's type, every offset and
// every size is checked before a pointer into the mapping is handed out.
#include "format/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "alloy/error.h"
#include "format/mapped_file.h"
#include "format/quant.h"

namespace alloy {

namespace {

using json = nlohmann::json;

constexpr int kMaxJsonDepth = 8;  // the format needs 3; bounds the parser on hostile input

size_t dtype_size(const std::string& dtype) {
    if (dtype == "F32") return 4;
    if (dtype == "F16" || dtype == "BF16") return 2;
    return 0;
}

std::string num(uint64_t v) { return std::to_string(v); }

[[noreturn]] void fail_at(const std::string& path, const std::string& field, uint64_t at, const std::string& what) {
    throw Error(path + ": " + field + " at offset " + num(at) + ": " + what);
}

}  // namespace

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = path;
    f->map_ = map_file(path, f->map_size_);
    f->parse_all(static_cast<const uint8_t*>(f->map_), f->map_size_);
    return f;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::parse(const uint8_t* data, size_t size, const std::string& name) {
    std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
    f->path_ = name;
    f->parse_all(data, data ? size : 0);
    return f;
}

SafetensorsFile::~SafetensorsFile() { unmap_file(map_, map_size_); }

void SafetensorsFile::parse_all(const uint8_t* data, size_t size) {
    auto fail = [this](const std::string& field, uint64_t at, const std::string& what) {
        fail_at(path_, field, at, what);
    };
    if (size < 8) fail("header length", 0, "file has only " + num(size) + " bytes");
    uint64_t header_len;
    std::memcpy(&header_len, data, 8);
    if (header_len > size - 8) {
        fail("header length", 0, "header of " + num(header_len) + " bytes past end of file (" + num(size) + " bytes)");
    }
    const size_t data_start = 8 + static_cast<size_t>(header_len);
    const char* hbegin = reinterpret_cast<const char*>(data + 8);
    const std::string_view header(hbegin, static_cast<size_t>(header_len));

    json root;
    try {
        root = json::parse(hbegin, hbegin + header_len, [&](int depth, json::parse_event_t, json&) {
            if (depth > kMaxJsonDepth) fail("header", 8, "JSON nested deeper than " + num(kMaxJsonDepth));
            return true;
        });
    } catch (const json::exception& e) {
        fail("header", 8, std::string("invalid JSON: ") + e.what());
    }
    if (!root.is_object()) fail("header", 8, "JSON header is not an object");

    const uint64_t data_size = size - data_start;
    struct Range {
        uint64_t begin, end;
        size_t tensor;
    };
    std::vector<Range> ranges;
    for (auto it = root.begin(); it != root.end(); ++it) {
        const std::string& name = it.key();
        if (name == "__metadata__") continue;  // free-form string map; nothing we need
        // Point errors at the tensor's key inside the header when it can be found verbatim.
        const size_t key_pos = header.find("\"" + name + "\"");
        const uint64_t at = key_pos == std::string_view::npos ? 8 : 8 + key_pos;
        const std::string field = "tensor '" + name + "'";
        const json& e = it.value();
        if (!e.is_object()) fail(field, at, "entry is not an object");

        Tensor t{name, "", {}, nullptr, 0};
        auto dt = e.find("dtype");
        if (dt == e.end() || !dt->is_string()) fail(field, at, "missing or non-string \"dtype\"");
        t.dtype = dt->get<std::string>();
        const size_t esize = dtype_size(t.dtype);
        if (esize == 0) fail(field, at, "unsupported dtype '" + t.dtype + "' (F32, F16, BF16 are supported)");

        auto sh = e.find("shape");
        if (sh == e.end() || !sh->is_array()) fail(field, at, "missing or non-array \"shape\"");
        uint64_t n_elem = 1;
        for (const json& d : *sh) {
            if (!d.is_number_unsigned()) fail(field, at, "shape entry " + d.dump() + " is not a non-negative integer");
            const uint64_t v = d.get<uint64_t>();
            if (v > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(n_elem, v, &n_elem)) {
                fail(field, at, "shape " + sh->dump() + " overflows");
            }
            t.shape.push_back(static_cast<int64_t>(v));
        }
        uint64_t nbytes;
        if (__builtin_mul_overflow(n_elem, esize, &nbytes)) fail(field, at, "shape " + sh->dump() + " overflows");

        auto off = e.find("data_offsets");
        if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
            !(*off)[1].is_number_unsigned()) {
            fail(field, at, "\"data_offsets\" must be two non-negative integers");
        }
        const uint64_t begin = (*off)[0].get<uint64_t>(), end = (*off)[1].get<uint64_t>();
        if (begin > end || end > data_size) {
            fail(field, at, "data_offsets [" + num(begin) + ", " + num(end) + ") outside the data section of " +
                                num(data_size) + " bytes (file " + num(size) + " bytes)");
        }
        if (end - begin != nbytes) {
            fail(field, data_start + begin, "data_offsets span " + num(end - begin) + " bytes but shape " +
                                                sh->dump() + " of " + t.dtype + " needs " + num(nbytes));
        }
        t.data = data + data_start + begin;
        t.nbytes = static_cast<size_t>(nbytes);
        ranges.push_back({begin, end, tensors_.size()});
        tensors_.push_back(std::move(t));
    }

    std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
    const Range* reach = nullptr;  // the furthest-reaching non-empty range so far
    for (const Range& r : ranges) {
        if (r.begin == r.end) continue;
        if (reach && r.begin < reach->end) {
            fail("tensor '" + tensors_[r.tensor].name + "'", data_start + r.begin,
                 "data_offsets [" + num(r.begin) + ", " + num(r.end) + ") overlap tensor '" +
                     tensors_[reach->tensor].name + "' [" + num(reach->begin) + ", " + num(reach->end) + ")");
        }
        if (!reach || r.end > reach->end) reach = &r;
    }

    // nlohmann's object iterates in key order, so tensors_ is already sorted by name.
    for (size_t k = 0; k < tensors_.size(); ++k) index_.emplace(tensors_[k].name, k);
}

const SafetensorsFile::Tensor* SafetensorsFile::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<float> SafetensorsFile::to_f32(const Tensor& t) {
    const size_t esize = dtype_size(t.dtype);
    std::vector<float> out(esize ? t.nbytes / esize : 0);
    if (out.empty()) return out;
    if (t.dtype == "F32") {
        std::memcpy(out.data(), t.data, out.size() * 4);
        return out;
    }
    for (size_t i = 0; i < out.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = t.dtype == "F16" ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
    return out;
}

}  // namespace alloy
