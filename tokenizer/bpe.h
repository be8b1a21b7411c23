// BPE merge engine: given a word as a sequence of token ids (initially one per byte),
// repeatedly merges the adjacent pair with the lowest merge rank, leftmost first on ties.
// This is the exact order HF tokenizers' BPE uses (its priority queue orders by
// (rank, position)), so results agree even for words like "aaaa" where merges overlap.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace alloy {

class BpeMerges {
public:
    // Registers merge (left, right) -> merged with the given rank; an already registered
    // pair keeps its lower rank.
    void add(int32_t left, int32_t right, int32_t merged, int32_t rank);
    size_t size() const { return map_.size(); }

    // In place: `word` holds ids on entry and the merged ids on return.
    void apply(std::vector<int32_t>& word) const;

private:
    struct Merge { int32_t rank, merged; };
    static uint64_t key(int32_t l, int32_t r) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
    }
    const Merge* find(int32_t l, int32_t r) const {
        auto it = map_.find(key(l, r));
        return it == map_.end() ? nullptr : &it->second;
    }
    std::unordered_map<uint64_t, Merge> map_;
};

}  // namespace alloy
