// Speculative decoding through the engine (issue 21, must-show 1 for the n-gram drafter): with
// EngineOptions::spec = "ngram" a greedy request's tokens and the logits behind them (the
// logprobs the API reports: each row's log-softmax at the token and its 20 best alternatives)
// are bit for bit those of the same engine without speculation, alone or with 4 requests in
// flight, for 1 and 3 drafts a step. Repetitive prompts get drafts accepted, random ones get
// them rejected (both asserted, so a drafter that never drafts fails). Stop strings,
// max_tokens and the prefix cache's end-of-generation checkpoint stay right when a request
// ends inside a run of accepted drafts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "model/synth.h"
#include "tests/runtime/engine_fixture.h"

namespace alloy {
namespace {

class SpeculativeEngine : public test::EngineTest {
protected:
    static EngineOptions spec_options(int n_parallel, int k) {
        EngineOptions o = options(n_parallel);
        o.spec = "ngram";
        o.spec_k = k;
        return o;
    }
};

TEST_F(SpeculativeEngine, GreedyOutputIsPlainDecodeBitForBit) {
    const auto ps = prompts();
    // Logprobs on every other request: those rows come back whole; a step without any takes
    // the tokens-only path (argmax per row), which the verification reads the same way.
    std::vector<GenerationRequest> reqs, no_logprobs;
    for (size_t i = 0; i < ps.size(); ++i) {
        GenerationRequest r = greedy(ps[i], 20 + int(i % 5));
        no_logprobs.push_back(r);
        if (i % 2 == 0) r.logprobs = kMaxTopLogprobs;
        reqs.push_back(r);
    }
    std::vector<GenerationResult> plain;
    {
        Engine e(options(1));
        plain = run_all(e, reqs);
    }
    for (int k : {1, 3})
        for (int n_parallel : {1, 4})
            for (bool with_logprobs : {true, false}) {
                if (!with_logprobs && !(k == 3 && n_parallel == 4)) continue;
                SCOPED_TRACE("K " + std::to_string(k) + ", " + std::to_string(n_parallel) + " in flight" +
                             (with_logprobs ? "" : ", no logprobs"));
                Engine e(spec_options(n_parallel, k));
                const auto got = run_all(e, with_logprobs ? reqs : no_logprobs);
                int drafted[2] = {0, 0}, accepted[2] = {0, 0};  // [repetitive, random]
                for (size_t i = 0; i < ps.size(); ++i) {
                    SCOPED_TRACE("prompt " + std::to_string(i) + " (" + std::to_string(ps[i].size()) + " tokens)");
                    if (with_logprobs) {
                        expect_same(plain[i], got[i]);
                    } else {
                        EXPECT_EQ(got[i].ids, plain[i].ids);
                        EXPECT_TRUE(got[i].logprobs.empty());
                    }
                    EXPECT_LE(got[i].n_accepted, got[i].n_drafted);
                    drafted[i % 2] += got[i].n_drafted;
                    accepted[i % 2] += got[i].n_accepted;
                }
                EXPECT_GT(accepted[0], 0) << "no draft was accepted on the repetitive prompts";
                EXPECT_GT(drafted[1], accepted[1]) << "no draft was rejected on the random prompts";
                const EngineStats st = e.stats();
                EXPECT_EQ(st.drafted_tokens, uint64_t(drafted[0] + drafted[1]));
                EXPECT_EQ(st.accepted_tokens, uint64_t(accepted[0] + accepted[1]));
                if (n_parallel == 4) EXPECT_GT(st.max_batch_sequences, 1);
            }
}

// --spec mtp: the trained default model's MTP head drafts (runtime/mtp_drafter.h), fed by the
// engine with the trunk's rows of every kept position, also of prompts in two pieces (batch
// size 256). Greedy output and logprobs are plain decode's bit for bit, for 1 and 3 drafts and
// 1 and 3 requests in flight, and the first draft of a step is accepted about as often as
// the head's teacher-forced agreement (0.54) says.
TEST_F(SpeculativeEngine, MtpDraftsOfTheDefaultModelAreExactAndAccepted) {
    expect_mtp_exact_and_accepted("cpu");
    EngineOptions o;
    o.model_path = default_model_file();
    o.spec = "mtp";
    EXPECT_THROW(Engine(o).evaluate_mtp({}), Error);
}

// --spec draft (runtime/draft_model_drafter.h): the target as its own draft model (drafts
// almost always agree: the draft's prompt runs as one call, the target's decode one token a
// step, so a near tie can still go the other way) and a random model of the same vocabulary
// (drafts mostly rejected, rollbacks of both models' states every step): 20 prompts, K 1 and 3,
// 1 and 4 requests in flight, every token and logprob bit for bit plain decode's.
TEST_F(SpeculativeEngine, DraftModelDraftsAreExact) { expect_draft_model_exact("cpu"); }

// Sampled requests speculate too (accept_sampled, whose distribution test is in
// test_batch.cpp). With top_k = 1 the sampler's distribution is a point mass, so the sampled
// path (its rule, its rollbacks) must give plain greedy decode's tokens and logprobs bit for
// bit; with real sampling (temperature 0.5, top-k 3) drafts are kept and rejected, and a
// fixed seed gives the same output run to run (one request in flight: with several, how many
// drafts a step carries depends on the others, and so does the generator's use).
TEST_F(SpeculativeEngine, SampledRequestsSpeculateExactly) {
    const auto ps = prompts();
    std::vector<GenerationRequest> greedy_reqs, point_mass, sampled;
    for (size_t i = 0; i < ps.size(); i += 2) {
        GenerationRequest r = greedy(ps[i], 24);
        r.logprobs = 4;
        greedy_reqs.push_back(r);
        r.sampling.temperature = 0.7f;
        r.sampling.top_k = 1;
        r.sampling.seed = 11 + i;
        point_mass.push_back(r);
        r.sampling.temperature = 0.5f;  // peaked enough that the output repeats and gets drafted
        r.sampling.top_k = 3;
        r.sampling.min_p = 0;
        sampled.push_back(r);
    }
    std::vector<GenerationResult> plain;
    {
        Engine e(options(1));
        plain = run_all(e, greedy_reqs);
    }
    for (int n_parallel : {1, 4}) {
        SCOPED_TRACE(std::to_string(n_parallel) + " in flight");
        Engine e(spec_options(n_parallel, 3));
        const auto got = run_all(e, point_mass);
        int drafted = 0, accepted = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            expect_same(plain[i], got[i]);
            drafted += got[i].n_drafted;
            accepted += got[i].n_accepted;
        }
        EXPECT_GT(accepted, 0);
        EXPECT_GT(drafted, accepted);
    }
    std::vector<GenerationResult> first;
    for (int run = 0; run < 2; ++run) {  // one in flight: a request's steps (and draws) are its own
        Engine e(spec_options(1, 3));
        const auto got = run_all(e, sampled);
        int drafted = 0, accepted = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            ASSERT_EQ(got[i].ids.size(), 24u) << got[i].error;
            drafted += got[i].n_drafted;
            accepted += got[i].n_accepted;
            if (run == 1) EXPECT_EQ(got[i].ids, first[i].ids) << "prompt " << i << ": the same seed, another output";
        }
        EXPECT_GT(accepted, 0);
        EXPECT_GT(drafted, accepted);
        if (run == 0) first = got;
    }
}

