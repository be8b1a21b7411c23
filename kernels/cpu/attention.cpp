#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/thread_pool.h"

namespace alloy::cpu {

void attention(const AttentionShape& s, const float* q, const float* k_cache,
               const float* v_cache, float* out, int64_t T, int64_t n_past) {
    const int group = s.n_head / s.n_head_kv;
    const int64_t kv_stride = int64_t(s.n_head_kv) * s.head_dim;
    const int hd = s.head_dim;
    std::vector<std::vector<float>> scratch(static_cast<size_t>(n_threads()));
    parallel_for(T * s.n_head, [&](int64_t th, int thread) {
        std::vector<float>& buf = scratch[size_t(thread)];
        if (buf.empty()) buf.resize(size_t(n_past + T + hd));
        float* score = buf.data();
        float* acc = buf.data() + n_past + T;
        {
            const int64_t t = th / s.n_head;
            const int h = int(th % s.n_head);
            const float* qh = q + th * hd;
            const float* kbase = k_cache + int64_t(h / group) * hd;
            const float* vbase = v_cache + int64_t(h / group) * hd;
            const int64_t n_keys = n_past + t + 1;
            float mx = -INFINITY;
            for (int64_t j = 0; j < n_keys; ++j) {
                const float* kj = kbase + j * kv_stride;
                float dot = 0;
                for (int d = 0; d < hd; ++d) dot += qh[d] * kj[d];
                score[j] = dot * s.scale;
                mx = std::max(mx, score[j]);
            }
            float sum = 0;
            std::fill(acc, acc + hd, 0.0f);
            for (int64_t j = 0; j < n_keys; ++j) {
                const float p = std::exp(score[j] - mx);
                sum += p;
                const float* vj = vbase + j * kv_stride;
                for (int d = 0; d < hd; ++d) acc[d] += p * vj[d];
            }
            float* oh = out + th * hd;
            const float inv = 1.0f / sum;
            for (int d = 0; d < hd; ++d) oh[d] = acc[d] * inv;
        }
    });
}

}  // namespace alloy::cpu
