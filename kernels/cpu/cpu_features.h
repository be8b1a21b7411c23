// Which vector ISA the CPU kernels use, decided once at run time (never by a rebuild).
// ALLOY_ISA=scalar|avx2|avx512 forces a lower path (for tests and comparisons).
#pragma once

namespace alloy::cpu {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2 };
Isa active_isa();
const char* isa_name(Isa isa);
// Whether the CPU's vendor is Intel (CPUID "GenuineIntel"): kernels whose speed differs by
// micro-architecture pick their variant by it (kernels/cpu/matmul_kquant.cpp).
bool cpu_is_intel();

}  // namespace alloy::cpu
