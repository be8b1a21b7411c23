// cuda::kv_store against ref::kv_store, bit for bit: random fp32 values of every magnitude,
// random bit patterns (so NaNs with payloads, infinities, fp32 subnormals), and the rounding
// edges ref defines (f16: ties to even, the subnormal half range and its 2^-25 tie to zero,
// 65504 / 65520 overflow; bf16: ties, overflow to inf, NaN quieting), for odd n and unaligned
// pointers (the scalar path) as well as aligned ones (the vector path). Skips without a device,
// except the type check, which runs before any device call.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/ggml_types.h"
#include "kernels/cuda/gdn.h"  // cuda::device_available
#include "kernels/cuda/ops.h"
#include "kernels/ref/kv_store.h"
#include "tests/cuda/device_array.h"

namespace alloy {
namespace {

using test::DeviceArray;

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// The edges, each with both signs, then random values: normals over the whole exponent range,
// values near the f16 range's ends, and raw bit patterns.
std::vector<float> make_values(size_t n, uint32_t seed) {
    std::vector<uint32_t> bits = {
        0x00000000, 0x00000001, 0x007FFFFF, 0x00800000,  // zero, fp32 subnormals, smallest normal
        0x7F800000, 0x7F800001, 0x7FC00000, 0x7FBFFFFF, 0x7FFFE000, 0x7F802000,  // inf, NaNs (signalling, quiet, payloads)
        0x33000000, 0x33000001, 0x337FFFFF, 0x33800000,  // 2^-25 (tie to 0), just above, 2^-24 (smallest half)
        0x38800000, 0x387FFFFF, 0x387FE000, 0x387FF000,  // 2^-14 (smallest normal half) and just below
        0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FFFFF, 0x47800000,  // 65504, just below 65520, 65520, above
        0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001,  // f16 ties at 1 (to even: down, up), neighbours
        0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001,  // bf16 ties at 1, neighbours
        0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF,              // FLT_MAX (bf16: rounds to inf), the tie below it
        0x3A000000, 0x33C00000, 0x34200000, 0x33A00000,  // half subnormals with ties (1.5, 2.5 units)
    };
    const size_t edges = bits.size();
    for (size_t i = 0; i < edges; ++i) bits.push_back(bits[i] | 0x80000000u);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<uint32_t> any;
    std::uniform_real_distribution<float> ue(-40.0f, 20.0f), um(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        if (i < bits.size()) {
            v[i] = from_bits(bits[i]);
            continue;
        }
        switch (i % 4) {
            case 0: v[i] = from_bits(any(rng)); break;                          // any pattern
            case 1: v[i] = um(rng) * std::exp2(ue(rng)); break;                  // 2^-40 .. 2^20
            case 2: v[i] = um(rng) * 65536.0f; break;                            // the f16 top end
            default: v[i] = um(rng) * std::exp2(-14.0f - 11.0f * (um(rng) + 1.0f) / 2.0f); break;  // half subnormals
        }
    }
    return v;
}

TEST(CudaKvStore, MatchesReferenceBitForBit) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const std::vector<float> values = make_values(300007, 11);
    DeviceArray<float> src(values);
    // (n, src offset, dst offset in elements): odd n, the vector path (aligned) and the scalar
    // path (src or dst off their vector alignment).
    struct Case { int64_t n, so, dof; };
    const Case cases[] = {{1, 0, 0}, {7, 0, 0}, {96, 0, 0}, {1001, 0, 0}, {300007, 0, 0}, {300000, 4, 4},
                          {1001, 1, 0}, {1001, 0, 1}, {299999, 3, 3}, {300003, 4, 2}};
    for (GgmlType type : {GgmlType::F16, GgmlType::BF16, GgmlType::F32}) {
        const size_t eb = ref::kv_elem_bytes(type);
        for (const Case& c : cases) {
            std::vector<uint8_t> want((size_t(c.n) + size_t(c.dof)) * eb + 16, 0x5A);
            ref::kv_store(values.data() + c.so, want.data() + size_t(c.dof) * eb, type, c.n);
            DeviceArray<uint8_t> dst(std::vector<uint8_t>(want.size(), 0x5A));
            cuda::kv_store(src.p + c.so, dst.p + size_t(c.dof) * eb, type, c.n);
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
            const std::vector<uint8_t> got = dst.host();
            const std::string what = std::string(type_traits(type).name) + " n " + std::to_string(c.n) + " src +" +
                                     std::to_string(c.so) + " dst +" + std::to_string(c.dof);
            // Every element bit-equal, and nothing outside [dst, dst + n) written.
            size_t first_bad = want.size();
            for (size_t i = 0; i < want.size(); ++i)
                if (got[i] != want[i]) {
                    first_bad = i;
                    break;
                }
            EXPECT_EQ(first_bad, want.size()) << what << ": first differing byte " << first_bad << " (element "
                                              << (first_bad / eb - size_t(c.dof)) << ")";
        }
    }
}

// The stores are plain kernels / copies on the stream: a captured graph replays them.
TEST(CudaKvStore, GraphReplayStores) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const std::vector<float> values = make_values(4099, 12);
    DeviceArray<float> src(values);
    std::vector<uint16_t> want(values.size());
    ref::kv_store(values.data(), want.data(), GgmlType::BF16, int64_t(values.size()));
    DeviceArray<uint16_t> dst(std::vector<uint16_t>(values.size(), 0));
    cudaStream_t st;
    ASSERT_EQ(cudaStreamCreate(&st), cudaSuccess);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal), cudaSuccess);
    cuda::kv_store(src.p, dst.p, GgmlType::BF16, int64_t(values.size()), st);
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(0, std::memcmp(dst.host().data(), want.data(), want.size() * 2));
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(st);
}

