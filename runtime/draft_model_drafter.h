// A separate, smaller model with the target's vocabulary as the drafter (issue 21: --spec
// draft --draft-model F). Each request drafts on one slot of the draft model's own slot state
// cache: the slot holds the request's tokens so far (its prompt and emitted tokens, `fed`),
// and a round feeds what the slot lacks of the request's history in one call (the prompt, or
// the tokens emitted since the last round: the last of them is the one the target feeds next)
// whose last row gives draft 1, then drafts 2..k one decode step each, greedy. Drafts the
// verification rejected leave the slot ahead of the history: it goes back to the snapshot
// taken before the round's chained steps (none is taken for k = 1: nothing past the history is
// fed). The drafts only propose: verification decides, so the output is plain decode's
// whatever the draft model is (even another vocabulary's ids are only rejected drafts; the
// engine checks the vocabulary sizes so that they are at least valid ids).
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/slot_cache.h"

namespace alloy {

class DraftModelDrafter {
public:
    // m: the draft model's runner; cache: its slot states (the drafter resets `slot` first and
    // owns it while it lives); fo: how its prompt pieces run (the engine's forward options).
    DraftModelDrafter(const ModelRunner& m, SlotStateCache& cache, int slot, const ForwardOptions& fo);
    // Up to k drafts continuing `history` (every token of the request so far, the next token
    // the target feeds included); fewer where the draft model's context ends.
    std::vector<int32_t> draft(const std::vector<int32_t>& history, int k);

private:
    const ModelRunner& m_;
    SlotStateCache& cache_;
    int slot_;
    ForwardOptions fo_;
    std::vector<int32_t> fed_;               // the tokens the slot holds
    std::optional<StateSnapshot> snap_;      // the slot before the last round's chained steps
    int32_t run(const int32_t* ids, int n);  // feeds n tokens; the last row's greedy token
};

}  // namespace alloy
