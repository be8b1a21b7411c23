#include "kernels/cpu/gemv_prefetch.h"

#include <algorithm>
#include <cstdlib>

#include "kernels/cpu/cpu_features.h"

namespace alloy::cpu::mm {

namespace {
// ALLOY_GEMV_PREFETCH if set, else `intel` on Intel and 0 elsewhere (gemv_prefetch.h).
int distance(int intel) {
    if (const char* e = std::getenv("ALLOY_GEMV_PREFETCH")) return std::max(0, std::atoi(e));
    return cpu_is_intel() ? intel : 0;
}
}  // namespace

int gemv_prefetch_q8_bytes() {
    static const int bytes = distance(2048);
    return bytes;
}

int gemv_prefetch_kquant_bytes() {
    static const int bytes = distance(512);
    return bytes;
}

}  // namespace alloy::cpu::mm
