// The hybrid prefix cache (issue 19): checkpoints of sequences' states by their exact token ids,
// so that a request whose prompt starts with earlier work (the previous turns of a chat, a
// shared system prompt) resumes from the longest cached point instead of recomputing it.
// A checkpoint at n tokens holds what a hybrid model needs to continue from there: the K/V
// rows [0, n) of every attention layer and the GDN conv and recurrent states after token n - 1
// (the recurrent state cannot be cut back, so only points where one was taken can be resumed).
// Bounded by a byte budget; least recently used checkpoints go first.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/slot_cache.h"

namespace alloy {

struct Checkpoint {
    std::vector<int32_t> tokens;             // the prefix it is the state of (n = tokens.size())
    StateSnapshot gdn;                       // GDN states at n
    std::vector<std::vector<uint8_t>> k, v;  // per layer: K / V rows [0, n) (empty: GDN layer)
    size_t bytes() const;
};

class PrefixCache {
public:
    explicit PrefixCache(size_t budget_bytes) : budget_(budget_bytes) {}
    size_t budget() const { return budget_; }
    size_t bytes() const { return bytes_; }
    size_t size() const { return by_key_.size(); }
    // The longest checkpoint whose tokens are a proper prefix of `prompt` (at least one prompt
    // token is left to run, whose logits give the next token); nullptr if none. Marks it used.
    const Checkpoint* find(const std::vector<int32_t>& prompt);
    // Whether a checkpoint of exactly these tokens is held (then inserting it again is waste).
    bool contains(const int32_t* tokens, size_t n) const;
    // Keeps a checkpoint (replacing one of the same tokens), then evicts the least recently
    // used until the budget holds; one larger than the whole budget is not kept.
    void insert(std::unique_ptr<Checkpoint> c);

private:
    struct Entry {
        std::unique_ptr<Checkpoint> c;
        uint64_t used = 0;
    };
    using Key = std::pair<size_t, uint64_t>;  // (length, hash of the tokens)
    struct KeyHash {
        size_t operator()(const Key& k) const { return size_t(k.second ^ (k.first * 0x9e3779b97f4a7c15ull)); }
    };
    size_t budget_, bytes_ = 0;
    uint64_t clock_ = 0;
    std::unordered_map<Key, Entry, KeyHash> by_key_;
    std::map<size_t, int> lengths_;  // checkpoint lengths held -> how many
    void erase(std::unordered_map<Key, Entry, KeyHash>::iterator it);
};

// The checkpoint of a slot as it is now (its n_past tokens, which the caller gives: the slot
// does not keep its ids). Throws for a device backend's state (slot_cache.h's operations).
std::unique_ptr<Checkpoint> take_checkpoint(const SlotStateCache& cache, int slot, const int32_t* tokens);
// The slot as the checkpoint's sequence left it: K/V rows [0, n), GDN states, n_past = n.
void resume_from(SlotStateCache& cache, int slot, const Checkpoint& c);

// FNV-1a over token ids, extended one token at a time (the cache's keys).
inline uint64_t token_hash(uint64_t h, int32_t t) {
    for (int i = 0; i < 4; ++i) h = (h ^ ((uint32_t(t) >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    return h;
}
constexpr uint64_t kTokenHashSeed = 0xcbf29ce484222325ull;

}  // namespace alloy
