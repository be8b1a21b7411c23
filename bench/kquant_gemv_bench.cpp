// The K-quant decode GEMVs on repacked rows (WeightLayout::KqRows16, kernels/cpu/matmul_kquant.h)
// streamed from DRAM as decode streams them: a rotation of matrices larger than the last-level
// cache, each at a 2 MiB boundary (the model's weights sit line-aligned in 2 MiB pages,
// format/resident_bytes.cpp), P threads each on one contiguous share of the rows, one token.
//
//   kquant_gemv_bench N K TYPE [--isa avx2|zmm] [--threads P] [--offset BYTES] [--mib TOTAL]
//
// TYPE: q4_k | q5_k | q6_k | iq4_xs. Prints the median GB/s of the matrix bytes over 20 passes
// of the rotation. --offset moves every matrix BYTES past its boundary: session 46 found the
// AVX2 Q5_K kernel's old load order at 9-10 GB/s on aligned rows and 22-23 GB/s 16 bytes off a
// line, so a GEMV measured on std::vector bytes (16 bytes off) can mislead; judge on aligned rows.
// Weights as the kernel tests make them (tests/kernels/random_weights.h); the timing does not
// depend on the values.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/matmul_kquant.h"
#include "tests/kernels/random_weights.h"  // header-only: the kernel tests' random weights

using namespace alloy;
using namespace alloy::cpu;

namespace {

[[noreturn]] void usage(const char* why) {
    std::fprintf(stderr,
                 "kquant_gemv_bench: %s\nusage: kquant_gemv_bench N K q4_k|q5_k|q6_k|iq4_xs [--isa avx2|zmm] "
                 "[--threads P] [--offset BYTES] [--mib TOTAL]\n",
                 why);
    std::exit(2);
}

GgmlType type_of(const std::string& s) {
    if (s == "q4_k") return GgmlType::Q4_K;
    if (s == "q5_k") return GgmlType::Q5_K;
    if (s == "q6_k") return GgmlType::Q6_K;
    if (s == "iq4_xs") return GgmlType::IQ4_XS;
    usage(("unknown type " + s).c_str());
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 4) usage("N, K and TYPE are required");
    const int64_t N = std::atoll(argv[1]), K = std::atoll(argv[2]);
    const GgmlType type = type_of(argv[3]);
    std::string isa = "avx2";
    int P = 1;
    int64_t offset = 0, total_mib = 512;
    for (int i = 4; i < argc; ++i) {
        const std::string a = argv[i];
        if (i + 1 >= argc) usage(("missing value after " + a).c_str());
        if (a == "--isa") isa = argv[++i];
        else if (a == "--threads") P = std::atoi(argv[++i]);
        else if (a == "--offset") offset = std::atoll(argv[++i]);
        else if (a == "--mib") total_mib = std::atoll(argv[++i]);
        else usage(("unknown option " + a).c_str());
    }
    if (N <= 0 || N % 16 != 0) usage("N must be a positive multiple of 16 (groups of 16 rows)");
    if (K <= 0 || K % 256 != 0) usage("K must be a positive multiple of 256 (super-blocks)");
    if (P < 1 || P > 64) usage("--threads must be in [1, 64]");
    if (offset < 0 || offset > 4096) usage("--offset must be in [0, 4096]");
    if (isa != "avx2" && isa != "zmm") usage("--isa must be avx2 or zmm");
    if (active_isa() < Isa::Avx2) usage("the GEMVs need AVX2 (or ALLOY_ISA lowered the path)");
    if (isa == "zmm" && !(active_isa() >= Isa::Avx512 && mm::cpu_has_avx512_vnni()))
        usage("--isa zmm needs AVX-512 VNNI on this CPU");
    const mm::GemvFn gemv = isa == "zmm" ? mm::kq_r16_gemv_zmm(type) : mm::kq_r16_gemv_avx2(type);

    // One repacked matrix (the tests' random weights, the loader's repack), then copies of it
    // at 2 MiB boundaries (+ offset).
    std::mt19937 rng(1);
    std::vector<uint8_t> packed = random_weights(type, K, N, rng);
    const int64_t nb = K / 256, bytes = int64_t(packed.size()), row_bytes = bytes / N;
    WeightView R;
    R.type = type, R.n_in = K, R.n_out = N, R.row_bytes = row_bytes, R.data = packed.data();
    if (!repack_weight(R, packed.data())) usage("this type has no repacked layout");
    const size_t huge = size_t(2) << 20, stride = (size_t(bytes + offset) + huge - 1) / huge * huge;
    const int NM = int(std::max<int64_t>(2, total_mib * (int64_t(1) << 20) / int64_t(stride)));
    uint8_t* arena = static_cast<uint8_t*>(std::aligned_alloc(huge, stride * NM));
    if (arena == nullptr) usage("cannot allocate the matrices (lower --mib)");
    madvise(arena, stride * NM, MADV_HUGEPAGE);  // as format/resident_bytes.cpp: a hint
    for (int m = 0; m < NM; ++m) std::memcpy(arena + m * stride + offset, packed.data(), bytes);

    // Q8_K activations of one token.
    std::vector<int8_t> q(K);
    for (auto& x : q) x = int8_t(int(rng() % 255) - 127);
    std::vector<float> dx(nb, 0.01f);
    std::vector<int16_t> bsums(K / 16);
    for (auto& x : bsums) x = int16_t(int(rng() % 2001) - 1000);
    mm::ActRows act;
    act.K = K, act.q = q.data(), act.d = dx.data(), act.bsums = bsums.data();
    std::vector<float> y(N);

    auto run = [&](int m, int p) {
        WeightView W;
        W.type = type, W.n_in = K, W.n_out = N, W.row_bytes = row_bytes;
        W.layout = WeightLayout::KqRows16, W.data = arena + m * stride + offset;
        const int64_t g16 = N / 16, r0 = g16 * p / P * 16, r1 = g16 * (p + 1) / P * 16;
        if (r1 > r0) gemv(W, r0, r1 - r0, act, 0, 1, y.data(), N);
    };
    const int calls = 20 * NM;
    std::atomic<int> go{0}, done{0};
    std::vector<std::thread> workers;
    for (int p = 1; p < P; ++p)
        workers.emplace_back([&, p] {
            for (int c = 0; c < calls; ++c) {
                while (go.load(std::memory_order_acquire) <= c) {
                }
                run(c % NM, p);
                done.fetch_add(1, std::memory_order_acq_rel);
            }
        });
    std::vector<double> seconds;
    for (int c = 0; c < calls; ++c) {
        const auto t0 = std::chrono::steady_clock::now();
        go.store(c + 1, std::memory_order_release);
        run(c % NM, 0);
        while (done.load(std::memory_order_acquire) < (c + 1) * (P - 1)) {
        }
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    for (auto& w : workers) w.join();
    std::sort(seconds.begin(), seconds.end());
    const double med = seconds[seconds.size() / 2];
    std::printf("%s %s %lldx%lld, %d thread(s), offset %lld, %d matrices of %.2f MiB: median %.1f us = %.1f GB/s\n",
                argv[3], isa.c_str(), (long long)N, (long long)K, P, (long long)offset, NM, bytes / 1048576.0,
                med * 1e6, bytes / med / 1e9);
    std::free(arena);
    return 0;
}
