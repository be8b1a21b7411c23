// A device copy of a host vector for the CUDA tests, freed on scope exit; every CUDA call's
// status is checked with GoogleTest.
#pragma once
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

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

}  // namespace alloy::test
