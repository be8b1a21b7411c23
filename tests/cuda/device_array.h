// A device copy of a host vector for the CUDA tests, freed on scope exit; every CUDA call's
// status is checked with GoogleTest. Also a weight as the kernels take it (DeviceWeight) and
// the tests' error measure, max_rel.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/ops.h"
#include "kernels/ref/weight.h"

namespace alloy::test {

template <class T>
struct DeviceArray {
    T* p = nullptr;
    size_t n = 0;
    explicit DeviceArray(const std::vector<T>& h) : n(h.size()) {
        EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
        if (n) {
            EXPECT_EQ(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
        }
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    ~DeviceArray() { cudaFree(p); }
    std::vector<T> host() const {
        std::vector<T> h(n);
        if (n) {
            EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
        }
        return h;
    }
};

// A weight matrix on the device as the CUDA kernels take it: GGUF's rows copied (host: a view
// of host bytes), block types then split (cuda::split_blocks, the layout their CUDA kernels read).
struct DeviceWeight {
    DeviceArray<uint8_t> stored, split;
    WeightView view;
    explicit DeviceWeight(const WeightView& host)
        : stored(std::vector<uint8_t>(host.data, host.data + size_t(host.n_out) * host.row_bytes)),
          split(std::vector<uint8_t>(cuda::split_blocks_supported(host.type) ? size_t(host.n_out) * host.row_bytes : 0)) {
        view = host;
        view.data = stored.p;
        if (cuda::split_blocks_supported(host.type)) {
            view = cuda::split_blocks(view, split.p);
            EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
    }
};

// max |a - b| / max |b| (0 for empty arrays; the absolute difference when b is all zeros;
// infinite for a size mismatch or a non-finite a).
inline double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double worst = 0, scale = 0;
    for (float x : b) scale = std::max(scale, double(std::fabs(x)));
    for (size_t i = 0; i < a.size(); ++i) {
        if (!std::isfinite(a[i])) return INFINITY;
        worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
    }
    return scale > 0 ? worst / scale : worst;
}

}  // namespace alloy::test