// A request that ends inside a run of accepted drafts (a stop string completed by one of
// them, or max_tokens) emits exactly plain decode's tokens and text, streamed through the
// callbacks; the next chat turn then resumes from the end-of-generation checkpoint with the
// plain engine's tokens and logits, so that checkpoint held exactly the emitted tokens but the
// last. The prompts end where the random-weight model has fallen into repeating one token
// (found from its own greedy output), so 3 drafts a step are accepted and stops of 1..6 copies
// of the continuation's text land at every position of the runs.
TEST_F(SpeculativeEngine, StopsMaxTokensAndCheckpointsInsideAnAcceptedRun) {
    EngineOptions plain_opt = options(2), spec_opt = spec_options(2, 3);
    plain_opt.cache_ram_mib = spec_opt.cache_ram_mib = 64;
    Engine plain(plain_opt), spec(spec_opt);
    std::vector<std::vector<int32_t>> looping;
    Engine finder(options(1));  // no cache: the two engines' caches see the same requests
    for (uint32_t seed = 0; seed < 40 && looping.size() < 3; ++seed) {
        std::vector<int32_t> p = ids(4 + int(seed % 5), 1200 + seed);
        const std::vector<int32_t> g = finder.generate(greedy(p, 48)).ids;
        if (std::all_of(g.end() - 6, g.end(), [&](int32_t t) { return t == g.back(); })) {
            p.insert(p.end(), g.begin(), g.end() - 4);
            looping.push_back(p);
        }
    }
    ASSERT_FALSE(looping.empty()) << "no prompt made the model repeat a token";
    int stopped_in_run = 0;  // requests that stopped at the first of a verification's two tokens
    for (size_t p = 0; p < looping.size(); ++p) {
        GenerationRequest full = greedy(looping[p], 12);
        full.text = true;
        const GenerationResult head = plain.generate(full);
        EXPECT_EQ(spec.generate(full).ids, head.ids);  // both caches hold the same checkpoints from here on
        // Stops first: a variant whose answer is one an earlier variant gave finds its answer
        // checkpoint already held (not taken again), so the stops' own checkpoints are the tested ones.
        std::vector<GenerationRequest> variants;
        std::string stop;
        for (size_t j = 0; j < 6; ++j) {  // the text of the first 1..6 tokens: a stop at each of them
            stop += spec.token_bytes(head.ids[j]);
            GenerationRequest r = full;
            r.stop = {stop};
            variants.push_back(r);
        }
        for (int n = 1; n <= 12; ++n) {  // every max_tokens cut
            GenerationRequest r = full;
            r.max_tokens = n;
            variants.push_back(r);
        }
        for (size_t v = 0; v < variants.size(); ++v) {
            SCOPED_TRACE("prompt " + std::to_string(p) + " variant " + std::to_string(v));
            GenerationRequest r = variants[v];
            r.logprobs = 3;
            const GenerationResult want = plain.generate(r);
            std::string streamed;
            std::vector<int32_t> tokens;
            const GenerationResult got = spec.generate(
                r, [&](const std::string& t) { return streamed += t, true; }, [&](int32_t id) { tokens.push_back(id); });
            {
                SCOPED_TRACE("the request");
                EXPECT_EQ(got.n_cached, want.n_cached);
                expect_same(want, got);
            }
            EXPECT_EQ(streamed, got.text);
            EXPECT_EQ(tokens, got.ids);
            // The continuation repeats one token, drafted one at a time and accepted, so every
            // verification feeds 2 tokens: a stop string completed by its first one ends the
            // request with a draft fed past the answer (the end-of-generation checkpoint must
            // roll it back: the next turn below fails without that rollback).
            stopped_in_run += got.finish_reason == "stop" && got.n_accepted > 0 && got.n_accepted == got.n_drafted &&
                              got.ids.size() % 2 == 0;
            // The next turn: this prompt, the answer and a new message.
            GenerationRequest next = greedy(r.prompt, 8);
            next.prompt.insert(next.prompt.end(), got.ids.begin(), got.ids.end());
            const std::vector<int32_t> msg = ids(9, 1000 + uint32_t(v));
            next.prompt.insert(next.prompt.end(), msg.begin(), msg.end());
            next.logprobs = kMaxTopLogprobs;
            const GenerationResult want_next = plain.generate(next), got_next = spec.generate(next);
            EXPECT_EQ(got_next.n_cached, want_next.n_cached);
            EXPECT_GE(got_next.n_cached, int(r.prompt.size() + got.ids.size()) - 1);  // a longer answer's may match too
            SCOPED_TRACE("the next turn");
            expect_same(want_next, got_next);
        }
    }
    EXPECT_GT(stopped_in_run, 0) << "no request stopped inside an accepted run";
}

TEST_F(SpeculativeEngine, BadOptionsNameTheField) {
    auto expect_error = [](EngineOptions o, const std::string& needle) {
        try {
            Engine e(o);
            ADD_FAILURE() << "no error for " << needle;
        } catch (const Error& err) {
            EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
        }
    };
    EngineOptions o = options(1);
    o.spec = "medusa";
    expect_error(o, "spec must be 'off', 'ngram', 'mtp' or 'draft', got 'medusa'");
    o.spec = "mtp";  // the synthetic model has no MTP block
    expect_error(o, "needs a model with an MTP block");
    o = spec_options(1, 0);
    expect_error(o, "spec_k must be in [1, 3]");
    o = spec_options(1, 4);
    expect_error(o, "spec_k must be in [1, 3]");
}

}  // namespace
}  // namespace alloy
