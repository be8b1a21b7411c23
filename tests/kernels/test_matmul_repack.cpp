// Q4_K, Q5_K, Q6_K and IQ4_XS rows repacked at load (WeightLayout::KqRows16, kernels/cpu/matmul_kquant.h): every CPU
// path that reads a repacked matrix gives the bits it gives the same matrix as stored (GGUF rows):
// the decode GEMVs (rows in SIMD lanes, the same integer lane sums and fp32 steps), the prefill
// tiles and the scalar paths (rows unpacked), matmul_multi and matmul_swiglu; row counts that are
// not multiples of the group (a GGUF tail) and row ranges that cut groups.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_act.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_kquant.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/matmul.h"
#include "tests/kernels/isa_paths.h"
#include "tests/kernels/random_weights.h"

namespace alloy {
namespace {

std::vector<cpu::Isa> isas() { return test::isa_paths(/*has_avx2_code=*/true); }

const GgmlType kTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS};
std::string tname(GgmlType t) { return type_traits(t).name; }

// A matrix as stored and its repacked copy.
struct Pair {
    std::vector<uint8_t> gguf, packed;
    WeightView g, p;
    Pair(GgmlType type, int64_t n_in, int64_t n_out, std::mt19937& rng) {
        gguf = random_weights(type, n_in, n_out, rng);
        packed = gguf;
        g = WeightView{type, n_in, n_out, gguf.data(), row_bytes(type, n_in)};
        p = g;
        p.data = packed.data();
        EXPECT_TRUE(cpu::repack_weight(p, packed.data()));
        EXPECT_EQ(p.layout, WeightLayout::KqRows16);
    }
};

std::vector<float> randn(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);  // (never all zeros)
    return v;
}

TEST(KqRepack, EveryRowUnpacksToItsStoredBytes) {
    std::mt19937 rng(3);
    for (GgmlType type : kTypes)
    for (int64_t n_out : {16, 37, 53, 1501})
        for (int64_t n_in : {256, 1280}) {
            Pair m(type, n_in, n_out, rng);
            const int64_t full = n_out / 16 * 16;
            // The groups moved (random codes: some byte differs), the tail did not.
            EXPECT_NE(0, std::memcmp(m.gguf.data(), m.packed.data(), size_t(full) * m.g.row_bytes));
            EXPECT_EQ(0, std::memcmp(m.gguf.data() + full * m.g.row_bytes, m.packed.data() + full * m.g.row_bytes,
                                     size_t(n_out - full) * m.g.row_bytes));
            std::vector<uint8_t> buf(m.g.row_bytes);
            for (int64_t r = 0; r < n_out; ++r)
                ASSERT_EQ(0, std::memcmp(cpu::weight_row(m.p, r, buf.data()), m.g.row(r), m.g.row_bytes))
                    << tname(type) << " n_in=" << n_in << " n_out=" << n_out << " row " << r;
        }
    // Nothing to do for other types, other layouts, or fewer rows than a group.
    std::vector<uint8_t> b = random_weights(GgmlType::Q4_0, 256, 32, rng);
    WeightView q40{GgmlType::Q4_0, 256, 32, b.data(), row_bytes(GgmlType::Q4_0, 256)};
    EXPECT_FALSE(cpu::repack_weight(q40, b.data()));
    std::vector<uint8_t> s = random_weights(GgmlType::Q4_K, 256, 15, rng);
    WeightView small{GgmlType::Q4_K, 256, 15, s.data(), row_bytes(GgmlType::Q4_K, 256)};
    EXPECT_FALSE(cpu::repack_weight(small, s.data()));
    // A view of the first half of each row (row_bytes past its n_in) is not a whole matrix.
    std::vector<uint8_t> h = random_weights(GgmlType::Q4_K, 512, 32, rng);
    WeightView half{GgmlType::Q4_K, 256, 32, h.data(), row_bytes(GgmlType::Q4_K, 512)};
    EXPECT_FALSE(cpu::repack_weight(half, h.data()));
    Pair twice(GgmlType::Q6_K, 256, 32, rng);
    EXPECT_FALSE(cpu::repack_weight(twice.p, twice.packed.data()));
}

// kq_unpack_group (all 16 rows of a group; dword transposes from AVX2 up) gives each row's stored
// bytes on every path, for every type and row length, on a group in the middle of a matrix.
TEST(KqRepack, GroupUnpackGivesEveryRowsBytes) {
    std::mt19937 rng(5);
    for (GgmlType type : kTypes)
        for (int64_t n_in : {256, 768, 2816}) {
            Pair m(type, n_in, 53, rng);
            const size_t rb = m.g.row_bytes;
            for (cpu::Isa isa : isas())
                for (int64_t g0 : {0, 16, 32}) {
                    std::vector<uint8_t> out(16 * rb + 1, 0xA5);
                    cpu::mm::kq_unpack_group(type, m.p.row(g0), n_in / 256, out.data(), isa);
                    for (int r = 0; r < 16; ++r)
                        ASSERT_EQ(0, std::memcmp(out.data() + r * rb, m.g.row(g0 + r), rb))
                            << tname(type) << " n_in=" << n_in << " group at " << g0 << " row " << r << " isa "
                            << cpu::isa_name(isa);
                    EXPECT_EQ(0xA5, out[16 * rb]) << "wrote past the group's rows";
                }
        }
}

