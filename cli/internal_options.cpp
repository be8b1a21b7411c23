#include "cli/internal_options.h"

#include "alloy/error.h"
#include "kernels/cpu/thread_pool.h"

namespace alloy::cli {

GgmlType parse_cache_type(const std::string& s, const char* flag) {
    check_cache_type(s, flag);
    return s == "f32" ? GgmlType::F32 : s == "f16" ? GgmlType::F16 : GgmlType::BF16;
}

KvCacheTypes kv_types(const ModelOptions& o) {
    return {parse_cache_type(o.cache_type_k, kCacheTypeKFlag), parse_cache_type(o.cache_type_v, kCacheTypeVFlag)};
}

ForwardOptions forward_options(const ModelOptions& o) {
    o.validate();
    ForwardOptions f;
    f.gdn_mode = o.gdn == "serial" ? ref::GdnMode::Serial : ref::GdnMode::Chunked;
    f.gdn_chunk = o.chunk;
    f.max_batch = o.batch / o.chunk * o.chunk;
    if (o.threads > 0) cpu::set_n_threads(o.threads);
    return f;
}

}  // namespace alloy::cli
