#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

namespace alloy {

void BpeMerges::add(int32_t left, int32_t right, int32_t merged, int32_t rank) {
    map_.try_emplace(key(left, right), Merge{rank, merged});
}

void BpeMerges::apply(std::vector<int32_t>& word) const {
    const int n = static_cast<int>(word.size());
    if (n < 2) return;

    if (n <= 16) {
        // Short words (nearly all of them): a plain scan for the best pair is faster than a heap.
        while (word.size() > 1) {
            int best = -1;
            const Merge* bm = nullptr;
            for (size_t i = 0; i + 1 < word.size(); ++i) {
                const Merge* m = find(word[i], word[i + 1]);
                if (m && (!bm || m->rank < bm->rank)) { bm = m; best = static_cast<int>(i); }
            }
            if (!bm) break;
            word[best] = bm->merged;
            word.erase(word.begin() + best + 1);
        }
        return;
    }

    // Long words: doubly linked list of symbols + min-heap of candidate pairs keyed by
    // (rank, position of the left symbol). Entries go stale when a neighbour merges; they
    // are recognised on pop because the ids at that position no longer form the pair.
    std::vector<int32_t> id(word), prev(n), next(n);
    for (int i = 0; i < n; ++i) { prev[i] = i - 1; next[i] = i + 1 < n ? i + 1 : -1; }
    struct Cand { int32_t rank, pos, left, right; };
    auto later = [](const Cand& a, const Cand& b) {
        return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    };
    std::priority_queue<Cand, std::vector<Cand>, decltype(later)> heap(later);
    auto push = [&](int pos) {
        if (pos < 0 || next[pos] < 0) return;
        if (const Merge* m = find(id[pos], id[next[pos]])) heap.push({m->rank, pos, id[pos], id[next[pos]]});
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    std::vector<bool> dead(n, false);
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        const int r = next[c.pos];
        if (dead[c.pos] || r < 0 || id[c.pos] != c.left || id[r] != c.right) continue;
        id[c.pos] = find(c.left, c.right)->merged;
        dead[r] = true;
        next[c.pos] = next[r];
        if (next[r] >= 0) prev[next[r]] = c.pos;
        push(prev[c.pos]);
        push(c.pos);
    }
    word.clear();
    for (int i = 0; i >= 0; i = next[i]) word.push_back(id[i]);
}

}  // namespace alloy
