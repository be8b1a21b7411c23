#include "runtime/mtp_drafter.h"

#include <algorithm>

#include "alloy/error.h"
#include "runtime/sampler.h"

namespace alloy {

MtpDrafter::MtpDrafter(const ModelRunner& m, int n_ctx, KvCacheTypes kv_types)
    : m_(m), st_(new_mtp_state(m.hparams(), n_ctx, kv_types)) {
    if (!m.model().mtp()) throw Error("MTP drafter: the model has no MTP block (nextn_predict_layers is 0)");
    logits_.resize(size_t(m.hparams().n_vocab));
    head_row_.resize(size_t(m.hparams().n_embd));
}

std::string MtpDrafter::trunk_rows_name() const { return "blk." + std::to_string(m_.hparams().n_layer - 1) + ".h"; }

// The head alone on n rows at positions pos..: the last row's logits and h' kept.
void MtpDrafter::run(int pos, const float* hidden, const int32_t* ids, int n) {
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
    m_.forward(st_, ids, n, fo, logits_.data());
}

void MtpDrafter::observe(int pos0, const float* hidden, const int32_t* next, int n) {
    if (n <= 0) return;
    run(pos0, hidden, next, n);
    pos_ = pos0 + n - 1;
    first_ = greedy_token(logits_.data(), int(logits_.size()));
}

std::vector<int32_t> MtpDrafter::draft(int k) {
    std::vector<int32_t> d;
    if (pos_ < 0 || k <= 0) return d;
    d.push_back(first_);
    const std::vector<float> saved_row = head_row_;  // logits_ is read only right after a run: no copy
    for (int i = 1; i < k && pos_ - base_ + i < st_.n_ctx; ++i) {
        const std::vector<float> h = head_row_;
        run(pos_ + i, h.data(), &d.back(), 1);
        d.push_back(greedy_token(logits_.data(), int(logits_.size())));
    }
    head_row_ = saved_row;  // draft() again gives the same drafts (first_ is kept apart)
    return d;
}

}  // namespace alloy
