// Portable row-dot kernels (no vector ISA): the same numerical contract as the vector paths.
// Q8_0 block sums are exact integers scaled by d_w * d_x, as ggml's scalar vec_dot_q8_0_q8_0.
#include <cstring>

#include "format/quant.h"
#include "kernels/cpu/matmul_kernels.h"

namespace alloy::cpu::mm {
namespace {


float dot_q8(const uint8_t* w, const ActRows& a, int64_t t) {
    const int64_t nb = a.K / kQ8;
    const int8_t* xq = a.q + t * a.K;
    const float* xd = a.d + t * nb;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b, w += 34) {
        const int8_t* wq = reinterpret_cast<const int8_t*>(w + 2);
        int32_t s = 0;
        for (int i = 0; i < kQ8; ++i) s += int32_t(wq[i]) * xq[b * kQ8 + i];
        acc += float(s) * (fp16_to_fp32(load_u16(w)) * xd[b]);
    }
    return acc;
}

// Eight partial sums, so the compiler may vectorise without reassociating.
template <class Load>
float dot_float(const uint8_t* w, const float* x, int64_t K, Load load) {
    float part[8] = {};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; ++j) part[j] += load(w, k + j) * x[k + j];
    float acc = 0.0f;
    for (; k < K; ++k) acc += load(w, k) * x[k];
    for (float p : part) acc += p;
    return acc;
}

template <GgmlType type>
void rowdot(const WeightView& W, int64_t r0, int nr, const ActRows& a, int64_t t0, int nt, float* y, int64_t ldy) {
    for (int i = 0; i < nr; ++i) {
        const uint8_t* w = W.row(r0 + i);
        for (int t = 0; t < nt; ++t) {
            const float* x = a.f ? a.f + (t0 + t) * a.K : nullptr;
            float v;
            if constexpr (type == GgmlType::Q8_0) {
                v = dot_q8(w, a, t0 + t);
            } else if constexpr (type == GgmlType::BF16) {
                v = dot_float(w, x, a.K, [](const uint8_t* p, int64_t k) { return bf16_to_fp32(load_u16(p + 2 * k)); });
            } else if constexpr (type == GgmlType::F16) {
                v = dot_float(w, x, a.K, [](const uint8_t* p, int64_t k) { return fp16_to_fp32(load_u16(p + 2 * k)); });
            } else {
                v = dot_float(w, x, a.K, [](const uint8_t* p, int64_t k) {
                    float f;
                    std::memcpy(&f, p + 4 * k, 4);
                    return f;
                });
            }
            y[(t0 + t) * ldy + r0 + i] = v;
        }
    }
}

}  // namespace

RowKernel rowdot_scalar(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0: return {rowdot<GgmlType::Q8_0>, 4};
        case GgmlType::BF16: return {rowdot<GgmlType::BF16>, 4};
        case GgmlType::F16: return {rowdot<GgmlType::F16>, 4};
        case GgmlType::F32: return {rowdot<GgmlType::F32>, 4};
        default: return {};
    }
}

}  // namespace alloy::cpu::mm
