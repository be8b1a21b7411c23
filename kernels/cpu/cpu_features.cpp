#include "kernels/cpu/cpu_features.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace alloy::cpu {

#if defined(__x86_64__)
// The AVX2 kernels also convert f16 with F16C (every AVX2 CPU has it, but it is its own CPUID
// bit; clang 14's __builtin_cpu_supports does not know the name).
static bool has_f16c() {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

static Isa detect() {
    Isa best = Isa::Scalar;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) best = Isa::Avx2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) best = Isa::Avx512;
#endif
    if (const char* want = std::getenv("ALLOY_ISA")) {
        Isa asked = best;
        if (!std::strcmp(want, "scalar")) asked = Isa::Scalar;
        else if (!std::strcmp(want, "avx2")) asked = Isa::Avx2;
        else if (!std::strcmp(want, "avx512")) asked = Isa::Avx512;
        else std::fprintf(stderr, "alloy: ALLOY_ISA=%s is not scalar, avx2 or avx512; ignored\n", want);
        if (asked < best) best = asked;  // can only lower, never claim what the CPU lacks
    }
    return best;
}

Isa active_isa() {
    static const Isa isa = detect();
    return isa;
}

bool cpu_is_intel() {
#if defined(__x86_64__)
    static const bool intel = [] {
        unsigned a = 0, b = 0, c = 0, d = 0;
        if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
        char v[13];
        std::memcpy(v, &b, 4), std::memcpy(v + 4, &d, 4), std::memcpy(v + 8, &c, 4);
        v[12] = 0;
        return std::strcmp(v, "GenuineIntel") == 0;
    }();
    return intel;
#else
    return false;
#endif
}

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::Avx512: return "avx512";
        case Isa::Avx2: return "avx2";
        default: return "scalar";
    }
}

}  // namespace alloy::cpu
