// Small fp32 matrix products of the chunked GDN form (gdn_chunked.cpp): C x d, C x C and
// d x d operands with C = 64, d = 128 in Qwen3.5, any sizes allowed. Internal to the GDN
// kernels; not a general matmul (see kernels/cpu/matmul.h for the weight products).
#pragma once
#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu::gdn {

// Which part of a product is known to be zero or not needed.
enum class Tri {
    None,
    LowerA,  // A[r][s] == 0 for s > r (A square, lower triangular): rows read A[r][0..r] only
    LowerC,  // only C[r][s] for s <= r is wanted; entries above may be computed or not
};

// C[M x N] = c_scale * C + A[M x K] B[K x N], all row-major with leading dimensions in
// floats. c_scale == 0 overwrites C without reading it (it may hold NaN garbage).
struct Gemm {
    int M = 0, N = 0, K = 0;
    const float* A = nullptr;
    int lda = 0;
    const float* B = nullptr;
    int ldb = 0;
    float* C = nullptr;
    int ldc = 0;
    float c_scale = 0.0f;
    Tri tri = Tri::None;
};

void gemm(Isa isa, const Gemm& g);

// T = (I + A)^-1 for the n x n strictly lower triangle of A (the rest of A is not read);
// T: [n, n] (ldt), unit lower triangular with exact zeros above. Blocked substitution:
// 16 x 16 diagonal blocks by forward substitution, then each block row of T from the rows
// above by two products, T[I, :I] = -T_II (A[I, :I] T[:I, :I]) (spec/GDN.md section 4).
// scratch: at least 16 * n + 256 floats.
void tri_inverse(Isa isa, int n, const float* A, int lda, float* T, int ldt, float* scratch);

}  // namespace alloy::cpu::gdn
