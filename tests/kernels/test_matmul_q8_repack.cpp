// Q8_0 rows repacked at load (WeightLayout::Q8Rows16, kernels/cpu/matmul_kernels.h): every CPU
// path that reads a repacked matrix gives the bits it gives the same matrix as stored (GGUF rows):
// the zmm GEMV (16 rows in the lanes, every call of up to 16 tokens), the VNNI tiles reading the
// layout in place (T > 16, narrow last groups included), the AVX2 / scalar paths (rows unpacked),
// matmul_multi and matmul_swiglu; row counts that are not multiples of 16 (a GGUF tail), row
// ranges that cut groups, codes of -128.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/matmul.h"
#include "tests/kernels/isa_paths.h"
#include "tests/kernels/random_weights.h"

namespace alloy {
namespace {

std::vector<cpu::Isa> isas() { return test::isa_paths(/*has_avx2_code=*/true); }

// A Q8_0 matrix as stored (some codes -128: the flip's edge) and its repacked copy.
struct Pair {
    std::vector<uint8_t> gguf, packed;
    WeightView g, p;
    Pair(int64_t n_in, int64_t n_out, std::mt19937& rng) {
        gguf = random_weights(GgmlType::Q8_0, n_in, n_out, rng);
        for (size_t off = 0; off < gguf.size(); off += 34)
            if (rng() % 5 == 0) gguf[off + 2 + rng() % 32] = 0x80;
        packed = gguf;
        g = WeightView{GgmlType::Q8_0, n_in, n_out, gguf.data(), row_bytes(GgmlType::Q8_0, n_in)};
        p = g;
        p.data = packed.data();
        EXPECT_TRUE(cpu::repack_weight(p, packed.data()));
        EXPECT_EQ(p.layout, WeightLayout::Q8Rows16);
    }
};

std::vector<float> randn(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
}

TEST(Q8Repack, EveryRowUnpacksToItsStoredBytes) {
    std::mt19937 rng(3);
    for (int64_t n_out : {16, 37, 53, 1501})
        for (int64_t n_in : {32, 1056}) {
            Pair m(n_in, n_out, rng);
            const int64_t full = n_out / 16 * 16;
            EXPECT_NE(0, std::memcmp(m.gguf.data(), m.packed.data(), size_t(full) * m.g.row_bytes));
            EXPECT_EQ(0, std::memcmp(m.gguf.data() + full * m.g.row_bytes, m.packed.data() + full * m.g.row_bytes,
                                     size_t(n_out - full) * m.g.row_bytes));
            std::vector<uint8_t> buf(m.g.row_bytes);
            for (int64_t r = 0; r < n_out; ++r)
                ASSERT_EQ(0, std::memcmp(cpu::weight_row(m.p, r, buf.data()), m.g.row(r), m.g.row_bytes))
                    << "n_in=" << n_in << " n_out=" << n_out << " row " << r;
        }
    std::vector<uint8_t> s = random_weights(GgmlType::Q8_0, 64, 15, rng);
    WeightView small{GgmlType::Q8_0, 64, 15, s.data(), row_bytes(GgmlType::Q8_0, 64)};
    EXPECT_FALSE(cpu::repack_weight(small, s.data()));
    std::vector<uint8_t> h = random_weights(GgmlType::Q8_0, 128, 32, rng);
    WeightView half{GgmlType::Q8_0, 64, 32, h.data(), row_bytes(GgmlType::Q8_0, 128)};
    EXPECT_FALSE(cpu::repack_weight(half, h.data()));
    Pair twice(64, 32, rng);
    EXPECT_FALSE(cpu::repack_weight(twice.p, twice.packed.data()));
}

// matmul on the repacked matrix = matmul on the stored one, bit for bit, on every ISA path and
// token count (1..16: the GEMV; 17 and up: the tiles, narrow last groups at 17..24 and 40).
TEST(Q8Repack, MatmulGivesTheStoredMatrixBitsOnEveryPathAndTokenCount) {
    std::mt19937 rng(11);
    cpu::MatmulScratch scratch;
    struct Shape { int64_t n_in, n_out; };
    for (const Shape sh : {Shape{32, 37}, Shape{4096 + 32, 19}, Shape{1024, 67}, Shape{512, 1501}, Shape{96, 16}}) {
        Pair m(sh.n_in, sh.n_out, rng);
        std::vector<int64_t> Ts;
        for (int64_t t = 1; t <= 24; ++t) Ts.push_back(t);
        for (int64_t t : {33, 40, 64, 100}) Ts.push_back(t);
        for (int64_t T : Ts) {
            const std::vector<float> x = randn(size_t(T * sh.n_in), rng);
            for (cpu::Isa isa : isas()) {
                std::vector<float> want(size_t(T * sh.n_out), NAN), got(want.size(), NAN);
                cpu::matmul(m.g, x.data(), want.data(), T, isa, scratch);
                cpu::matmul(m.p, x.data(), got.data(), T, isa, scratch);
                for (float v : got) ASSERT_TRUE(std::isfinite(v));
                ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4))
                    << cpu::isa_name(isa) << " n_in=" << sh.n_in << " n_out=" << sh.n_out << " T=" << T;
            }
        }
    }
}