// matmul on the repacked matrix = matmul on the stored one, bit for bit, on every ISA path and
// token count (T <= 16: the GEMVs; 17 and up: the tiles or fp32 rows, which unpack rows).
TEST(KqRepack, MatmulGivesTheStoredMatrixBitsOnEveryPathAndTokenCount) {
    std::mt19937 rng(11);
    cpu::MatmulScratch scratch;
    struct Shape { int64_t n_in, n_out; };
    for (GgmlType type : kTypes)
    for (const Shape sh : {Shape{256, 37}, Shape{4096 + 256, 19}, Shape{1024, 67}, Shape{512, 1501}, Shape{768, 32}}) {
        Pair m(type, sh.n_in, sh.n_out, rng);
        std::vector<int64_t> Ts;
        for (int64_t t = 1; t <= 17; ++t) Ts.push_back(t);
        Ts.push_back(40);
        for (int64_t T : Ts) {
            const std::vector<float> x = randn(size_t(T * sh.n_in), rng);
            for (cpu::Isa isa : isas()) {
                std::vector<float> want(size_t(T * sh.n_out), NAN), got(want.size(), NAN);
                cpu::matmul(m.g, x.data(), want.data(), T, isa, scratch);
                cpu::matmul(m.p, x.data(), got.data(), T, isa, scratch);
                for (float v : got) ASSERT_TRUE(std::isfinite(v));
                ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4))
                    << tname(type) << " " << cpu::isa_name(isa) << " n_in=" << sh.n_in << " n_out=" << sh.n_out << " T=" << T;
            }
        }
    }
}

// The repacked path is right, not only equal to the stored one: against ref::matmul on the
// effective input (the contract's tight tolerance).
TEST(KqRepack, MatchesTheReference) {
    std::mt19937 rng(13);
    cpu::MatmulScratch scratch;
    for (GgmlType type : kTypes)
    for (int64_t T : {1, 3, 16, 17}) {
        Pair m(type, 1024, 53, rng);
        const std::vector<float> x = randn(size_t(T * 1024), rng);
        std::vector<float> xe(x.size()), want(size_t(T * 53));
        cpu::matmul_effective_input(type, x.data(), xe.data(), T, 1024);
        ref::matmul(m.g, xe.data(), want.data(), T);
        for (cpu::Isa isa : isas()) {
            std::vector<float> got(want.size(), NAN);
            cpu::matmul(m.p, x.data(), got.data(), T, isa, scratch);
            EXPECT_LT(rel_err(got, want), 1e-5) << tname(type) << " " << cpu::isa_name(isa) << " T=" << T;
        }
    }
}

// Every repacked GEMV variant called directly on row ranges that start and end inside groups
// and reach into the GGUF tail: the stored-layout GEMV's bits (AVX2 build: the AVX2 one; VNNI:
// the VNNI one, which gives the AVX2 bits too), 1 to 4 tokens.
TEST(KqRepack, GemvVariantsGiveTheStoredGemvBitsOnAnyRowRange) {
    if (cpu::active_isa() < cpu::Isa::Avx2) GTEST_SKIP() << "no AVX2 here";
    std::mt19937 rng(17);
    struct Variant { const char* name; cpu::mm::GemvFn fn; };
    for (GgmlType type : kTypes) {
    std::vector<Variant> vs{{"avx2", cpu::mm::kq_r16_gemv_avx2(type)}};
    if (cpu::active_isa() >= cpu::Isa::Avx512 && cpu::mm::cpu_has_avx512_vnni()) {
        vs.push_back({"vnni ymm", cpu::mm::kq_r16_gemv_vnni(type)});
        vs.push_back({"zmm", cpu::mm::kq_r16_gemv_zmm(type, false)});
        if (cpu::mm::GemvFn v = cpu::mm::kq_r16_gemv_zmm(type, true)) vs.push_back({"zmm vbmi / gfni", v});
    }
    const cpu::mm::GemvFn stored = cpu::mm::kquant_gemv_avx2(type);
    const int64_t K = 1280, N = 75;  // 4 groups and an 11-row tail
    Pair m(type, K, N, rng);
    struct Range { int64_t r0, nr; };
    for (int nt = 1; nt <= 4; ++nt) {
        const std::vector<float> x = randn(size_t(nt * K), rng);
        std::vector<float> d(size_t(nt * K / 256));
        std::vector<int8_t> q(x.size());
        std::vector<int16_t> bsums(size_t(nt * K / 16));
        for (int t = 0; t < nt; ++t)
            cpu::mm::quantize_q8k(x.data() + t * K, K, q.data() + t * K, d.data() + t * (K / 256), bsums.data() + t * (K / 16));
        cpu::mm::ActRows a;
        a.K = K, a.q = q.data(), a.d = d.data(), a.bsums = bsums.data();
        std::vector<float> want(size_t(nt * N), NAN);
        stored(m.g, 0, N, a, 0, nt, want.data(), N);
        for (const Variant& v : vs)
            for (const Range rg : {Range{0, N}, Range{5, 30}, Range{16, 16}, Range{9, 2}, Range{60, 15}, Range{63, 12}}) {
                std::vector<float> got(want.size(), NAN);
                v.fn(m.p, rg.r0, rg.nr, a, 0, nt, got.data(), N);
                for (int t = 0; t < nt; ++t)
                    for (int64_t r = 0; r < N; ++r) {
                        const float g = got[size_t(t * N + r)], w = want[size_t(t * N + r)];
                        if (r < rg.r0 || r >= rg.r0 + rg.nr) {
                            ASSERT_TRUE(std::isnan(g)) << tname(type) << " " << v.name << ": wrote row " << r << " outside its range";
                        } else {
                            ASSERT_EQ(0, std::memcmp(&g, &w, 4)) << tname(type) << " " << v.name << " T=" << nt << " rows ["
                                                                 << rg.r0 << ", " << rg.r0 + rg.nr << ") row " << r;
                        }
                    }
            }
    }
    }
}

