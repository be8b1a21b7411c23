#include "runtime/engine_options.h"

#include "alloy/error.h"
#include "kernels/cpu/thread_pool.h"

namespace alloy {

ForwardOptions forward_options(const EngineOptions& o) {
    ForwardOptions f;
    if (o.gdn == "serial") f.gdn_mode = ref::GdnMode::Serial;
    else if (o.gdn == "chunked") f.gdn_mode = ref::GdnMode::Chunked;
    else throw Error("engine: gdn must be 'serial' or 'chunked', got '" + o.gdn + "'");
    if (o.gdn_chunk < 1 || o.gdn_chunk > 1024)
        throw Error("engine: gdn_chunk must be in [1, 1024], got " + std::to_string(o.gdn_chunk));
    if (o.batch_size < o.gdn_chunk)
        throw Error("engine: batch_size must be >= gdn_chunk (" + std::to_string(o.gdn_chunk) + "), got " +
                    std::to_string(o.batch_size));
    if (o.threads < 0) throw Error("engine: threads must be >= 0, got " + std::to_string(o.threads));
    f.gdn_chunk = o.gdn_chunk;
    f.max_batch = o.batch_size / o.gdn_chunk * o.gdn_chunk;
    if (o.threads > 0) cpu::set_n_threads(o.threads);
    return f;
}

GgmlType kv_cache_type(const std::string& name, const std::string& field) {
    if (name == "f32") return GgmlType::F32;
    if (name == "f16") return GgmlType::F16;
    if (name == "bf16") return GgmlType::BF16;
    throw Error(field + " must be f32, f16 or bf16, got '" + name + "'");
}

KvCacheTypes kv_cache_types(const EngineOptions& o) {
    return {kv_cache_type(o.cache_type_k, "engine: cache_type_k"), kv_cache_type(o.cache_type_v, "engine: cache_type_v")};
}

}  // namespace alloy
