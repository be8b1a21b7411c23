#include "runtime/mtp_drafter.h"

#include <algorithm>

#include "alloy/error.h"

namespace alloy {

MtpDrafter::MtpDrafter(const ModelRunner& m, int n_ctx, KvCacheTypes kv_types)
    : m_(m), st_(check_mtp(m).new_mtp_state(n_ctx, kv_types)) {
    head_row_.resize(size_t(m.hparams().n_embd));
}

const ModelRunner& MtpDrafter::check_mtp(const ModelRunner& m) {
    if (!m.model().mtp()) throw Error("MTP drafter: the model has no MTP block (nextn_predict_layers is 0)");
    return m;
}

std::string MtpDrafter::trunk_rows_name() const { return "blk." + std::to_string(m_.hparams().n_layer - 1) + ".h"; }

// The head alone on n rows at positions pos..: the last row's greedy token (picked where the
// logits are: one int32 from a GPU) and h' kept.
int32_t MtpDrafter::run(int pos, const float* hidden, const int32_t* ids, int n) {
    if (base_ < 0) base_ = pos;
    if (pos < base_ || pos - base_ + n > st_.n_ctx)
        throw Error("MTP drafter: positions " + std::to_string(pos) + ".." + std::to_string(pos + n - 1) +
                    " outside its cache of " + std::to_string(st_.n_ctx) + " from " + std::to_string(base_));
    ForwardOptions fo;
    fo.gdn_mode = ref::GdnMode::Serial;  // no GDN layer here; one plan key for every call
    fo.mtp_hidden = hidden;
    fo.max_batch = std::max(fo.max_batch, (n + fo.gdn_chunk - 1) / fo.gdn_chunk * fo.gdn_chunk);
    const std::string out = "blk." + std::to_string(m_.hparams().n_layer) + ".h";
    fo.dump = {out};
    const size_t D = head_row_.size();
    fo.dump_sink = [&](const std::string&, int64_t, const float* rows, int64_t n_rows, int64_t) {
        std::copy(rows + (n_rows - 1) * int64_t(D), rows + n_rows * int64_t(D), head_row_.begin());  // the last row's
    };
    st_.n_past[0] = pos - base_;  // the head's own positions: rows past it are rewritten here
    Batch b;
    b.add(0, ids, n, BatchLogits::Last, true);
    int32_t token = -1;
    m_.forward(st_, b, fo, nullptr, nullptr, &token);
    return token;
}

void MtpDrafter::observe(int pos0, const float* hidden, const int32_t* next, int n) {
    if (n <= 0) return;
    const size_t D = head_row_.size();
    const int waiting = int(pending_next_.size());
    if (waiting > 0 && pos0 >= pending_pos_ && pos0 <= pending_pos_ + waiting) {
        const size_t keep = size_t(pos0 - pending_pos_);  // the rows before pos0 still wait
        pending_rows_.resize(keep * D);
        pending_next_.resize(keep);
    } else {  // nothing waits, or a jump: the waiting rows are of other positions
        pending_rows_.clear();
        pending_next_.clear();
        pending_pos_ = pos0;
    }
    pending_rows_.insert(pending_rows_.end(), hidden, hidden + size_t(n) * D);
    pending_next_.insert(pending_next_.end(), next, next + n);
    // Over the limit by as much again: the oldest dropped at once (moving 64 rows every step
    // cost the H200 decode step ~3% at D = 1024).
    if (int(pending_next_.size()) > 2 * kMaxPending) {
        const size_t drop = pending_next_.size() - size_t(kMaxPending);
        pending_rows_.erase(pending_rows_.begin(), pending_rows_.begin() + long(drop * D));
        pending_next_.erase(pending_next_.begin(), pending_next_.begin() + long(drop));
        pending_pos_ += int(drop);
    }
    pos_ = pos0 + n - 1;
}

void MtpDrafter::flush() {
    if (pending_next_.empty()) return;
    first_ = run(pending_pos_, pending_rows_.data(), pending_next_.data(), int(pending_next_.size()));
    pending_rows_.clear();
    pending_next_.clear();
}

std::vector<int32_t> MtpDrafter::draft(int k) {
    std::vector<int32_t> d;
    if (pos_ < 0 || k <= 0) return d;
    flush();
    d.push_back(first_);
    const std::vector<float> saved_row = head_row_;
    for (int i = 1; i < k && pos_ - base_ + i < st_.n_ctx; ++i) {
        const std::vector<float> h = head_row_;
        d.push_back(run(pos_ + i, h.data(), &d.back(), 1));
    }
    head_row_ = saved_row;  // draft() again gives the same drafts (first_ is kept apart)
    return d;
}

}  // namespace alloy
