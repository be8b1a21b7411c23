#include "kernels/ref/attention.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "kernels/ref/kv_store.h"

namespace alloy::ref {

void attention(const AttentionShape& s, const float* q, const void* k_cache,
               const void* v_cache, float* out, int64_t T, int64_t n_past) {
    if (!kv_type_supported(s.type_k) || !kv_type_supported(s.type_v))
        throw Error("attention: KV cache types must be f32, f16 or bf16");
    const int group = s.n_head / s.n_head_kv;
    const int64_t kv_stride = int64_t(s.n_head_kv) * s.head_dim;
    // The cache rows this call reads, as fp32 (exact for f16).
    const int64_t n_elem = (n_past + T) * kv_stride;
    std::vector<float> kf(static_cast<size_t>(n_elem)), vf(static_cast<size_t>(n_elem));
    for (int64_t i = 0; i < n_elem; ++i) {
        kf[size_t(i)] = kv_load(k_cache, s.type_k, i);
        vf[size_t(i)] = kv_load(v_cache, s.type_v, i);
    }
    std::vector<double> score(size_t(n_past + T));
    for (int64_t t = 0; t < T; ++t) {
        const int64_t n_keys = n_past + t + 1;
        for (int h = 0; h < s.n_head; ++h) {
            const float* qh = q + (t * s.n_head + h) * s.head_dim;
            const int64_t kv0 = int64_t(h / group) * s.head_dim;  // this head's offset in a cache row
            double mx = -std::numeric_limits<double>::infinity();
            for (int64_t j = 0; j < n_keys; ++j) {
                double dot = 0;
                for (int d = 0; d < s.head_dim; ++d)
                    dot += double(qh[d]) * kf[size_t(j * kv_stride + kv0 + d)];
                score[size_t(j)] = dot * s.scale;
                mx = std::max(mx, score[size_t(j)]);
            }
            double sum = 0;
            for (int64_t j = 0; j < n_keys; ++j) sum += (score[size_t(j)] = std::exp(score[size_t(j)] - mx));
            float* oh = out + (t * s.n_head + h) * s.head_dim;
            for (int d = 0; d < s.head_dim; ++d) {
                double acc = 0;
                for (int64_t j = 0; j < n_keys; ++j)
                    acc += score[size_t(j)] * vf[size_t(j * kv_stride + kv0 + d)];
                oh[d] = float(acc / sum);
            }
        }
    }
}

}  // namespace alloy::ref
