#include "runtime/prefix_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "alloy/error.h"

namespace alloy {

size_t Checkpoint::bytes() const {
    size_t b = tokens.size() * sizeof(int32_t) + gdn.bytes();
    for (const auto* kv : {&k, &v})
        for (const auto& r : *kv) b += r.size();
    return b;
}

bool PrefixCache::contains(const int32_t* tokens, size_t n) const {
    uint64_t h = kTokenHashSeed;
    for (size_t i = 0; i < n; ++i) h = token_hash(h, tokens[i]);
    auto it = by_key_.find({n, h});
    return it != by_key_.end() && std::equal(tokens, tokens + n, it->second.c->tokens.begin());
}

const Checkpoint* PrefixCache::find(const std::vector<int32_t>& prompt) {
    // The prompt's hash at every held length, from the longest down; the tokens are compared
    // exactly before a hit counts (a hash collision is a miss, never a wrong state).
    std::vector<std::pair<size_t, uint64_t>> at;
    uint64_t h = kTokenHashSeed;
    size_t i = 0;
    for (const auto& [n, count] : lengths_) {
        if (n >= prompt.size()) break;
        for (; i < n; ++i) h = token_hash(h, prompt[i]);
        at.emplace_back(n, h);
    }
    for (auto it = at.rbegin(); it != at.rend(); ++it) {
        auto e = by_key_.find(*it);
        if (e == by_key_.end()) continue;
        const std::vector<int32_t>& t = e->second.c->tokens;
        if (!std::equal(t.begin(), t.end(), prompt.begin())) continue;
        e->second.used = ++clock_;
        return e->second.c.get();
    }
    return nullptr;
}

void PrefixCache::erase(std::unordered_map<Key, Entry, KeyHash>::iterator it) {
    bytes_ -= it->second.c->bytes();
    auto l = lengths_.find(it->first.first);
    if (--l->second == 0) lengths_.erase(l);
    by_key_.erase(it);
}

void PrefixCache::insert(std::unique_ptr<Checkpoint> c) {
    const size_t b = c->bytes();
    if (b > budget_) return;
    uint64_t h = kTokenHashSeed;
    for (int32_t t : c->tokens) h = token_hash(h, t);
    const Key key{c->tokens.size(), h};
    if (auto old = by_key_.find(key); old != by_key_.end()) erase(old);
    while (bytes_ + b > budget_ && !by_key_.empty()) {
        auto lru = std::min_element(by_key_.begin(), by_key_.end(),
                                    [](const auto& a, const auto& b) { return a.second.used < b.second.used; });
        erase(lru);
    }
    bytes_ += b;
    ++lengths_[key.first];
    by_key_.emplace(key, Entry{std::move(c), ++clock_});
}

std::unique_ptr<Checkpoint> take_checkpoint(const SlotStateCache& cache, int slot, const int32_t* tokens) {
    auto c = std::make_unique<Checkpoint>();
    c->gdn = cache.snapshot(slot);  // checks the slot; refuses a device state
    const ModelState& s = cache.state();
    const size_t n = size_t(c->gdn.n_past);
    c->tokens.assign(tokens, tokens + n);
    c->k.resize(s.k_cache.size());
    c->v.resize(s.v_cache.size());
    for (size_t l = 0; l < s.k_cache.size(); ++l) {
        if (s.k_cache[l].empty()) continue;
        for (auto [src, dst] : {std::pair{&s.k_cache[l], &c->k[l]}, std::pair{&s.v_cache[l], &c->v[l]}}) {
            const ZeroPages& z = (*src)[size_t(slot)];
            const size_t row = z.bytes() / size_t(s.n_ctx);
            const auto* p = static_cast<const uint8_t*>(z.data());
            dst->assign(p, p + row * n);
        }
    }
    return c;
}

void resume_from(SlotStateCache& cache, int slot, const Checkpoint& c) {
    ModelState& s = cache.state();
    const size_t n = c.tokens.size();
    if (size_t(c.gdn.n_past) != n || c.k.size() != s.k_cache.size() || c.v.size() != s.v_cache.size())
        throw Error("prefix cache: checkpoint of slot " + std::to_string(slot) + " is of another model or inconsistent");
    for (size_t l = 0; l < s.k_cache.size(); ++l) {
        if (s.k_cache[l].empty()) continue;
        for (auto [dst, src] : {std::pair{&s.k_cache[l], &c.k[l]}, std::pair{&s.v_cache[l], &c.v[l]}}) {
            ZeroPages& z = (*dst)[size_t(slot)];
            if (src->size() != z.bytes() / size_t(s.n_ctx) * n)
                throw Error("prefix cache: checkpoint's KV rows do not fit slot " + std::to_string(slot));
            std::memcpy(z.data(), src->data(), src->size());
        }
    }
    cache.restore(slot, c.gdn);  // GDN states and n_past
}

}  // namespace alloy
