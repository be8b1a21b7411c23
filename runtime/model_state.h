// The mutable state of a model's sequences, by slot: what the forward reads and writes besides
// its scratch (runtime/slot_cache.h adds copy / snapshot / restore / truncate on it). Host
// memory: the CPU backend's; a device backend keeps its own copy of this layout.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "format/ggml_types.h"
#include "model/qwen35.h"
#include "runtime/zero_pages.h"

namespace alloy {

// Element types of the KV cache (llama.cpp's -ctk / -ctv): F32, F16 or BF16, f16 by default as in
// llama.cpp. K and V are computed in fp32 and rounded to the cache type when stored
// (kernels/ref/kv_store.h); attention reads the rounded values.
struct KvCacheTypes {
    GgmlType k = GgmlType::F16, v = GgmlType::F16;
};

// The mutable state of n_slots sequences (runtime/slot_cache.h adds copy / snapshot / restore /
// truncate): per attention layer a KV cache per slot, per GDN layer the conv and recurrent
// states of every slot in one array, so the GDN op of a batch updates its sequences' slots in
// place (kernels' seq_slots). Sized once for n_ctx positions per slot; the KV pages past the
// rows written so far are never touched (runtime/zero_pages.h), so they cost no resident memory.
// A device backend's copy of one slot's GDN states (runtime/slot_cache.h's snapshot kept in
// the device's memory: a speculative step's rollback then copies nothing through the host).
struct DeviceSnapshot {
    virtual ~DeviceSnapshot() = default;
    virtual size_t bytes() const = 0;  // device memory held
};
// A device backend's copy of the state (its own memory, the same layout per slot): the backend
// that made the state reads and writes it; reset clears one slot's part.
struct DeviceState {
    virtual ~DeviceState() = default;
    virtual void reset(int slot) = 0;
    // The slot state cache's operations (runtime/slot_cache.h) on the device's copy, each done
    // when it returns: to := from for KV rows [0, n_rows) and the GDN states; a slot's GDN
    // states into device memory, and back (throws for a snapshot of another state or model).
    virtual void copy(int from, int to, int n_rows) = 0;
    virtual std::shared_ptr<const DeviceSnapshot> snapshot(int slot) = 0;
    virtual void restore(int slot, const DeviceSnapshot& snap) = 0;
};

struct ModelState {
    int n_slots = 0;
    int n_ctx = 0;                               // positions per slot
    KvCacheTypes kv_types;
    std::vector<int> n_past;                     // [n_slots] tokens each slot holds
    std::vector<std::vector<ZeroPages>> k_cache, v_cache;  // [layer][slot] (empty for GDN layers):
                                                 // [n_ctx, n_head_kv*head_dim] of kv_types.k / .v
    std::vector<std::vector<float>> conv_state;  // per layer: [n_slots, conv_dim, K-1]
    std::vector<std::vector<float>> ssm_state;   // per layer: [n_slots, H_v, d_v, d_k]
    size_t conv_elems = 0, ssm_elems = 0;        // per slot: conv_dim*(K-1), H_v*d_v*d_k
    std::shared_ptr<DeviceState> device;         // a device backend's state (the host arrays above are then empty)

    float* conv(int layer, int slot) { return conv_state[size_t(layer)].data() + size_t(slot) * conv_elems; }
    float* ssm(int layer, int slot) { return ssm_state[size_t(layer)].data() + size_t(slot) * ssm_elems; }
    const float* conv(int layer, int slot) const { return conv_state[size_t(layer)].data() + size_t(slot) * conv_elems; }
    const float* ssm(int layer, int slot) const { return ssm_state[size_t(layer)].data() + size_t(slot) * ssm_elems; }
    void check_slot(int slot) const;  // throws naming the slot and the range
    void reset(int slot);  // back to an empty sequence (cache rows are overwritten before they are read)
    void reset();          // every slot
};

// Fresh states of n_slots sequences of up to n_ctx tokens each for a model of these
// hyperparameters; throws for n_ctx <= 0, n_slots outside [1, 4096] or a cache type other than
// F32/F16/BF16.
ModelState new_model_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types = {}, int n_slots = 1);
// Adds the MTP block's KV cache (layer index n_layer, spec/MODEL.md section 8) to a host state,
// for the graphs of GraphSpec::mtp; throws for a device state or a model without the block.
void add_mtp_cache(ModelState& s, const Qwen35HParams& hp);
// A host state of the MTP block's cache alone (the trunk's layers empty), for
// ForwardOptions::mtp_hidden: a drafter keeps it beside the trunk's state, its n_past its own.
ModelState new_mtp_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types = {}, int n_slots = 1);
// The same checks and sizes, with every per-layer array left empty: the part a device backend
// shares before it allocates its own memory.
ModelState model_state_shape(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots);

}  // namespace alloy
