// ggml's reference quantizers for Q4_K, Q5_K, Q6_K, IQ4_XS and IQ4_NL (no importance
// matrix), restated. Every float expression keeps ggml's operand order and types (ints
// converted where C converts them) because the level search compares sums: one rounding
// apart and a different level wins. CMake builds this file with -ffp-contract=off.
#include "format/kquant_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "format/quant.h"

namespace alloy::detail {

namespace {

// Blocks whose largest magnitude is below this are all zero (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;

// Round half to even for |f| < 2^22 by adding 1.5 * 2^23 and reading the low mantissa bits
// (ggml's nearest_int; std::nearbyint agrees, this is how ggml writes it).
inline int nearest_int(float f) {
    const float v = f + 12582912.f;
    int32_t i;
    std::memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

void store_u16(uint8_t* p, uint16_t v) {
    p[0] = static_cast<uint8_t>(v);
    p[1] = static_cast<uint8_t>(v >> 8);
}

// Fits x[0..n) ~ scale * L + min with L in [0, nmax], min <= 0, by weighted least squares over
// nstep + 1 trial inverse scales around nmax / (max - min) (ggml's make_qkx2_quants with
// squared error). Returns the scale; *neg_min = -min.
float fit_scale_and_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min,
                        uint8_t* Laux, float rmin, float rdelta, int nstep) {
    float min = x[0];
    float max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *neg_min = -min;
        return 0.f;
    }
    float iscale = static_cast<float>(nmax) / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
        float diff = scale * static_cast<float>(L[i]) + min - x[i];
        diff = diff * diff;
        best_error += w[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = std::max(0, std::min(nmax, l));
            Laux[i] = static_cast<uint8_t>(l);
            const float fl = static_cast<float>(l);
            sum_l += w[i] * fl;
            sum_l2 += w[i] * fl * fl;
            sum_xl += w[i] * fl * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
                diff = diff * diff;
                cur_error += w[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

// Symmetric fit x ~ scale * (L - nmax), L in [0, 2 nmax), weights x^2, trying 19 inverse
// scales around -nmax / max (ggml's make_qx_quants with rmse_type 1 and no importance).
float fit_symmetric_scale(int n, int nmax, const float* x, int8_t* L) {  // n <= 16
    float max = 0;
    float amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.f;
    }
    const float fnmax = static_cast<float>(nmax);
    // The weights x^2 and the products x^2 * x, formed once (the same roundings as ggml's
    // w * x[i] * l, evaluated left to right) instead of once per trial.
    float w[16], wx[16];
    for (int i = 0; i < n; ++i) {
        w[i] = x[i] * x[i];
        wx[i] = w[i] * x[i];
    }
    float iscale = static_cast<float>(-nmax) / max;
    float sumlx = 0;
    float suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = std::max(-nmax, std::min(nmax - 1, l));
        L[i] = static_cast<int8_t>(l + nmax);
        sumlx += wx[i] * static_cast<float>(l);
        suml2 += w[i] * static_cast<float>(l) * static_cast<float>(l);
    }
    float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(fnmax + 0.1f * static_cast<float>(is)) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * x[i]);
            l = std::max(-nmax, std::min(nmax - 1, l));
            sumlx += wx[i] * static_cast<float>(l);
            suml2 += w[i] * static_cast<float>(l) * static_cast<float>(l);
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                const int l = nearest_int(iscale * x[i]);
                L[i] = static_cast<int8_t>(nmax + std::max(-nmax, std::min(nmax - 1, l)));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// Q4_K / Q5_K share the super-block: 8 sub-blocks of 32 with a 6-bit scale and min each,
// packed into 12 bytes (spec/GGUF.md "Q4_K"), and two f16 super-scales. Fills the 16-byte
// head (d, dmin, scales) and L[256] with levels in [0, nmax].
void quantize_scale_min_superblock(const float* x, int nmax, float rmin, int nstep, uint8_t* head, uint8_t* L) {
    uint8_t Laux[32];
    float weights[32];
    float mins[8];
    float scales[8];
    float max_scale = 0;
    float max_min = 0;
    for (int j = 0; j < 8; ++j) {
        const float* xj = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
        const float av_x = std::sqrt(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xj[l]);
        scales[j] = fit_scale_and_min(32, nmax, xj, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t* sc = head + 4;
    for (int j = 0; j < 8; ++j) {
        // ggml stores nearest_int's result in a uint8_t before the clamp: keep that truncation.
        const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
        const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
            sc[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
            sc[j] |= static_cast<uint8_t>((lm >> 4) << 6);
        }
    }
    const uint16_t d16 = fp32_to_fp16(max_scale / 63.f);
    const uint16_t dmin16 = fp32_to_fp16(max_min / 63.f);
    store_u16(head, d16);
    store_u16(head + 2, dmin16);
    // Re-quantize every value against the rounded (f16 x 6-bit) scale and min.
    for (int j = 0; j < 8; ++j) {
        int s, m;
        q4k_scale_min(sc, j, s, m);
        const float d = fp16_to_fp32(d16) * static_cast<float>(s);
        if (d == 0.f) continue;
        const float dm = fp16_to_fp32(dmin16) * static_cast<float>(m);
        for (int i = 0; i < 32; ++i) {
            const int l = nearest_int((x[32 * j + i] + dm) / d);
            L[32 * j + i] = static_cast<uint8_t>(std::max(0, std::min(nmax, l)));
        }
    }
}

// ggml's best_index_int8: the index of the codebook value nearest x (ties to the upper one
// only when strictly nearer). ggml bisects; for strictly increasing values the bisection ends
// at mu = the number of values <= x, which a branch-free count gives with the same result
// (the level search calls this ~50 times per value: the bisection's branches mispredicted).
int nearest_code(const int8_t* val, float x) {
    constexpr int n = 16;
    if (x <= static_cast<float>(val[0])) return 0;
    if (x >= static_cast<float>(val[n - 1])) return n - 1;
    int mu = 0;
    for (int i = 0; i < n; ++i) mu += static_cast<float>(val[i]) <= x ? 1 : 0;
    return x - static_cast<float>(val[mu - 1]) < static_cast<float>(val[mu]) - x ? mu - 1 : mu;
}

// ggml's quantize_row_iq4_nl_impl without importance, ntry = 7: per block of 32 the best
// scale for the non-linear codebook among 15 trials; with several blocks (IQ4_XS) the
// scales are then coded in 6 bits against one f16 super-scale and the values re-coded.
// Writes *dh (f16 bits), L[sb] codes, and for IQ4_XS the 6-bit scales.
void quantize_iq4_superblock(int super_block, const float* x, uint16_t* dh, uint8_t* L, uint16_t* scales_h,
                             uint8_t* scales_l) {
    constexpr int kBlock = 32;
    constexpr int kTries = 7;
    const int8_t* values = kIq4nlValues;
    float weight[kBlock];
    float scales[8];
    *dh = fp32_to_fp16(0.f);
    float max_scale = 0, amax_scale = 0;
    const int nblocks = super_block / kBlock;
    for (int ib = 0; ib < nblocks; ++ib) {
        const float* xb = x + ib * kBlock;
        uint8_t* Lb = L + ib * kBlock;
        for (int j = 0; j < kBlock; ++j) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < kBlock; ++j) {
            const float ax = std::fabs(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < kGroupMaxEps) {
            scales[ib] = 0;
            continue;
        }
        float d = -max / static_cast<float>(values[0]);
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < kBlock; ++j) {
            const float al = id * xb[j];
            const int l = nearest_code(values, al);
            Lb[j] = static_cast<uint8_t>(l);
            const float q = static_cast<float>(values[l]);
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -kTries; itry <= kTries; ++itry) {
            id = static_cast<float>(itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < kBlock; ++j) {
                const float al = id * xb[j];
                const float q = static_cast<float>(values[nearest_code(values, al)]);
                sumqx += weight[j] * q * xb[j];
                sumq2 += weight[j] * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        const float abs_d = std::fabs(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    if (nblocks > 1) {
        *scales_h = 0;
        const float d = -max_scale / 32;
        *dh = fp32_to_fp16(d);
        const float id = d != 0.f ? 1 / d : 0.f;
        for (int ib = 0; ib < nblocks; ++ib) {
            int l = nearest_int(id * scales[ib]);
            l = std::max(-32, std::min(31, l));
            const float dl = d * static_cast<float>(l);
            const float idl = dl != 0.f ? 1 / dl : 0.f;
            uint8_t* Lb = L + ib * kBlock;
            const float* xb = x + ib * kBlock;
            for (int j = 0; j < kBlock; ++j) Lb[j] = static_cast<uint8_t>(nearest_code(values, idl * xb[j]));
            l += 32;
            const uint8_t l_l = static_cast<uint8_t>(l & 0xf);
            const uint8_t l_h = static_cast<uint8_t>(l >> 4);
            if (ib % 2 == 0) {
                scales_l[ib / 2] = l_l;
            } else {
                scales_l[ib / 2] |= static_cast<uint8_t>(l_l << 4);
            }
            *scales_h = static_cast<uint16_t>(*scales_h | (l_h << 2 * (ib % 8)));
        }
    } else {
        *dh = fp32_to_fp16(scales[0]);
        const float id = scales[0] != 0.f ? 1 / scales[0] : 0;
        for (int j = 0; j < super_block; ++j) L[j] = static_cast<uint8_t>(nearest_code(values, id * x[j]));
    }
}

// IQ4 nibble order: within each 32 values, byte j holds value j (low) and j + 16 (high).
void pack_iq4_nibbles(const uint8_t* L, int n, uint8_t* q4) {
    for (int i = 0; i < n / 32; ++i) {
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
    }
}

}  // namespace

void quantize_q4_k(const float* x, uint8_t* dst, int64_t nb) {
    uint8_t L[256];
    for (int64_t b = 0; b < nb; ++b, x += 256, dst += 144) {
        quantize_scale_min_superblock(x, 15, -1.f, 20, dst, L);
        // qs: 4 groups of 64 values; byte l of a group holds value l (low) and l + 32 (high).
        uint8_t* q = dst + 16;
        for (int j = 0; j < 256; j += 64, q += 32) {
            for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
        }
    }
}

void quantize_q5_k(const float* x, uint8_t* dst, int64_t nb) {
    uint8_t L[256];
    for (int64_t b = 0; b < nb; ++b, x += 256, dst += 176) {
        quantize_scale_min_superblock(x, 31, -0.5f, 15, dst, L);
        // qh[32]: bit 2k / 2k+1 of byte j = high bit of value 64k + j / 64k + 32 + j.
        uint8_t* qh = dst + 16;
        uint8_t* ql = dst + 48;
        std::memset(qh, 0, 32);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < 256; n += 64, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] |= m1;
                }
                int l2 = L[n + j + 32];
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] |= m2;
                }
                ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
            }
            m1 = static_cast<uint8_t>(m1 << 2);
            m2 = static_cast<uint8_t>(m2 << 2);
        }
    }
}

