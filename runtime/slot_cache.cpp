// Slot state cache operations (runtime/slot_cache.h).
#include "runtime/slot_cache.h"

#include <algorithm>
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

SlotStateCache::SlotStateCache(const ModelRunner& runner, int n_slots, int n_ctx, KvCacheTypes kv_types) {
    if (n_slots < 1) throw Error("slot state cache: needs at least one slot, got " + std::to_string(n_slots));
    state_ = runner.new_state(n_ctx, kv_types, n_slots);
}

int SlotStateCache::n_past(int slot) const {
    state_.check_slot(slot);
    return state_.n_past[size_t(slot)];
}

void SlotStateCache::reset(int slot) { state_.reset(slot); }

// The operations below work on host memory, or hand a device backend's state
// (ModelState::device) to that backend's own copies.
void SlotStateCache::copy(int from, int to) {
    state_.check_slot(from);
    state_.check_slot(to);
    copy_slot(state_, from, to);
}

void copy_slot(ModelState& s, int from, int to) {
    if (from == to) return;
    const size_t n = size_t(s.n_past[size_t(from)]);
    if (s.device) {
        s.device->copy(from, to, int(n));
        s.n_past[size_t(to)] = int(n);
        return;
    }
    for (size_t l = 0; l < s.k_cache.size(); ++l) {
        for (auto* cache : {&s.k_cache[l], &s.v_cache[l]}) {
            if (cache->empty()) continue;
            const ZeroPages& src = (*cache)[size_t(from)];
            // Only the rows in use: the rest of the destination stays untouched (and unbacked).
            const size_t row = src.bytes() / size_t(s.n_ctx);
            std::memcpy((*cache)[size_t(to)].data(), src.data(), row * n);
        }
        if (s.conv_state[l].empty()) continue;
        std::memcpy(s.conv(int(l), to), s.conv(int(l), from), s.conv_elems * sizeof(float));
        std::memcpy(s.ssm(int(l), to), s.ssm(int(l), from), s.ssm_elems * sizeof(float));
    }
    s.n_past[size_t(to)] = int(n);
}

StateSnapshot SlotStateCache::snapshot(int i) const {
    state_.check_slot(i);
    return snapshot_slot(state_, i);
}

StateSnapshot snapshot_slot(const ModelState& s, int i) {
    StateSnapshot snap;
    snap.n_past = s.n_past[size_t(i)];
    if (s.device) {
        snap.device = s.device->snapshot(i);
        return snap;
    }
    snap.conv_state.resize(s.conv_state.size());
    snap.ssm_state.resize(s.ssm_state.size());
    for (size_t l = 0; l < s.conv_state.size(); ++l) {
        if (s.conv_state[l].empty()) continue;
        snap.conv_state[l].assign(s.conv(int(l), i), s.conv(int(l), i) + s.conv_elems);
        snap.ssm_state[l].assign(s.ssm(int(l), i), s.ssm(int(l), i) + s.ssm_elems);
    }
    return snap;
}

void SlotStateCache::check_shapes(int i, const StateSnapshot& snap, const char* op) const {
    state_.check_slot(i);
    const ModelState& s = state_;
    if (bool(snap.device) != bool(s.device))
        throw Error(std::string("slot state cache: ") + op + " of slot " + std::to_string(i) + ": a " +
                    (snap.device ? "device" : "host") + " snapshot for a " + (s.device ? "device" : "host") + " state");
    // (A device snapshot's shapes are its backend's to check: DeviceState::restore.)
    bool same = true;
    if (!s.device) same = snap.conv_state.size() == s.conv_state.size() && snap.ssm_state.size() == s.ssm_state.size();
    for (size_t l = 0; same && !s.device && l < s.conv_state.size(); ++l) {
        const bool gdn = !s.conv_state[l].empty();
        same = snap.conv_state[l].size() == (gdn ? s.conv_elems : 0) && snap.ssm_state[l].size() == (gdn ? s.ssm_elems : 0);
    }
    if (!same) throw Error(std::string("slot state cache: ") + op + " of slot " + std::to_string(i) + ": the snapshot is of another model");
    if (snap.n_past < 0 || snap.n_past > s.n_ctx) {
        throw Error(std::string("slot state cache: ") + op + " of slot " + std::to_string(i) + ": snapshot at " +
                    std::to_string(snap.n_past) + " tokens does not fit the context of " + std::to_string(s.n_ctx));
    }
}

void SlotStateCache::restore(int i, const StateSnapshot& snap) {
    check_shapes(i, snap, "restore");
    restore_slot(state_, i, snap);
}

void restore_slot(ModelState& s, int i, const StateSnapshot& snap) {
    if (s.device) {
        s.device->restore(i, *snap.device);
        s.n_past[size_t(i)] = snap.n_past;
        return;
    }
    for (size_t l = 0; l < s.conv_state.size(); ++l) {
        if (s.conv_state[l].empty()) continue;
        std::copy(snap.conv_state[l].begin(), snap.conv_state[l].end(), s.conv(int(l), i));
        std::copy(snap.ssm_state[l].begin(), snap.ssm_state[l].end(), s.ssm(int(l), i));
    }
    s.n_past[size_t(i)] = snap.n_past;
}

void SlotStateCache::truncate(int i, int n, const StateSnapshot& at_n) {
    const int held = n_past(i);
    if (n < 0 || n > held) {
        throw Error("slot state cache: truncate of slot " + std::to_string(i) + " to " + std::to_string(n) +
                    " tokens: it holds " + std::to_string(held));
    }
    if (at_n.n_past != n) {
        throw Error("slot state cache: truncate of slot " + std::to_string(i) + " to " + std::to_string(n) +
                    " tokens needs the GDN states at " + std::to_string(n) + "; the snapshot is at " +
                    std::to_string(at_n.n_past));
    }
    restore(i, at_n);
}

}  // namespace alloy
