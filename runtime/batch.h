// The input of one forward step (the scheduler's unit) and the options of a forward.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ref/gdn.h"
#include "runtime/plan.h"

namespace alloy {
struct GdnReplayLog;  // runtime/gdn_replay.h

// Which logits a sequence of a batch returns.
enum class BatchLogits { None, Last, All };

// One forward step over one or more sequences (the scheduler's unit): each sequence is a run of
// consecutive tokens continuing its slot, at positions n_past[slot], n_past[slot] + 1, ...
// (a slot's tokens are always appended: the state operations rewind a slot, not the batch).
struct BatchSeq {
    int slot = 0;
    int n_tokens = 0;
    BatchLogits logits = BatchLogits::Last;
    // Run this sequence's GDN layers with the serial kernel (decode and speculative
    // verification: the same bits for any split of its tokens); else ForwardOptions::gdn_mode.
    bool serial = false;
};

struct Batch {
    std::vector<int32_t> ids;   // [T] the sequences' tokens, concatenated in `seqs` order
    std::vector<BatchSeq> seqs;
    void add(int slot, const int32_t* tokens, int n, BatchLogits logits, bool serial) {
        ids.insert(ids.end(), tokens, tokens + n);
        seqs.push_back({slot, n, logits, serial});
    }
    // Rows of logits the forward writes: one per Last sequence, n_tokens per All one, in order.
    int64_t logit_rows() const {
        int64_t r = 0;
        for (const BatchSeq& q : seqs) r += q.logits == BatchLogits::All ? q.n_tokens : q.logits == BatchLogits::Last ? 1 : 0;
        return r;
    }
};

struct ForwardOptions {
    ref::GdnMode gdn_mode = ref::GdnMode::Chunked;
    int gdn_chunk = 64;
    bool all_logits = false;  // logits of every token, else only of the last
    // Longest piece one plan runs: longer prompts are processed in consecutive pieces (the
    // states carry over), which bounds the plan's buffers as llama.cpp's ubatch does.
    // A multiple of gdn_chunk.
    int max_batch = 512;
    // Intermediate tensors to hand to dump_sink at every step, by graph name (model/graph.h;
    // a trailing '*' matches a prefix): alloy logits --dump NAME.
    std::vector<std::string> dump;
    TensorSink dump_sink;
    // A verification step: where the backend logs its GDN ops' inputs so that a rollback can
    // rebuild the kept tokens' states without a re-run (runtime/gdn_replay.h; nullptr: not).
    GdnReplayLog* gdn_log = nullptr;
    // The logits are the MTP head's (graph::GraphSpec::mtp): row t predicts token t + 2. The
    // state needs the MTP cache (add_mtp_cache); one piece of at most max_batch tokens.
    bool mtp = false;
    // The MTP head alone (graph::GraphSpec::mtp_alone): its hidden rows [n, D] (the trunk's
    // pre-norm rows, or the head's own for a chained draft); the step's ids are the next tokens.
    // The state: new_mtp_state's (its n_past is the head's own position count). One piece.
    const float* mtp_hidden = nullptr;
    // Tensors to compute on every row (graph::GraphSpec::keep_rows), e.g. to dump them.
    std::vector<std::string> keep_rows;
};

}  // namespace alloy
