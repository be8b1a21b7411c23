#include "runtime/model_state.h"

#include <algorithm>
#include <string>

#include "alloy/error.h"
#include "kernels/ref/kv_store.h"

namespace alloy {

void ModelState::check_slot(int slot) const {
    if (slot < 0 || slot >= n_slots)
        throw Error("state slot " + std::to_string(slot) + " out of range (0.." + std::to_string(n_slots - 1) + ")");
}

void ModelState::reset(int slot) {
    check_slot(slot);
    n_past[size_t(slot)] = 0;
    if (device) device->reset(slot);
    for (size_t l = 0; l < conv_state.size(); ++l) {
        if (conv_state[l].empty()) continue;
        std::fill_n(conv(int(l), slot), conv_elems, 0.0f);
        std::fill_n(ssm(int(l), slot), ssm_elems, 0.0f);
    }
}

void ModelState::reset() {
    for (int s = 0; s < n_slots; ++s) reset(s);
}

ModelState model_state_shape(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) {
    if (n_ctx <= 0) throw Error("context size must be positive, got " + std::to_string(n_ctx));
    if (n_slots <= 0 || n_slots > 4096)
        throw Error("the number of sequence slots must be in [1, 4096], got " + std::to_string(n_slots));
    for (GgmlType t : {kv_types.k, kv_types.v})
        if (!ref::kv_type_supported(t))
            throw Error(std::string("KV cache type must be f32, f16 or bf16, got ") + type_traits(t).name);
    ModelState s;
    s.n_slots = n_slots;
    s.n_ctx = n_ctx;
    s.kv_types = kv_types;
    s.n_past.assign(size_t(n_slots), 0);
    s.conv_elems = size_t(hp.conv_dim()) * size_t(hp.conv_kernel - 1);
    s.ssm_elems = size_t(hp.ssm_H_v) * hp.ssm_d_v * hp.ssm_d_k;
    const size_t L = size_t(hp.n_layer);
    s.k_cache.resize(L);
    s.v_cache.resize(L);
    s.conv_state.resize(L);
    s.ssm_state.resize(L);
    return s;
}

void add_mtp_cache(ModelState& s, const Qwen35HParams& hp) {
    if (hp.n_layer_mtp <= 0) throw Error("the model has no MTP block (nextn_predict_layers is 0)");
    if (s.device) throw Error("the MTP head runs on host states only (the CPU backend) for now");
    const size_t L = size_t(hp.n_layer) + 1, kv = size_t(s.n_ctx) * size_t(hp.n_head_kv) * size_t(hp.head_dim);
    if (s.k_cache.size() >= L) return;  // added already
    s.k_cache.resize(L);
    s.v_cache.resize(L);
    s.conv_state.resize(L);
    s.ssm_state.resize(L);
    for (int slot = 0; slot < s.n_slots; ++slot) {
        s.k_cache[L - 1].emplace_back(kv * ref::kv_elem_bytes(s.kv_types.k));
        s.v_cache[L - 1].emplace_back(kv * ref::kv_elem_bytes(s.kv_types.v));
    }
}

ModelState new_mtp_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) {
    ModelState s = model_state_shape(hp, n_ctx, kv_types, n_slots);
    add_mtp_cache(s, hp);
    return s;
}

ModelState new_model_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) {
    ModelState s = model_state_shape(hp, n_ctx, kv_types, n_slots);
    const size_t kv = size_t(n_ctx) * size_t(hp.n_head_kv) * size_t(hp.head_dim);
    for (int l = 0; l < hp.n_layer; ++l) {
        if (hp.is_recurrent(l)) {
            s.conv_state[size_t(l)].assign(s.conv_elems * size_t(n_slots), 0.0f);
            s.ssm_state[size_t(l)].assign(s.ssm_elems * size_t(n_slots), 0.0f);
        } else {
            for (int slot = 0; slot < n_slots; ++slot) {
                s.k_cache[size_t(l)].emplace_back(kv * ref::kv_elem_bytes(kv_types.k));
                s.v_cache[size_t(l)].emplace_back(kv * ref::kv_elem_bytes(kv_types.v));
            }
        }
    }
    return s;
}
}  // namespace alloy
