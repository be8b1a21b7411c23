// GGUF v3 reader (mmap, every field validated against the file size) and writer.
// Layout facts: spec/GGUF.md section 1. Errors are alloy::Error naming the file, the field
// and its byte offset.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/ggml_types.h"
#include "format/resident_bytes.h"

namespace alloy::gguf {

enum class ValueType : uint32_t {
    UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6,
    BOOL = 7, STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars are widened into i/u/f; arrays keep their element type and
// store elements in the matching vector (strings in `strs`, integers/bools in `ints`,
// floats in `floats`). Nested arrays are rejected by the reader. The reader also fills `u`
// for signed values >= 0 and `i` for unsigned values <= INT64_MAX, so either field can be
// read when the value fits.
struct Value {
    ValueType type = ValueType::UINT32;
    ValueType elem_type = ValueType::UINT32;  // for ARRAY
    int64_t i = 0;                            // signed ints, bool
    uint64_t u = 0;                           // unsigned ints
    double f = 0;                             // floats
    std::string s;                            // STRING
    std::vector<std::string> strs;            // ARRAY of STRING
    std::vector<int64_t> ints;                // ARRAY of any integer type or BOOL
    std::vector<double> floats;               // ARRAY of FLOAT32/FLOAT64

    static Value u32(uint32_t v);
    static Value i32(int32_t v);
    static Value f32(float v);
    static Value boolean(bool v);
    static Value str(std::string v);
    static Value str_array(std::vector<std::string> v);
    static Value i32_array(std::vector<int32_t> v);
    static Value f32_array(std::vector<float> v);
    // Added: the remaining scalar and array types, for writers and tests.
    static Value u64(uint64_t v);
    static Value i64(int64_t v);
    static Value f64(double v);
    static Value integer(ValueType t, int64_t v);  // any integer type except UINT64 > INT64_MAX
    static Value int_array(ValueType elem, std::vector<int64_t> v);  // UINT64 elements bit-cast
    static Value f64_array(std::vector<double> v);
    size_t array_size() const;
};

struct TensorInfo {
    std::string name;
    GgmlType type = GgmlType::F32;
    std::vector<int64_t> ne;    // ne[0] fastest varying; 1..4 dims
    uint64_t offset = 0;        // relative to the data section
    const uint8_t* data = nullptr;  // into the mapping, or the resident copy (reader only)
    size_t nbytes = 0;
    int64_t n_elements() const;
};

// Where a File's tensor bytes live: in the read-only file mapping (instant open, pages shared
// with the page cache), or read into anonymous memory on 2 MiB pages (resident_bytes.h: the
// faster layout for streaming weights; what the model-running commands use unless --mmap).
enum class TensorData { Mapped, Resident };

class File {
public:
    // mmaps and fully validates the file; throws alloy::Error on any problem. With
    // TensorData::Resident the tensor bytes are then read into memory and every
    // TensorInfo::data points there, unless they exceed 90% of `memory_limit` (default: the
    // memory available now), in which case they stay mapped (a model larger than memory
    // still runs, paged from the file, instead of being killed for lack of memory).
    static std::unique_ptr<File> open(const std::string& path, TensorData where = TensorData::Mapped,
                                      uint64_t memory_limit = 0);
    // Parses an in-memory buffer (used by the fuzz target and tests). The buffer must
    // outlive the File.
    static std::unique_ptr<File> parse(const uint8_t* data, size_t size, const std::string& name);
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;

    const std::string& path() const { return path_; }
    bool resident() const { return resident_.size() > 0; }  // tensor bytes read into memory
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }

    const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
    const Value* find(const std::string& key) const;
    bool has(const std::string& key) const { return find(key) != nullptr; }
    // Typed getters: throw alloy::Error naming the file and key if missing or wrong type.
    // Integer getters accept any integer type whose value fits.
    uint32_t get_u32(const std::string& key) const;
    uint32_t get_u32_or(const std::string& key, uint32_t dflt) const;
    float get_f32(const std::string& key) const;
    float get_f32_or(const std::string& key, float dflt) const;
    bool get_bool_or(const std::string& key, bool dflt) const;
    std::string get_string(const std::string& key) const;
    std::string get_string_or(const std::string& key, const std::string& dflt) const;
    const std::vector<std::string>& get_string_array(const std::string& key) const;
    std::vector<int64_t> get_int_array(const std::string& key) const;
    std::vector<float> get_float_array(const std::string& key) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(const std::string& name) const;
    // Throws naming the file and tensor if absent.
    const TensorInfo& tensor(const std::string& name) const;

private:
    File() = default;
    void parse_all(const uint8_t* data, size_t size);

    std::string path_;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    std::vector<std::pair<std::string, Value>> kv_;
    std::map<std::string, size_t> kv_index_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t> tensor_index_;
    void* map_ = nullptr;
    size_t map_size_ = 0;
    ResidentBytes resident_;
};

// Writes a GGUF v3 file: metadata in insertion order, tensors aligned to `alignment`.
class Writer {
public:
    explicit Writer(uint32_t alignment = 32) : alignment_(alignment) {}
    void set(const std::string& key, Value v);  // replaces an existing key
    // Adds a tensor whose bytes are already in `type`'s layout (size checked against ne).
    void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                    std::vector<uint8_t> bytes);
    // Convenience: quantizes fp32 values to `type` row by row (ne[0] is the row length).
    void add_tensor_f32(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                        const float* values);
    // fp32 values of a tensor of shape ne in `type`'s layout (rows of ne[0], each quantized on
    // its own, so big tensors use every core with the same bytes); out is resized.
    static void encode_f32(GgmlType type, const std::vector<int64_t>& ne, const float* values,
                           std::vector<uint8_t>& out);
    // Declares a tensor whose bytes are produced only when write() reaches it, so a file
    // larger than memory is written one tensor at a time (alloy quantize, alloy synth).
    void declare_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne);
    // Called once per declared tensor, in order, with its index among all tensors; must fill
    // `out` with exactly the tensor's byte size (checked).
    using TensorBytes = std::function<void(size_t index, std::vector<uint8_t>& out)>;
    void write(const std::string& path) const;  // throws alloy::Error naming the path
    void write(const std::string& path, const TensorBytes& produce) const;
    size_t tensor_count() const { return tensors_.size(); }

private:
    uint32_t alignment_;
    std::vector<std::pair<std::string, Value>> kv_;
    struct PendingTensor {
        std::string name;
        GgmlType type;
        std::vector<int64_t> ne;
        std::vector<uint8_t> bytes;
        size_t nbytes = 0;
        bool declared = false;  // bytes come from write()'s producer
    };
    std::vector<PendingTensor> tensors_;
};

}  // namespace alloy::gguf
