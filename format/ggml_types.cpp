// Block layout facts per ggml type (spec/GGUF.md section 2). Only the types we can
// dequantize are "supported"; every other id is named in errors but rejected.
#include "format/ggml_types.h"

#include "alloy/error.h"

namespace alloy {

namespace {

const TypeTraits kF32{"f32", 1, 4};
const TypeTraits kF16{"f16", 1, 2};
const TypeTraits kBF16{"bf16", 1, 2};
const TypeTraits kQ4_0{"q4_0", 32, 18};   // f16 d + 16 bytes of nibbles
const TypeTraits kQ5_0{"q5_0", 32, 22};   // f16 d + u32 fifth bits + 16 bytes of nibbles
const TypeTraits kQ5_1{"q5_1", 32, 24};   // f16 d, f16 m, u32 fifth bits, 16 bytes of nibbles
const TypeTraits kQ8_0{"q8_0", 32, 34};   // f16 d + 32 int8
const TypeTraits kQ4_K{"q4_K", 256, 144}; // f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes
const TypeTraits kQ5_K{"q5_K", 256, 176}; // f16 d, f16 dmin, 12 scale bytes, 32 high-bit bytes, 128 nibble bytes
const TypeTraits kQ6_K{"q6_K", 256, 210}; // 128 ql + 64 qh + 16 int8 scales + f16 d
const TypeTraits kIQ4_NL{"iq4_nl", 32, 18}; // f16 d + 16 bytes of codebook indices (kIq4nlValues)
const TypeTraits kIQ4_XS{"iq4_xs", 256, 136};
const TypeTraits kMXFP4{"mxfp4", 32, 17};    // e8m0 shared exponent + 16 bytes of FP4 (E2M1) codes // f16 d, u16 scales_h, 4 scales_l bytes, 128 index bytes

const TypeTraits* lookup(uint32_t id) {
    switch (static_cast<GgmlType>(id)) {
        case GgmlType::F32: return &kF32;
        case GgmlType::F16: return &kF16;
        case GgmlType::Q4_0: return &kQ4_0;
        case GgmlType::Q5_0: return &kQ5_0;
        case GgmlType::Q5_1: return &kQ5_1;
        case GgmlType::Q8_0: return &kQ8_0;
        case GgmlType::Q4_K: return &kQ4_K;
        case GgmlType::Q5_K: return &kQ5_K;
        case GgmlType::Q6_K: return &kQ6_K;
        case GgmlType::IQ4_NL: return &kIQ4_NL;
        case GgmlType::IQ4_XS: return &kIQ4_XS;
        case GgmlType::BF16: return &kBF16;
        case GgmlType::MXFP4: return &kMXFP4;
    }
    return nullptr;
}

// Names of ids we know about but do not read, so errors say "q5_K" rather than a number.
const char* known_unsupported_name(uint32_t id) {
    switch (id) {
        case 3: return "q4_1";
        case 9: return "q8_1";
        case 10: return "q2_K";
        case 11: return "q3_K";
        case 15: return "q8_K";
        case 16: return "iq2_xxs";
        case 17: return "iq2_xs";
        case 18: return "iq3_xxs";
        case 19: return "iq1_s";
        case 21: return "iq3_s";
        case 22: return "iq2_s";
        case 24: return "i8";
        case 25: return "i16";
        case 26: return "i32";
        case 27: return "i64";
        case 28: return "f64";
        case 29: return "iq1_m";
        case 34: return "tq1_0";
        case 35: return "tq2_0";
        case 40: return "nvfp4";
        default: return nullptr;
    }
}

}  // namespace

const TypeTraits& type_traits(GgmlType t) {
    const TypeTraits* tr = lookup(static_cast<uint32_t>(t));
    if (!tr) {
        throw Error("unsupported ggml type " + type_name(static_cast<uint32_t>(t)) + " (id " +
                    std::to_string(static_cast<uint32_t>(t)) + ")");
    }
    return *tr;
}

bool type_supported(uint32_t raw_type_id) { return lookup(raw_type_id) != nullptr; }

std::string type_name(uint32_t raw_type_id) {
    if (const TypeTraits* tr = lookup(raw_type_id)) return tr->name;
    if (const char* n = known_unsupported_name(raw_type_id)) return n;
    return "type#" + std::to_string(raw_type_id);
}

}  // namespace alloy