// The batch-invariance contract on the repacked matrix: row t of a T-token call has the bits
// of a one-token call on token t, for every T (GEMV and tiles alike).
TEST(Q8Repack, EveryTokenCountGivesTheOneTokenBits) {
    std::mt19937 rng(23);
    cpu::MatmulScratch scratch;
    const int64_t K = 1024, N = 75;
    Pair m(K, N, rng);
    const std::vector<float> x = randn(size_t(40 * K), rng);
    for (cpu::Isa isa : isas()) {
        std::vector<float> one(size_t(40 * N));
        for (int64_t t = 0; t < 40; ++t) cpu::matmul(m.p, x.data() + t * K, one.data() + t * N, 1, isa, scratch);
        for (int64_t T : {2, 5, 8, 9, 16, 17, 24, 40}) {
            std::vector<float> got(size_t(T * N));
            cpu::matmul(m.p, x.data(), got.data(), T, isa, scratch);
            ASSERT_EQ(0, std::memcmp(one.data(), got.data(), got.size() * 4)) << cpu::isa_name(isa) << " T=" << T;
        }
    }
}

TEST(Q8Repack, MatchesTheReference) {
    std::mt19937 rng(13);
    cpu::MatmulScratch scratch;
    for (int64_t T : {1, 3, 8, 16, 17}) {
        Pair m(1024, 53, rng);
        const std::vector<float> x = randn(size_t(T * 1024), rng);
        std::vector<float> xe(x.size()), want(size_t(T * 53));
        cpu::matmul_effective_input(GgmlType::Q8_0, x.data(), xe.data(), T, 1024);
        ref::matmul(m.g, xe.data(), want.data(), T);
        for (cpu::Isa isa : isas()) {
            std::vector<float> got(want.size(), NAN);
            cpu::matmul(m.p, x.data(), got.data(), T, isa, scratch);
            EXPECT_LT(rel_err(got, want), 1e-5) << cpu::isa_name(isa) << " T=" << T;
        }
    }
}

// The repacked GEMV called directly on row ranges that start and end inside groups and reach
// into the GGUF tail, 1 to 16 tokens: the stored-layout GEMV's bits (4-token calls).
TEST(Q8Repack, GemvGivesTheStoredGemvBitsOnAnyRowRange) {
    if (cpu::active_isa() < cpu::Isa::Avx512 || !cpu::mm::cpu_has_avx512_vnni()) GTEST_SKIP() << "no AVX512-VNNI here";
    std::mt19937 rng(17);
    const int64_t K = 1280, N = 75;  // 4 groups and an 11-row tail
    Pair m(K, N, rng);
    struct Range { int64_t r0, nr; };
    for (int nt = 1; nt <= 16; ++nt) {
        const std::vector<float> x = randn(size_t(nt * K), rng);
        std::vector<float> d(size_t(nt * K / 32));
        std::vector<int8_t> q(x.size());
        std::vector<int32_t> corr(d.size());
        for (int t = 0; t < nt; ++t)
            cpu::mm::quantize_q8_scalar(x.data() + t * K, K, q.data() + t * K, d.data() + t * (K / 32),
                                        corr.data() + t * (K / 32));
        cpu::mm::ActRows a;
        a.K = K, a.q = q.data(), a.d = d.data(), a.corr = corr.data();
        std::vector<float> want(size_t(nt * N), NAN);
        for (int t = 0; t < nt; t += 4) cpu::mm::q8_gemv_avx512(m.g, 0, N, a, t, std::min(4, nt - t), want.data(), N);
        for (const Range rg : {Range{0, N}, Range{5, 30}, Range{16, 16}, Range{9, 2}, Range{60, 15}, Range{63, 12}, Range{64, 11}}) {
            std::vector<float> got(want.size(), NAN);
            cpu::mm::q8_r16_gemv_avx512(m.p, rg.r0, rg.nr, a, 0, nt, got.data(), N);
            for (int t = 0; t < nt; ++t)
                for (int64_t r = 0; r < N; ++r) {
                    const float g = got[size_t(t * N + r)], w = want[size_t(t * N + r)];
                    if (r < rg.r0 || r >= rg.r0 + rg.nr) {
                        ASSERT_TRUE(std::isnan(g)) << "wrote row " << r << " outside its range";
                    } else {
                        ASSERT_EQ(0, std::memcmp(&g, &w, 4)) << "T=" << nt << " rows [" << rg.r0 << ", "
                                                             << rg.r0 + rg.nr << ") row " << r;
                    }
                }
        }
    }
}

