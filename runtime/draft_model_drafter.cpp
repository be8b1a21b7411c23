#include "runtime/draft_model_drafter.h"

#include <algorithm>

#include "alloy/error.h"

namespace alloy {

DraftModelDrafter::DraftModelDrafter(const ModelRunner& m, SlotStateCache& cache, int slot, const ForwardOptions& fo)
    : m_(m), cache_(cache), slot_(slot), fo_(fo) {
    cache_.reset(slot_);
    fo_.dump.clear();
    fo_.dump_sink = nullptr;
    fo_.gdn_log = nullptr;
    fo_.mtp = false;
    fo_.mtp_hidden = nullptr;
    fo_.all_logits = false;
}

int32_t DraftModelDrafter::run(const int32_t* ids, int n) {
    Batch b;
    // Prompts through the engine's GDN mode (chunked for long ones), a step's few tokens serial.
    b.add(slot_, ids, n, BatchLogits::Last, n <= ModelRunner::kSmallStepBucket || fo_.gdn_mode == ref::GdnMode::Serial);
    ForwardOptions fo = fo_;
    if (n <= ModelRunner::kSmallStepBucket) fo.gdn_mode = ref::GdnMode::Serial;
    int32_t token = -1;
    m_.forward(cache_.state(), b, fo, nullptr, nullptr, &token);
    fed_.insert(fed_.end(), ids, ids + n);
    return token;
}

std::vector<int32_t> DraftModelDrafter::draft(const std::vector<int32_t>& history, int k) {
    std::vector<int32_t> d;
    if (history.empty() || k <= 0) return d;
    // The slot ahead of the history (a draft was rejected) or off it: back to what is shared.
    const size_t common = size_t(std::mismatch(fed_.begin(), fed_.end(), history.begin(), history.end()).first - fed_.begin());
    if (common < fed_.size()) {
        if (snap_ && size_t(snap_->n_past) <= common) {
            cache_.restore(slot_, *snap_);
            fed_.resize(size_t(snap_->n_past));
        } else {
            cache_.reset(slot_);
            fed_.clear();
        }
    }
    snap_.reset();
    const int n_ctx = cache_.state().n_ctx;
    if (int(history.size()) > n_ctx) return d;
    // Draft 1 from the history's last row (the slot gets everything it lacks, in pieces of the
    // runner's batch size), then the chained steps.
    d.push_back(run(history.data() + fed_.size(), int(history.size() - fed_.size())));
    k = std::min(k, n_ctx - int(history.size()) + 1);
    if (k > 1) snap_ = cache_.snapshot(slot_);
    while (int(d.size()) < k) d.push_back(run(&d.back(), 1));
    return d;
}

}  // namespace alloy
