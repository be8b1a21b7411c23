// Residual add on the CPU: x += y, same contract as ref::add (kernels/ref/add.h); exact.
#pragma once
#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu {

// x: [n] updated in place; y: [n]. Large n runs on the pool (bandwidth of both cores).
void add(float* x, const float* y, int64_t n);
// Same on an explicit ISA path (tests).
void add(float* x, const float* y, int64_t n, Isa isa);

}  // namespace alloy::cpu