void quantize_q6_k(const float* x, uint8_t* dst, int64_t nb) {
    int8_t L[256];
    float scales[16];
    for (int64_t b = 0; b < nb; ++b, x += 256, dst += 210) {
        uint8_t* ql = dst;
        uint8_t* qh = dst + 128;
        int8_t* sc = reinterpret_cast<int8_t*>(dst + 192);
        float max_scale = 0;
        float max_abs_scale = 0;
        for (int ib = 0; ib < 16; ++ib) {
            const float scale = fit_symmetric_scale(16, 32, x + 16 * ib, L + 16 * ib);
            scales[ib] = scale;
            const float abs_scale = std::fabs(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(dst, 0, 210);
            continue;
        }
        const float iscale = -128.f / max_scale;
        const uint16_t d16 = fp32_to_fp16(1 / iscale);
        store_u16(dst + 208, d16);
        for (int ib = 0; ib < 16; ++ib) sc[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
        for (int j = 0; j < 16; ++j) {
            const float d = fp16_to_fp32(d16) * static_cast<float>(sc[j]);
            if (d == 0.f) continue;
            for (int i = 0; i < 16; ++i) {
                int l = nearest_int(x[16 * j + i] / d);
                l = std::max(-32, std::min(31, l));
                L[16 * j + i] = static_cast<int8_t>(l + 32);
            }
        }
        // ql: low nibbles of values (l, l+64) and (l+32, l+96) per 128; qh: their 2 high bits.
        for (int j = 0; j < 256; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const int q1 = L[j + l + 0] & 0xF;
                const int q2 = L[j + l + 32] & 0xF;
                const int q3 = L[j + l + 64] & 0xF;
                const int q4 = L[j + l + 96] & 0xF;
                ql[l + 0] = static_cast<uint8_t>(q1 | (q3 << 4));
                ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
                qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                             ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
            }
        }
    }
}

void quantize_iq4_xs(const float* x, uint8_t* dst, int64_t nb) {
    uint8_t L[256];
    for (int64_t b = 0; b < nb; ++b, x += 256, dst += 136) {
        uint16_t dh = 0, scales_h = 0;
        quantize_iq4_superblock(256, x, &dh, L, &scales_h, dst + 4);
        store_u16(dst, dh);
        store_u16(dst + 2, scales_h);
        pack_iq4_nibbles(L, 256, dst + 8);
    }
}

void quantize_iq4_nl(const float* x, uint8_t* dst, int64_t nb) {
    uint8_t L[32];
    for (int64_t b = 0; b < nb; ++b, x += 32, dst += 18) {
        uint16_t dh = 0;
        quantize_iq4_superblock(32, x, &dh, L, nullptr, nullptr);
        store_u16(dst, dh);
        pack_iq4_nibbles(L, 32, dst + 2);
    }
}

}  // namespace alloy::detail
