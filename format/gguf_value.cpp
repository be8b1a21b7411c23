// gguf::Value constructors and type names, shared by the reader and the writer.
#include <cstdint>
#include <limits>

#include "alloy/error.h"
#include "format/gguf.h"

namespace alloy::gguf {

const char* value_type_name(ValueType t) {
    switch (t) {
        case ValueType::UINT8: return "uint8";
        case ValueType::INT8: return "int8";
        case ValueType::UINT16: return "uint16";
        case ValueType::INT16: return "int16";
        case ValueType::UINT32: return "uint32";
        case ValueType::INT32: return "int32";
        case ValueType::FLOAT32: return "float32";
        case ValueType::BOOL: return "bool";
        case ValueType::STRING: return "string";
        case ValueType::ARRAY: return "array";
        case ValueType::UINT64: return "uint64";
        case ValueType::INT64: return "int64";
        case ValueType::FLOAT64: return "float64";
    }
    return "unknown";
}

namespace {

bool is_unsigned(ValueType t) {
    return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}

}  // namespace

Value Value::integer(ValueType t, int64_t v) {
    Value r;
    r.type = t;
    if (is_unsigned(t) && v < 0) {
        throw Error(std::string("gguf::Value::integer: negative value for ") + value_type_name(t));
    }
    r.i = v;
    r.u = v >= 0 ? static_cast<uint64_t>(v) : 0;
    return r;
}

Value Value::u32(uint32_t v) { return integer(ValueType::UINT32, v); }
Value Value::i32(int32_t v) { return integer(ValueType::INT32, v); }
Value Value::i64(int64_t v) { return integer(ValueType::INT64, v); }

Value Value::u64(uint64_t v) {
    Value r;
    r.type = ValueType::UINT64;
    r.u = v;
    r.i = v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? static_cast<int64_t>(v) : 0;
    return r;
}

Value Value::f32(float v) {
    Value r;
    r.type = ValueType::FLOAT32;
    r.f = v;
    return r;
}

Value Value::f64(double v) {
    Value r;
    r.type = ValueType::FLOAT64;
    r.f = v;
    return r;
}

Value Value::boolean(bool v) {
    Value r;
    r.type = ValueType::BOOL;
    r.i = v ? 1 : 0;
    r.u = r.i;
    return r;
}

Value Value::str(std::string v) {
    Value r;
    r.type = ValueType::STRING;
    r.s = std::move(v);
    return r;
}

Value Value::str_array(std::vector<std::string> v) {
    Value r;
    r.type = ValueType::ARRAY;
    r.elem_type = ValueType::STRING;
    r.strs = std::move(v);
    return r;
}

Value Value::int_array(ValueType elem, std::vector<int64_t> v) {
    Value r;
    r.type = ValueType::ARRAY;
    r.elem_type = elem;
    r.ints = std::move(v);
    return r;
}

Value Value::i32_array(std::vector<int32_t> v) {
    return int_array(ValueType::INT32, std::vector<int64_t>(v.begin(), v.end()));
}

Value Value::f32_array(std::vector<float> v) {
    Value r;
    r.type = ValueType::ARRAY;
    r.elem_type = ValueType::FLOAT32;
    r.floats.assign(v.begin(), v.end());
    return r;
}

Value Value::f64_array(std::vector<double> v) {
    Value r;
    r.type = ValueType::ARRAY;
    r.elem_type = ValueType::FLOAT64;
    r.floats = std::move(v);
    return r;
}

size_t Value::array_size() const {
    if (type != ValueType::ARRAY) return 0;
    switch (elem_type) {
        case ValueType::STRING: return strs.size();
        case ValueType::FLOAT32:
        case ValueType::FLOAT64: return floats.size();
        default: return ints.size();
    }
}

}  // namespace alloy::gguf
