// Small scalar activations shared by the reference kernels (fp32 in, fp32 out).
// Each follows the PyTorch definition the checkpoints were trained with.
#pragma once
#include <cmath>
#include <cstddef>

namespace alloy::ref {

// sigmoid(x) = 1 / (1 + e^-x), written so that neither branch exponentiates a large positive number.
inline float sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + std::exp(-x));
    const float e = std::exp(x);
    return e / (1.0f + e);
}

// SiLU(x) = x * sigmoid(x).
inline float silu(float x) { return x * sigmoid(x); }

// softplus as torch.nn.functional.softplus(beta=1, threshold=20): identity above 20,
// log1p(exp(x)) otherwise (exp(x) <= e^20 cannot overflow there).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// In-place L2 normalisation in HF's form x * rsqrt(sum(x^2) + eps) (eps inside the root,
// added to the squared norm; not max(||x||, eps) as torch.nn.functional.normalize does).
inline void l2norm(float* x, std::size_t n, float eps) {
    float ss = 0.0f;
    for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss + eps);
    for (std::size_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace alloy::ref
