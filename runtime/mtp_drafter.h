// The model's MTP head as a drafter (issue 21; spec/MODEL.md section 8) for one sequence: the
// head keeps its own cache (ModelRunner::new_mtp_state, on the runner's backend), fed with the trunk's pre-norm
// last-layer rows of the positions the sequence keeps and the token that followed each, as it
// was trained (scripts/train_tiny_default.py MtpHead: row t pairs
// h_t with token t + 1 at position t). The last such row predicts the token after the
// sequence's next one: draft 1. Drafts 2..k chain on the head's own output row (its h', before
// shared_head_norm) with the previous draft's embedding at the next position; those cache rows
// are overwritten when the trunk's real rows for the positions arrive. The cache starts at the
// first observed position (RoPE makes attention depend on distances only), so a caller may
// begin at a prompt's last row (the engine: the other prompt rows are not computed in a
// prefill whose logits are the last row's). Observed rows wait until the next draft() and run
// through the head as one call (the head's weights read once for all of them): a step that
// does not draft (SpecPolicy chose plain decode) costs a copy of its rows, not a forward of the
// head; at most 2 kMaxPending rows wait (then the older ones down to kMaxPending are dropped: the head's cache keeps stale rows
// there, which only makes drafts worse). The drafts only propose:
// verification (runtime/speculative.h) decides, so the output is plain decode's whatever they are.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/model_runner.h"

namespace alloy {

class MtpDrafter {
public:
    // m: a runner of its own for the head's plans (ModelRunner::with_own_plans; drafters may
    // share it), so that the head's plans do not push the trunk's out of its runner's cache.
    // Throws alloy::Error when the model has no MTP block.
    MtpDrafter(const ModelRunner& m, int n_ctx, KvCacheTypes kv_types = {});
    // The trunk's name for its last layer's rows, to dump them out of a forward
    // (ForwardOptions::dump): "blk.{n_layer - 1}.h".
    std::string trunk_rows_name() const;
    static constexpr int kMaxPending = 64;
    // Rows the trunk computed at positions pos0 .. pos0 + n - 1 (hidden [n, D]), next[i] the
    // token that followed position pos0 + i: kept for the head's cache there (over whatever a
    // chain left; rows at or after pos0 waiting from before are replaced).
    void observe(int pos0, const float* hidden, const int32_t* next, int n);
    // Up to k drafts after the last observed row (none before any observe): the waiting rows
    // run through the head first (the last one's prediction is the first draft).
    std::vector<int32_t> draft(int k);

private:
    const ModelRunner& m_;
    ModelState st_;
    std::vector<float> head_row_;           // the last row's h'
    int pos_ = -1;                          // the last observed row's position
    int base_ = -1;                         // the first observed position: the cache's row 0
    int32_t first_ = -1;                    // its prediction (valid when nothing waits)
    // Observed rows not yet through the head: positions pending_pos_.., [n, D] and their next tokens.
    int pending_pos_ = -1;
    std::vector<float> pending_rows_;
    std::vector<int32_t> pending_next_;
    void flush();
    int32_t run(int pos, const float* hidden, const int32_t* ids, int n);
    static const ModelRunner& check_mtp(const ModelRunner& m);
};

}  // namespace alloy
