// The prefix cache's lookup and budget (runtime/prefix_cache.h), without a model: the longest
// checkpoint that is a proper prefix, exact token comparison, least-recently-used eviction.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "runtime/prefix_cache.h"

namespace alloy {
namespace {

std::unique_ptr<Checkpoint> ckpt(std::vector<int32_t> tokens, size_t payload = 1000) {
    auto c = std::make_unique<Checkpoint>();
    c->tokens = std::move(tokens);
    c->gdn.n_past = int(c->tokens.size());
    c->k.push_back(std::vector<uint8_t>(payload, 7));
    return c;
}

TEST(PrefixCache, FindsTheLongestProperPrefix) {
    PrefixCache pc(1 << 20);
    pc.insert(ckpt({1, 2, 3}));
    pc.insert(ckpt({1, 2, 3, 4, 5}));
    pc.insert(ckpt({1, 2, 9, 9, 9, 9}));
    EXPECT_EQ(pc.size(), 3u);
    const Checkpoint* c = pc.find({1, 2, 3, 4, 5, 6, 7});
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->tokens.size(), 5u);
    // The whole prompt cached: the longest shorter one (a token must be left to run).
    c = pc.find({1, 2, 3, 4, 5});
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->tokens.size(), 3u);
    EXPECT_EQ(pc.find({1, 2, 4, 4, 5, 6}), nullptr);  // same length and start, other tokens
    EXPECT_EQ(pc.find({7}), nullptr);
    EXPECT_TRUE(pc.contains(std::vector<int32_t>{1, 2, 9, 9, 9, 9}.data(), 6));
    EXPECT_FALSE(pc.contains(std::vector<int32_t>{1, 2, 9, 9, 9, 8}.data(), 6));
}

TEST(PrefixCache, EvictsTheLeastRecentlyUsedWithinItsBudget) {
    const size_t one = ckpt({1, 2})->bytes();
    PrefixCache pc(3 * one + one / 2);  // room for three
    pc.insert(ckpt({1, 2}));
    pc.insert(ckpt({3, 4}));
    pc.insert(ckpt({5, 6}));
    ASSERT_NE(pc.find({1, 2, 0}), nullptr);  // {1, 2} is now the most recent
    pc.insert(ckpt({7, 8}));                 // evicts {3, 4}
    EXPECT_EQ(pc.size(), 3u);
    EXPECT_LE(pc.bytes(), pc.budget());
    EXPECT_EQ(pc.find({3, 4, 0}), nullptr);
    EXPECT_NE(pc.find({1, 2, 0}), nullptr);
    EXPECT_NE(pc.find({5, 6, 0}), nullptr);
    pc.insert(ckpt({1, 2}, 10 * one));  // larger than the whole budget: not kept, nothing evicted
    EXPECT_EQ(pc.size(), 3u);
    pc.insert(ckpt({5, 6}));  // the same tokens again: replaces, no growth
    EXPECT_EQ(pc.size(), 3u);
}

}  // namespace
}  // namespace alloy
