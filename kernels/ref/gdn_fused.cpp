// Fused Gated DeltaNet layer op, reference version: everything of spec/MODEL.md section 3
// between the input projections and out_proj. Contract and layouts: kernels/ref/gdn.h.
//   conv1d (causal, depthwise, with carried state) -> SiLU -> split q | k | v
//   -> L2norm(q), L2norm(k), q /= sqrt(d_k); beta = sigmoid(b); g = ssm_a * softplus(a + dt_bias)
//   -> delta rule (serial or chunked) -> per value head RMSNorm(o) * norm * SiLU(z)
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "kernels/ref/activations.h"
#include "kernels/ref/gdn.h"
#include "kernels/ref/gdn_common.h"

namespace alloy::ref {

namespace {

// Causal depthwise conv1d + SiLU over one sequence of n tokens, one channel at a time.
// x: [n, conv_dim] (this channel is column c), w: [conv_dim, K], hist: [conv_dim, K-1],
// u: [n, conv_dim]. Input time tau < 0 reads the state: x[tau] = hist[c][K-1+tau].
void conv1d_silu_seq(int n, int conv_dim, int K, const float* x, const float* w, float* hist,
                     float* u) {
#pragma omp parallel if ((double)n * conv_dim * K >= detail::kMinParallelWork)
    {
        std::vector<float> fresh(K > 1 ? K - 1 : 1);  // [K-1] next state of one channel
#pragma omp for
        for (int c = 0; c < conv_dim; ++c) {
            float* h_c = hist + (std::size_t)c * (K - 1);  // [K-1], oldest first
            const float* w_c = w + (std::size_t)c * K;     // [K], tap K-1 = current token
            auto input = [&](int tau) {                    // x[tau] of this channel
                return tau < 0 ? h_c[K - 1 + tau] : x[(std::size_t)tau * conv_dim + c];
            };
            for (int t = 0; t < n; ++t) {
                float acc = 0.0f;
                for (int tap = 0; tap < K; ++tap) acc += w_c[tap] * input(t - (K - 1) + tap);
                u[(std::size_t)t * conv_dim + c] = silu(acc);
            }
            // New state = last K-1 of concat(old state, x): time n-(K-1)+i, which may still
            // be in the old state when n < K-1. Built aside because it reads h_c.
            for (int i = 0; i < K - 1; ++i) fresh[i] = input(n - (K - 1) + i);
            for (int i = 0; i < K - 1; ++i) h_c[i] = fresh[i];
        }
    }
}

}  // namespace

void gdn_fused(const GdnParams& p, const GdnWeights& w, int n_seqs, const int32_t* seq_offsets,
               const float* qkv, const float* z, const float* a, const float* b,
               float* conv_state, float* state, float* y, const int32_t* seq_slots) {
    const char* op = "gdn_fused";
    detail::check_fused_args(p, w, n_seqs, seq_offsets, qkv, z, a, b, conv_state, state, y, op);
    if (n_seqs == 0) return;
    const GdnShape& sh = p.shape;
    const int H_k = sh.H_k, H_v = sh.H_v, d_k = sh.d_k, d_v = sh.d_v, K = p.conv_kernel;
    const int key_dim = H_k * d_k, value_dim = H_v * d_v;
    const int conv_dim = 2 * key_dim + value_dim;
    const int base = seq_offsets[0];
    const int T = seq_offsets[n_seqs] - base;  // tokens of all sequences
    // Work on tokens [base, base+T) re-indexed from 0.
    std::vector<int32_t> offs(n_seqs + 1);
    for (int s = 0; s <= n_seqs; ++s) offs[s] = seq_offsets[s] - base;
    const std::size_t t0 = (std::size_t)base;
    auto slot = [&](int s) -> std::size_t { return seq_slots ? (std::size_t)seq_slots[s] : (std::size_t)s; };
    const std::size_t state_elems = (std::size_t)H_v * d_v * d_k;

    // 1. conv + SiLU per sequence, each with its own conv state.
    std::vector<float> u((std::size_t)T * conv_dim);  // [T, conv_dim] = [Q | K | V] after SiLU
    for (int s = 0; s < n_seqs; ++s) {
        const int n = offs[s + 1] - offs[s];
        if (n == 0) continue;  // empty sequence: conv state untouched
        conv1d_silu_seq(n, conv_dim, K, qkv + (t0 + offs[s]) * conv_dim, w.conv1d,
                        conv_state + slot(s) * conv_dim * (K - 1), u.data() + (std::size_t)offs[s] * conv_dim);
    }

    // 2. split, L2-normalise q and k per key head, scale q; gates per value head.
    std::vector<float> qn((std::size_t)T * key_dim);     // [T, H_k, d_k]
    std::vector<float> kn((std::size_t)T * key_dim);     // [T, H_k, d_k]
    std::vector<float> vv((std::size_t)T * value_dim);   // [T, H_v, d_v]
    std::vector<float> g((std::size_t)T * H_v);          // [T, H_v] log decay, <= 0
    std::vector<float> beta((std::size_t)T * H_v);       // [T, H_v]
    const float q_scale = 1.0f / std::sqrt((float)d_k);
    const bool parallel = (double)T * conv_dim * 4 >= detail::kMinParallelWork;  // ~4 ops per element
#pragma omp parallel for if (parallel)
    for (int t = 0; t < T; ++t) {
        const float* u_t = u.data() + (std::size_t)t * conv_dim;
        for (int kh = 0; kh < H_k; ++kh) {
            float* q_h = qn.data() + ((std::size_t)t * H_k + kh) * d_k;
            float* k_h = kn.data() + ((std::size_t)t * H_k + kh) * d_k;
            for (int i = 0; i < d_k; ++i) {
                q_h[i] = u_t[kh * d_k + i];
                k_h[i] = u_t[key_dim + kh * d_k + i];
            }
            l2norm(q_h, d_k, p.eps);
            l2norm(k_h, d_k, p.eps);
            for (int i = 0; i < d_k; ++i) q_h[i] *= q_scale;
        }
        for (int i = 0; i < value_dim; ++i) vv[(std::size_t)t * value_dim + i] = u_t[2 * key_dim + i];
        for (int h = 0; h < H_v; ++h) {
            const std::size_t th = (std::size_t)t * H_v + h, src = (t0 + t) * H_v + h;
            beta[th] = sigmoid(b[src]);
            g[th] = w.ssm_a[h] * softplus(a[src] + w.dt_bias[h]);
        }
    }

    // 3. the delta rule.
    std::vector<float> o((std::size_t)T * value_dim);  // [T, H_v, d_v]
    // One sequence at a time, each on its slot's state (sequences are independent).
    for (int s = 0; s < n_seqs; ++s) {
        float* st = state + slot(s) * state_elems;
        if (p.mode == GdnMode::Serial)
            gdn_delta_serial(sh, 1, offs.data() + s, qn.data(), kn.data(), vv.data(), g.data(),
                             beta.data(), st, o.data());
        else
            gdn_delta_chunked(sh, 1, offs.data() + s, qn.data(), kn.data(), vv.data(), g.data(),
                              beta.data(), st, o.data(), p.chunk_size);
    }

    // 4. gated RMSNorm per value head: y = o * rsqrt(mean(o^2) + eps) * norm * SiLU(z).
#pragma omp parallel for if (parallel)
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H_v; ++h) {
            const float* o_h = o.data() + ((std::size_t)t * H_v + h) * d_v;  // [d_v]
            const std::size_t row = ((t0 + t) * H_v + h) * d_v;
            float ss = 0.0f;
            for (int j = 0; j < d_v; ++j) ss += o_h[j] * o_h[j];
            const float inv_rms = 1.0f / std::sqrt(ss / (float)d_v + p.eps);
            for (int j = 0; j < d_v; ++j) y[row + j] = o_h[j] * inv_rms * w.norm[j] * silu(z[row + j]);
        }
    }
}

}  // namespace alloy::ref