// matmul_multi (one shared call, mixed layouts, mixed K-quant types) and matmul_swiglu (GEMVs
// and the fused tiles) on repacked matrices: the stored matrices' bits.
TEST(KqRepack, MultiAndSwigluGiveTheStoredBits) {
    std::mt19937 rng(19);
    cpu::MatmulScratch scratch;
    const int64_t K = 512;
    Pair a(GgmlType::Q4_K, K, 301, rng), b(GgmlType::Q4_K, K, 48, rng), c(GgmlType::Q6_K, K, 37, rng);
    Pair e(GgmlType::Q5_K, K, 29, rng), f(GgmlType::IQ4_XS, K, 45, rng);
    for (int64_t T : {1, 4, 9, 16, 17, 33}) {
        const std::vector<float> x = randn(size_t(T * K), rng);
        for (cpu::Isa isa : isas()) {
            const std::string what = std::string(cpu::isa_name(isa)) + " T=" + std::to_string(T);
            // All repacked (Q4_K, Q4_K, Q6_K); one stored beside repacked ones; Q5_K and IQ4_XS
            // repacked beside Q4_K; a stored IQ4_XS beside repacked Q5_K and Q6_K.
            const WeightView* sets[][3] = {{&a.p, &b.p, &c.p}, {&a.p, &b.g, &c.p}, {&a.p, &e.p, &f.p}, {&e.p, &f.g, &c.p}};
            const WeightView* plain[][3] = {{&a.g, &b.g, &c.g}, {&a.g, &b.g, &c.g}, {&a.g, &e.g, &f.g}, {&e.g, &f.g, &c.g}};
            for (int s = 0; s < 4; ++s) {
                std::vector<std::vector<float>> want(3), got(3);
                cpu::MatmulOut ow[3], og[3];
                for (int j = 0; j < 3; ++j) {
                    want[j].assign(size_t(T * sets[s][j]->n_out), NAN);
                    got[j].assign(want[j].size(), NAN);
                    ow[j] = {plain[s][j], want[j].data()};
                    og[j] = {sets[s][j], got[j].data()};
                }
                cpu::matmul_multi(ow, 3, x.data(), T, isa, scratch);
                cpu::matmul_multi(og, 3, x.data(), T, isa, scratch);
                for (int j = 0; j < 3; ++j)
                    EXPECT_EQ(0, std::memcmp(want[j].data(), got[j].data(), want[j].size() * 4))
                        << what << " set " << s << " weight " << j;
            }
            Pair up(GgmlType::Q4_K, K, 301, rng);
            std::vector<float> yw(size_t(T * 301)), uw(yw.size()), yg(yw.size(), NAN), ug(yw.size(), NAN);
            cpu::matmul_swiglu(a.g, up.g, x.data(), yw.data(), uw.data(), T, isa, scratch);
            cpu::matmul_swiglu(a.p, up.p, x.data(), yg.data(), ug.data(), T, isa, scratch);
            EXPECT_EQ(0, std::memcmp(yw.data(), yg.data(), yw.size() * 4)) << "swiglu " << what;
        }
    }
}

// Two pool threads and one give the same bits (the GEMV items' bounds follow the groups).
TEST(KqRepack, ResultDoesNotDependOnThreadCount) {
    std::mt19937 rng(29);
    const int before = cpu::n_threads();
    for (GgmlType type : kTypes)
    for (int64_t T : {1, 5, 20}) {
        Pair m(type, 1024, 1501, rng);
        const std::vector<float> x = randn(size_t(T * 1024), rng);
        std::vector<float> one(size_t(T * 1501)), two(one.size());
        cpu::set_n_threads(1);
        cpu::matmul(m.p, x.data(), one.data(), T);
        cpu::set_n_threads(2);
        cpu::matmul(m.p, x.data(), two.data(), T);
        EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * 4)) << tname(type) << " T=" << T;
    }
    cpu::set_n_threads(before);
}

}  // namespace
}  // namespace alloy
