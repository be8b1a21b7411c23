// A view of one weight matrix as GGUF stores it: n_out rows of n_in elements each, every row
// in the tensor's own ggml type (PyTorch's [out, in] Linear layout, ggml ne = {n_in, n_out}).
#pragma once
#include <cstddef>
#include <cstdint>

#include "format/ggml_types.h"

namespace alloy {

struct WeightView {
    GgmlType type = GgmlType::F32;
    int64_t n_in = 0;    // ne[0]: elements per row
    int64_t n_out = 0;   // ne[1]: rows
    const uint8_t* data = nullptr;
    size_t row_bytes = 0;
    const uint8_t* row(int64_t r) const { return data + size_t(r) * row_bytes; }
};

}  // namespace alloy
