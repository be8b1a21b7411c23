// Slot state cache operations (runtime/slot_cache.h).
#include "runtime/slot_cache.h"

#include <cstring>
#include <string>

#include "alloy/error.h"

namespace alloy {

size_t StateSnapshot::bytes() const {
    size_t b = 0;
    for (const auto* group : {&conv_state, &ssm_state})
        for (const auto& v : *group) b += v.size() * sizeof(float);
    return b;
}

SlotStateCache::SlotStateCache(const Qwen35Model& model, int n_slots, int n_ctx, KvCacheTypes kv_types) {
    if (n_slots < 1) throw Error("slot state cache: needs at least one slot, got " + std::to_string(n_slots));
    slots_.reserve(size_t(n_slots));
    for (int i = 0; i < n_slots; ++i) slots_.push_back(model.new_state(n_ctx, kv_types));
}

SequenceState& SlotStateCache::slot(int i) {
    return const_cast<SequenceState&>(static_cast<const SlotStateCache&>(*this).slot(i));
}

const SequenceState& SlotStateCache::slot(int i) const {
    if (i < 0 || i >= size()) {
        throw Error("slot state cache: slot " + std::to_string(i) + " out of range (0.." + std::to_string(size() - 1) + ")");
    }
    return slots_[size_t(i)];
}

void SlotStateCache::copy(int from, int to) {
    const SequenceState& a = slot(from);
    SequenceState& b = slot(to);
    if (from == to) return;
    for (size_t l = 0; l < a.k_cache.size(); ++l) {
        for (auto [src, dst] : {std::pair{&a.k_cache[l], &b.k_cache[l]}, std::pair{&a.v_cache[l], &b.v_cache[l]}}) {
            if (src->bytes() == 0) continue;
            // Only the rows in use: the rest of the destination stays untouched (and unbacked).
            const size_t row = src->bytes() / size_t(a.n_ctx);
            std::memcpy(dst->data(), src->data(), row * size_t(a.n_past));
        }
    }
    b.conv_state = a.conv_state;
    b.ssm_state = a.ssm_state;
    b.n_past = a.n_past;
}

StateSnapshot SlotStateCache::snapshot(int i) const {
    const SequenceState& s = slot(i);
    return StateSnapshot{s.n_past, s.conv_state, s.ssm_state};
}

void SlotStateCache::check_shapes(int i, const StateSnapshot& snap, const char* op) const {
    const SequenceState& s = slot(i);
    bool same = snap.conv_state.size() == s.conv_state.size() && snap.ssm_state.size() == s.ssm_state.size();
    for (size_t l = 0; same && l < s.conv_state.size(); ++l) {
        same = snap.conv_state[l].size() == s.conv_state[l].size() && snap.ssm_state[l].size() == s.ssm_state[l].size();
    }
    if (!same) throw Error(std::string("slot state cache: ") + op + " of slot " + std::to_string(i) + ": the snapshot is of another model");
    if (snap.n_past < 0 || snap.n_past > s.n_ctx) {
        throw Error(std::string("slot state cache: ") + op + " of slot " + std::to_string(i) + ": snapshot at " +
                    std::to_string(snap.n_past) + " tokens does not fit the context of " + std::to_string(s.n_ctx));
    }
}

void SlotStateCache::restore(int i, const StateSnapshot& snap) {
    check_shapes(i, snap, "restore");
    SequenceState& s = slot(i);
    s.conv_state = snap.conv_state;
    s.ssm_state = snap.ssm_state;
    s.n_past = snap.n_past;
}

void SlotStateCache::truncate(int i, int n, const StateSnapshot& at_n) {
    const SequenceState& s = slot(i);
    if (n < 0 || n > s.n_past) {
        throw Error("slot state cache: truncate of slot " + std::to_string(i) + " to " + std::to_string(n) +
                    " tokens: it holds " + std::to_string(s.n_past));
    }
    if (at_n.n_past != n) {
        throw Error("slot state cache: truncate of slot " + std::to_string(i) + " to " + std::to_string(n) +
                    " tokens needs the GDN states at " + std::to_string(n) + "; the snapshot is at " +
                    std::to_string(at_n.n_past));
    }
    restore(i, at_n);
}

}  // namespace alloy
