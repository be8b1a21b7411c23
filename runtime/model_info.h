// Facts about a loaded model that benchmarks report: size, parameter count, the bytes one
// decode step must stream, the FLOPs of one prefill token.
#pragma once
#include <cstdint>
#include <string>

#include "model/qwen35.h"

namespace alloy {

struct ModelInfo {
    std::string description;   // e.g. "qwen35 24L D1024 Q8_0"
    uint64_t file_bytes = 0;   // sum of tensor sizes
    uint64_t n_params = 0;     // sum of tensor elements (trunk + MTP block if present)
    uint64_t decode_bytes = 0; // weights read per decode token (LM head included) + GDN state r/w
    double matmul_flops_per_token = 0;  // 2 x matmul weights of the trunk (no LM head)
};

ModelInfo model_info(const Qwen35Model& m);

// "AMD EPYC ..." from /proc/cpuinfo, or "unknown".
std::string cpu_name();
// Peak resident set size of this process so far, in bytes.
uint64_t peak_rss_bytes();

}  // namespace alloy
