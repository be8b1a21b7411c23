// The slot state cache: the sequence states of one model by slot (runtime/model_state.h ModelState),
// and the operations on them that the scheduler, the prefix cache and speculative rollback use.
// Layout (the GDN op's contract, kernels' seq_slots):
//   attention layer l: K, V per slot, contiguous [n_ctx, n_head_kv * head_dim] of the KV types
//   GDN layer l:       conv state [slots, conv_dim, K - 1], recurrent state [slots, H_v, d_v, d_k]
// A forward over a slot writes only KV rows at positions >= its n_past and overwrites the GDN
// states, so rows [0, n) stay as they were while the slot's first n tokens are unchanged:
// that is what makes a snapshot (GDN states + n_past, no KV rows) enough to go back to n.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "runtime/model_runner.h"

namespace alloy {

// The GDN states of a slot at n_past tokens; restoring it also cuts the KV cache back to n_past.
// Valid for the slot it was taken from while that slot's first n_past tokens stay the same.
struct StateSnapshot {
    int n_past = 0;
    std::vector<std::vector<float>> conv_state;  // per layer: [conv_dim, K-1] (empty: attention)
    std::vector<std::vector<float>> ssm_state;   // per layer: [H_v, d_v, d_k]
    // A device backend's state: the GDN states in its memory instead (the vectors above empty).
    std::shared_ptr<const DeviceSnapshot> device;
    size_t bytes() const;
};

// The operations below on a state itself (slots checked by the caller): SlotStateCache's, and
// a tensor-parallel state's on each rank's part (runtime/tensor_parallel_backend.cpp).
void copy_slot(ModelState& s, int from, int to);
StateSnapshot snapshot_slot(const ModelState& s, int slot);
void restore_slot(ModelState& s, int slot, const StateSnapshot& snap);  // shapes unchecked

class SlotStateCache {
public:
    // n_slots fresh states of n_ctx tokens each; throws alloy::Error for n_slots < 1.
    SlotStateCache(const ModelRunner& runner, int n_slots, int n_ctx, KvCacheTypes kv_types = {});

    int size() const { return state_.n_slots; }
    // The memory the forward reads and writes (ModelRunner::forward with a slot or a Batch).
    ModelState& state() { return state_; }
    const ModelState& state() const { return state_; }
    int n_past(int slot) const;  // throws naming the slot when out of range
    void reset(int slot);        // an empty sequence

    // to := from: KV rows [0, n_past), the GDN states and n_past (a shared prefix forked).
    void copy(int from, int to);
    StateSnapshot snapshot(int slot) const;
    // Back to the snapshot's point (speculative rollback, or a checkpoint of the prefix cache).
    void restore(int slot, const StateSnapshot& s);
    // KV cut to n tokens; the GDN states cannot be cut, so `at_n` must be a snapshot of this
    // slot at exactly n tokens (throws otherwise, naming both counts).
    void truncate(int slot, int n, const StateSnapshot& at_n);

private:
    void check_shapes(int slot, const StateSnapshot& s, const char* op) const;
    ModelState state_;
};

}  // namespace alloy
