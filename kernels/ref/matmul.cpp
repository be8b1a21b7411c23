#include "kernels/ref/matmul.h"

#include <vector>

#include "format/quant.h"

namespace alloy::ref {

void matmul(const WeightView& W, const float* x, float* y, int64_t T) {
    std::vector<float> row(size_t(W.n_in));
    for (int64_t o = 0; o < W.n_out; ++o) {
        dequantize_row(W.type, W.row(o), row.data(), W.n_in);
        for (int64_t t = 0; t < T; ++t) {
            const float* xt = x + t * W.n_in;
            double acc = 0.0;
            for (int64_t i = 0; i < W.n_in; ++i) acc += double(row[size_t(i)]) * xt[i];
            y[t * W.n_out + o] = float(acc);
        }
    }
}

}  // namespace alloy::ref