// matmul_multi (one shared call; a stored weight beside repacked ones) and matmul_swiglu (GEMVs
// and the fused tiles) on repacked matrices: the stored matrices' bits.
TEST(Q8Repack, MultiAndSwigluGiveTheStoredBits) {
    std::mt19937 rng(19);
    cpu::MatmulScratch scratch;
    const int64_t K = 512;
    Pair a(K, 301, rng), b(K, 48, rng), c(K, 37, rng), up(K, 301, rng);
    for (int64_t T : {1, 4, 8, 9, 16, 17, 20, 33, 100}) {
        const std::vector<float> x = randn(size_t(T * K), rng);
        for (cpu::Isa isa : isas()) {
            const std::string what = std::string(cpu::isa_name(isa)) + " T=" + std::to_string(T);
            const WeightView* sets[][3] = {{&a.p, &b.p, &c.p}, {&a.p, &b.g, &c.p}};
            const WeightView* plain[3] = {&a.g, &b.g, &c.g};
            for (int s = 0; s < 2; ++s) {
                std::vector<std::vector<float>> want(3), got(3);
                cpu::MatmulOut ow[3], og[3];
                for (int j = 0; j < 3; ++j) {
                    want[j].assign(size_t(T * sets[s][j]->n_out), NAN);
                    got[j].assign(want[j].size(), NAN);
                    ow[j] = {plain[j], want[j].data()};
                    og[j] = {sets[s][j], got[j].data()};
                }
                cpu::matmul_multi(ow, 3, x.data(), T, isa, scratch);
                cpu::matmul_multi(og, 3, x.data(), T, isa, scratch);
                for (int j = 0; j < 3; ++j)
                    EXPECT_EQ(0, std::memcmp(want[j].data(), got[j].data(), want[j].size() * 4))
                        << what << " set " << s << " weight " << j;
            }
            std::vector<float> yw(size_t(T * 301)), uw(yw.size()), yg(yw.size(), NAN), ug(yw.size(), NAN);
            cpu::matmul_swiglu(a.g, up.g, x.data(), yw.data(), uw.data(), T, isa, scratch);
            cpu::matmul_swiglu(a.p, up.p, x.data(), yg.data(), ug.data(), T, isa, scratch);
            EXPECT_EQ(0, std::memcmp(yw.data(), yg.data(), yw.size() * 4)) << "swiglu " << what;
        }
    }
}

TEST(Q8Repack, ResultDoesNotDependOnThreadCount) {
    std::mt19937 rng(29);
    const int before = cpu::n_threads();
    for (int64_t T : {1, 5, 16, 20}) {
        Pair m(1024, 1501, rng);
        const std::vector<float> x = randn(size_t(T * 1024), rng);
        std::vector<float> one(size_t(T * 1501)), two(one.size());
        cpu::set_n_threads(1);
        cpu::matmul(m.p, x.data(), one.data(), T);
        cpu::set_n_threads(2);
        cpu::matmul(m.p, x.data(), two.data(), T);
        EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * 4)) << "T=" << T;
    }
    cpu::set_n_threads(before);
}

}  // namespace
}  // namespace alloy
