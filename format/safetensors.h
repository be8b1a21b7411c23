// safetensors reader (mmap). Layout: u64 LE header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to its start (8 + N). Only F32, F16 and BF16
// are accepted. Every offset is validated against the file size; errors are alloy::Error
// naming the file, the tensor and the byte offset.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace alloy {

class SafetensorsFile {
public:
    struct Tensor {
        std::string name;
        std::string dtype;           // "F32", "F16" or "BF16"
        std::vector<int64_t> shape;  // PyTorch order: shape.back() is fastest varying
        const uint8_t* data;         // into the mapping; may be unaligned (read via memcpy)
        size_t nbytes;
    };

    static std::unique_ptr<SafetensorsFile> open(const std::string& path);
    // Parses an in-memory file (fuzz target, tests). The buffer must outlive the object.
    static std::unique_ptr<SafetensorsFile> parse(const uint8_t* data, size_t size, const std::string& name);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    const std::vector<Tensor>& tensors() const { return tensors_; }  // sorted by name
    const Tensor* find(const std::string& name) const;
    // All elements converted to fp32, in storage order.
    static std::vector<float> to_f32(const Tensor& t);

private:
    SafetensorsFile() = default;
    void parse_all(const uint8_t* data, size_t size);

    std::string path_;
    std::vector<Tensor> tensors_;
    std::map<std::string, size_t> index_;
    void* map_ = nullptr;
    size_t map_size_ = 0;
};

// A checkpoint directory: model.safetensors.index.json's shards if present, else
// model.safetensors, else every *.safetensors file. A path to a single file also works.
// Exposes the union of all tensors; a name in two shards is an error.
class SafetensorsDir {
public:
    using Tensor = SafetensorsFile::Tensor;
    static std::unique_ptr<SafetensorsDir> open(const std::string& dir);

    const std::vector<const Tensor*>& tensors() const { return tensors_; }  // sorted by name
    const Tensor* find(const std::string& name) const;
    static std::vector<float> to_f32(const Tensor& t) { return SafetensorsFile::to_f32(t); }
    const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

private:
    std::vector<std::unique_ptr<SafetensorsFile>> files_;
    std::vector<const Tensor*> tensors_;
    std::map<std::string, const Tensor*> index_;
};

}  // namespace alloy
