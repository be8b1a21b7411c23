// What a speculative verification step keeps so that a rollback rebuilds the GDN states of the
// tokens it keeps without running the model again (issue 21's "rollback without the re-run"):
// per GDN layer, the fused op's inputs for the step's tokens (qkv, a, b rows: the outputs of
// the layer's input projections). Rolling a slot back restores its snapshot (the GDN states
// before the step), runs each GDN layer's op again on the kept tokens' logged rows, and moves
// n_past to the kept tokens; their KV rows are the ones the verification wrote. The serial
// kernel gives a token the same bits whatever the split of the call's tokens, so the slot
// ends exactly as plain decode of the kept tokens would leave it, for the cost of the GDN ops
// alone instead of a whole forward (the matmuls' weights streamed again).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/ref/gdn.h"

namespace alloy {

struct GdnReplayLog {
    // The step, as ModelRunner::forward ran it: per sequence its slot, its first row in the
    // step (offsets [n_seqs + 1]), the tokens its slot held before, and the step's token ids.
    bool valid = false;  // false: nothing usable (no step yet, or a step of several pieces)
    std::vector<int32_t> slots, offsets, n_past, ids;
    struct Layer {
        int layer = 0;
        ref::GdnParams params;    // the op's (mode forced to serial on replay)
        ref::GdnWeights weights;  // the backend's pointers to the layer's conv / gate / norm weights
        int conv_dim = 0, value_dim = 0, H_v = 0;
        std::vector<float> qkv, a, b;  // [n, conv_dim], [n, H_v], [n, H_v]: the step's rows
        // A device backend's log: the same rows in its memory (valid until its next logged
        // step of the same plan); the vectors above then stay empty.
        const float* dev_qkv = nullptr;
        const float* dev_a = nullptr;
        const float* dev_b = nullptr;
    };
    std::vector<Layer> layers;  // in the step's order
    void clear() {
        valid = false;
        slots.clear(), offsets.clear(), n_past.clear(), ids.clear(), layers.clear();
    }
    // The step's sequence on `slot` if the log can rebuild it at `kept` tokens from a state of
    // `n_past_before` tokens whose next tokens were `kept_ids`; else -1.
    int usable(int slot, int n_past_before, const std::vector<int32_t>& kept_ids) const {
        if (!valid || layers.empty()) return -1;
        for (std::size_t i = 0; i + 1 < offsets.size(); ++i) {
            if (slots[i] != slot) continue;
            const int n = offsets[i + 1] - offsets[i];
            if (n_past[i] != n_past_before || int(kept_ids.size()) > n) return -1;
            for (std::size_t t = 0; t < kept_ids.size(); ++t)
                if (ids[std::size_t(offsets[i]) + t] != kept_ids[t]) return -1;
            return int(i);
        }
        return -1;
    }
};

}  // namespace alloy
