// The ISA paths a kernel test runs: every one up to the active ISA (ALLOY_ISA lowers it) for
// which the kernel has code of its own. Most CPU kernels have a portable path (which AVX2
// also runs) and an AVX-512 one; matmul has AVX2 kernels as well.
#pragma once
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace alloy::test {

inline std::vector<cpu::Isa> isa_paths(bool has_avx2_code = false) {
    std::vector<cpu::Isa> v{cpu::Isa::Scalar};
    if (has_avx2_code && cpu::active_isa() >= cpu::Isa::Avx2) v.push_back(cpu::Isa::Avx2);
    if (cpu::active_isa() >= cpu::Isa::Avx512) v.push_back(cpu::Isa::Avx512);
    return v;
}

}  // namespace alloy::test
