// Where each tensor of a step's graph lives in a backend's scratch region (the CPU's arena, a
// GPU's device buffer): one layout for every backend.
#pragma once
#include <cstdint>
#include <vector>

#include "model/graph.h"
#include "runtime/plan.h"

namespace alloy {

// Offsets in one scratch region for every tensor the graph writes: a tensor stored in place
// over an input shares that input's storage; storages whose lifetimes (first write .. last
// read, in node order) overlap get disjoint ranges, placed largest first at the lowest fit.
struct GraphLayout {
    std::vector<int64_t> offset;  // [tensor] in floats (-1: not stored: never written, or the logits)
    int64_t total = 0;
};

// The rows a node over `r` rows works on in a step: [first_row, first_row + n_rows).
inline int64_t first_row(graph::Rows r, const StepContext& c) { return r == graph::Rows::Last ? c.n - 1 : 0; }
inline int64_t n_rows(graph::Rows r, const StepContext& c) {
    return r == graph::Rows::All ? c.n : r == graph::Rows::Last ? 1 : r == graph::Rows::Listed ? c.n_out : 0;
}

// Where a tensor's rows are in a backend's memory: token-indexed (row t at base + t cols, also
// when it holds only the last row) or compact (Listed rows, and the logits: row i at base +
// i cols); the logits tensor of the CPU backend lives in the caller's array (StepContext::logits).
struct TensorRef {
    float* base = nullptr;
    int64_t cols = 0;
    bool compact = false, logits = false;
    // The first row a node over `r` rows reads or writes.
    float* at(const StepContext& c, graph::Rows r) const {
        float* b = logits ? c.logits : base;
        return compact ? b : b + first_row(r, c) * cols;
    }
};

// Sequence s of a step: its slot, its rows [first, first + n) of the step, and the tokens its
// slot held before the step (the position of its first row). The state ops (K/V store,
// attention, GDN) of every backend walk a step this way.
struct StepSeq {
    int slot;
    int64_t first, n, n_past;
};
inline StepSeq step_seq(const StepContext& c, int s) {
    return {c.slots[s], c.offsets[s], int64_t(c.offsets[s + 1] - c.offsets[s]), c.n_past[s]};
}
// Runs [s0, s1) of consecutive sequences that take the same GDN kernel (a mixed step: the
// decoding ones serial, the prefilling ones the plan's mode): fn(s0, s1, serial).
template <class F>
void for_each_gdn_run(const StepContext& c, F&& fn) {
    for (int s0 = 0; s0 < c.n_seqs;) {
        int s1 = s0 + 1;
        while (s1 < c.n_seqs && c.serial[s1] == c.serial[s0]) ++s1;
        fn(s0, s1, c.serial[s0] != 0);
        s0 = s1;
    }
}

// Sized for steps of up to `bucket` tokens (each tensor bucket x cols floats, rounded up to 64
// bytes). Throws alloy::Error naming a node that stores in place over a tensor of another width.
GraphLayout plan_storage(const graph::Graph& g, int bucket);

}  // namespace alloy
