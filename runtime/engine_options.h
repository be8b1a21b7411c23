// What include/alloy's string-named EngineOptions mean inside: the forward options, the KV cache
// types and where the weights live. One parse for the Engine and for the benchmarks that drive
// the model below it (bench, batched-bench, profile). Each throws alloy::Error naming the field.
#pragma once
#include <string>

#include "alloy/engine.h"
#include "format/gguf.h"
#include "runtime/batch.h"
#include "runtime/model_state.h"

namespace alloy {

// gdn, gdn_chunk, batch_size, threads checked; also sizes the process's thread pool when
// threads > 0.
ForwardOptions forward_options(const EngineOptions& o);
// "f32" | "f16" | "bf16"; `field` names the option in the error.
GgmlType kv_cache_type(const std::string& name, const std::string& field);
KvCacheTypes kv_cache_types(const EngineOptions& o);
inline gguf::TensorData tensor_placement(const EngineOptions& o) {
    return o.mmap ? gguf::TensorData::Mapped : gguf::TensorData::Resident;
}

}  // namespace alloy