// kv_store_rows: rows of three sequences go to their slots' caches at their positions (read on
// the device), with kv_store's bits, for every type; rows and places nobody wrote keep their
// bytes.
TEST(CudaKvStore, RowsGoToTheirSlotsAtTheirPositions) {
    if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
    const int64_t cols = 2 * 256 + 4, n_ctx = 40;  // odd multiple of 4
    const std::vector<int32_t> slot = {1, 1, 1, 0, 2, 2};
    const std::vector<int32_t> pos = {5, 6, 7, 0, 38, 39};
    const int64_t T = int64_t(slot.size());
    const std::vector<float> values = make_values(size_t(T * cols), 21);
    DeviceArray<float> src(values);
    DeviceArray<int32_t> dslot(slot), dpos(pos);
    for (GgmlType ty : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
        const size_t eb = ref::kv_elem_bytes(ty), cache_bytes = size_t(n_ctx * cols) * eb;
        std::vector<std::vector<uint8_t>> want(3, std::vector<uint8_t>(cache_bytes, 0xA5));
        std::vector<std::unique_ptr<DeviceArray<uint8_t>>> caches;
        std::vector<void*> ptrs;
        for (auto& w : want) {
            caches.push_back(std::make_unique<DeviceArray<uint8_t>>(w));
            ptrs.push_back(caches.back()->p);
        }
        for (int64_t t = 0; t < T; ++t)
            ref::kv_store(values.data() + t * cols, want[size_t(slot[size_t(t)])].data() + size_t(pos[size_t(t)] * cols) * eb, ty, cols);
        DeviceArray<void*> tab(ptrs);
        cuda::kv_store_rows(src.p, T, cols, tab.p, dslot.p, dpos.p, ty);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (size_t sl = 0; sl < 3; ++sl)
            EXPECT_EQ(caches[sl]->host(), want[sl]) << "type " << int(ty) << " slot " << sl;
    }
    EXPECT_THROW(cuda::kv_store_rows(src.p, T, 6, nullptr, dslot.p, dpos.p, GgmlType::F16), Error);  // cols % 4
    EXPECT_THROW(cuda::kv_store_rows(src.p, T, cols, nullptr, dslot.p, dpos.p, GgmlType::Q8_0), Error);
}

TEST(CudaKvStore, RejectsOtherTypes) {
    try {
        cuda::kv_store(nullptr, nullptr, GgmlType::Q8_0, 32);
        ADD_FAILURE() << "no error for Q8_0";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cuda::kv_store"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace alloy
