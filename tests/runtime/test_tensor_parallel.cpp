// Tensor parallelism on CPU ranks (issue 22; runtime/tensor_parallel_backend.h): the sharded
// graphs (model/qwen35_shard.cpp) summed by the host collective give the whole model's logits
// within fp32 reordering and its greedy tokens; one rank is the plain model bit for bit; a batch
// equals its sequences run alone, bit for bit; the slot cache's operations work on the ranks'
// states; what does not split is refused by name. The same code on GPUs: tests/cuda/
// test_tensor_parallel_cuda.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/gguf.h"
#include "model/qwen35.h"
#include "runtime/model_runner.h"
#include "runtime/slot_cache.h"
#include "runtime/tensor_parallel_backend.h"
#include "tests/logits_error.h"
#include "tests/runtime/engine_fixture.h"
#include "tests/runtime/tensor_parallel_fixture.h"

namespace alloy {
namespace {
using test::Greedy;
using test::ids;
using test::model;
using test::run;

class TensorParallel : public ::testing::TestWithParam<std::pair<std::string, GgmlType>> {};

TEST_P(TensorParallel, TwoCpuRanksGiveTheWholeModelsLogitsAndTokens) {
    const Qwen35Model& m = model(GetParam().first, GetParam().second);
    const ModelRunner one(m);
    const ModelRunner two(m, make_tensor_parallel_backend(m, "cpu", 2));
    for (int n : {1, 37, 130}) {
        const auto prompt = ids(n, uint32_t(n));
        const Greedy a = run(one, prompt, 12), b = run(two, prompt, 12, &a.tokens);  // b fed a's tokens
        const size_t V = size_t(m.hparams().n_vocab);
        // Each block's output is a sum of two partial products instead of one: fp32 reordering
        // (~1e-6). With Q8_0 weights the next matmul quantizes that sum to int8 per 32 values,
        // where a last-bit change sometimes moves one value a quantization step: ~5e-3 on these
        // random models, which amplify it (a trained model much less); the tokens still agree.
        const double tol = GetParam().second == GgmlType::F32 ? 1e-4 : 2e-2;
        EXPECT_LT(test::max_row_rel_error(b.prompt_logits, a.prompt_logits, V), tol) << "prompt of " << n;
        EXPECT_LT(test::max_row_rel_error(b.decode_logits, a.decode_logits, V), tol) << "decode after " << n;
    }
}

TEST_P(TensorParallel, OneRankIsThePlainModelBitForBit) {
    const Qwen35Model& m = model(GetParam().first, GetParam().second);
    const ModelRunner plain(m);
    const ModelRunner one(m, make_tensor_parallel_backend(m, "cpu", 1));  // AllReduce nodes over one rank
    const auto prompt = ids(70, 7);
    const Greedy a = run(plain, prompt, 8), b = run(one, prompt, 8);
    EXPECT_EQ(a.prompt_logits, b.prompt_logits);
    EXPECT_EQ(a.decode_logits, b.decode_logits);
}

// Sequences of different lengths in one step on two ranks: each sequence's logits those of
// running it alone on two ranks (the host collective sums element by element in rank order,
// whatever the rows; the rest is the one-rank kernels' batch behaviour: a sequence run alone
// has its last layer pruned to one query, which takes the decode attention kernel).
TEST_P(TensorParallel, BatchEqualsSingleRunsOnTwoRanks) {
    const Qwen35Model& m = model(GetParam().first, GetParam().second);
    const ModelRunner two(m, make_tensor_parallel_backend(m, "cpu", 2));
    const size_t V = size_t(m.hparams().n_vocab);
    const std::vector<int> lens = {5, 1, 9};
    ForwardOptions serial;
    serial.gdn_mode = ref::GdnMode::Serial;
    std::vector<std::vector<int32_t>> ps;
    for (size_t i = 0; i < lens.size(); ++i) ps.push_back(ids(lens[i], uint32_t(100 + i)));
    std::vector<float> alone;
    for (size_t i = 0; i < lens.size(); ++i) {
        ModelState st = two.new_state(64);
        std::vector<float> out(V);
        two.forward(st, ps[i].data(), int(ps[i].size()), serial, out.data());
        alone.insert(alone.end(), out.begin(), out.end());
    }
    ModelState st = two.new_state(64, {}, int(lens.size()));
    Batch b;
    for (size_t i = 0; i < lens.size(); ++i) b.add(int(i), ps[i].data(), lens[i], BatchLogits::Last, true);
    std::vector<float> out(lens.size() * V);
    two.forward(st, b, serial, out.data());
    EXPECT_LT(test::max_row_rel_error(out, alone, V), 1e-5);
}

// Speculative verification on two ranks reproduces decode bit for bit (the fixture's check).
TEST_P(TensorParallel, VerificationReproducesDecodeStepsOnTwoRanks) {
    const Qwen35Model& m = model(GetParam().first, GetParam().second);
    test::expect_verification_reproduces_decode(ModelRunner(m, make_tensor_parallel_backend(m, "cpu", 2)));
}

// A rollback by replay on two ranks (Backend::replay_gdn: each rank's own log of the
// verification) leaves the states of re-running the kept tokens, bit for bit.
TEST_P(TensorParallel, RollbackReplayOnTwoRanksEqualsARerun) {
    const Qwen35Model& m = model(GetParam().first, GetParam().second);
    test::expect_rollback_replay_equals_rerun(ModelRunner(m, make_tensor_parallel_backend(m, "cpu", 2)));
}

// Snapshot -> 20 tokens -> restore -> the same 20 tokens: the same bits; copy a slot, both go on alike.
TEST_P(TensorParallel, SlotCacheOperationsOnTheRanksStates) {
    const Qwen35Model& m = model(GetParam().first, GetParam().second);
    const ModelRunner two(m, make_tensor_parallel_backend(m, "cpu", 2));
    const size_t V = size_t(m.hparams().n_vocab);
    SlotStateCache cache(two, 2, 128);
    ForwardOptions serial;
    serial.gdn_mode = ref::GdnMode::Serial;
    const auto prompt = ids(17, 3), more = ids(20, 4);
    std::vector<float> a(V), b(V), c(V);
    two.forward(cache.state(), prompt.data(), int(prompt.size()), serial, a.data(), nullptr, 0);
    const StateSnapshot snap = cache.snapshot(0);
    cache.copy(0, 1);
    two.forward(cache.state(), more.data(), int(more.size()), serial, a.data(), nullptr, 0);
    cache.restore(0, snap);
    EXPECT_EQ(cache.n_past(0), 17);
    two.forward(cache.state(), more.data(), int(more.size()), serial, b.data(), nullptr, 0);
    two.forward(cache.state(), more.data(), int(more.size()), serial, c.data(), nullptr, 1);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, c);
}

INSTANTIATE_TEST_SUITE_P(Models, TensorParallel,
                         ::testing::Values(std::make_pair(std::string("tiny"), GgmlType::F32),
                                           std::make_pair(std::string("tiny"), GgmlType::Q8_0),
                                           std::make_pair(std::string("moe-tiny"), GgmlType::Q8_0),
                                           // one KV head over two ranks: replicated
                                           std::make_pair(std::string("tiny-mqa"), GgmlType::F32)),
                         [](const auto& info) {
                             std::string n = info.param.first;
                             n.erase(std::remove(n.begin(), n.end(), '-'), n.end());
                             return n + "_" + type_traits(info.param.second).name;
                         });

// Expert parallelism: moe-tiny's 8 routed experts 4 a rank (heads split as above): the whole
// model's logits (the experts' weighted outputs summed across ranks: fp32 reordering, and the
// Q8_0 activation rounding) and its greedy tokens; a verification still reproduces decode.
TEST(ExpertParallel, TwoCpuRanksHoldingHalfTheExpertsGiveTheWholeModelsLogitsAndTokens) {
    const Qwen35Model& m = model("moe-tiny", GgmlType::Q8_0);
    const ModelRunner one(m);
    const ModelRunner two(m, make_tensor_parallel_backend(m, "cpu", 2, /*experts_by_id=*/true));
    const size_t V = size_t(m.hparams().n_vocab);
    for (int n : {1, 37, 130}) {
        const auto prompt = ids(n, uint32_t(n));
        const Greedy a = run(one, prompt, 12), b = run(two, prompt, 12, &a.tokens);  // b fed a's tokens
        EXPECT_LT(test::max_row_rel_error(b.prompt_logits, a.prompt_logits, V), 2e-2) << "prompt of " << n;
        EXPECT_LT(test::max_row_rel_error(b.decode_logits, a.decode_logits, V), 2e-2) << "decode after " << n;
    }
    const auto s = m.shard(1, 2, true);  // the second half of the experts, whole
    EXPECT_EQ(s->hparams().n_ff_exp, m.hparams().n_ff_exp);
    EXPECT_THROW(model("tiny", GgmlType::Q8_0).shard(0, 2, true), Error);  // a dense model has no experts
}

// Through the engine (scheduler, batches of 3 in flight), on the trained default model.
class TensorParallelEngine : public test::EngineTest {};
TEST_F(TensorParallelEngine, TrainedModelGreedyTokensOnTwoCpuRanks) { expect_tensor_parallel_greedy("cpu", 2); }

TEST(TensorParallelShard, RefusesWhatDoesNotSplitByName) {
    const Qwen35Model& m = model("tiny", GgmlType::Q8_0);  // 2 key heads, 4 query heads, 2 KV heads
    try {
        m.shard(0, 4);
        FAIL() << "4 ranks over 2 GDN key heads";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("ssm.group_count"), std::string::npos) << e.what();
    }
    EXPECT_THROW(m.shard(2, 2), Error);
    EXPECT_THROW(make_tensor_parallel_backend(m, "tpu", 2), Error);
    // A shard's shapes: half of every split dimension, the rest whole.
    const auto s = m.shard(1, 2);
    EXPECT_EQ(s->hparams().ssm_H_k, 1);
    EXPECT_EQ(s->hparams().ssm_H_v, 2);
    EXPECT_EQ(s->hparams().n_head, 2);
    EXPECT_EQ(s->hparams().n_head_kv, 1);
    EXPECT_EQ(s->hparams().n_ff, 256);
    EXPECT_EQ(s->hparams().n_embd, m.hparams().n_embd);
    EXPECT_THROW(s->shard(0, 1), Error);
    EXPECT_NE(s->build_graph({}).describe().find("all_reduce"), std::string::npos);
}

}  // namespace
}  // namespace alloy
