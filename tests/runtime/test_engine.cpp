// The engine (include/alloy/engine.h) on a synthetic tiny model: a request alone gives what a
// plain prefill + greedy decode loop gives; requests running together (more than the slots, so
// some wait) each give exactly their alone result; cancel, stop and bad requests behave.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <atomic>
#include <filesystem>
#include <future>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "alloy/engine.h"
#include "alloy/error.h"
#include <nlohmann/json.hpp>
#include "format/gguf.h"
#include "model/qwen35.h"
#include "runtime/model_runner.h"
#include "tests/logits_error.h"
#include "model/synth.h"
#include "tests/runtime/engine_fixture.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;

using test::EngineTest;

// The prefix cache (issue 19). A chat's next turn (prompt = the previous prompt, its answer
// and a new message) resumes after the answer: the state at the end of the generation holds
// the prompt and every answer token but the last (sampled, never fed), exactly as the first
// request's decode steps left it. So the next turn's tokens are those of a plain loop that
// decodes the answer and then prefills the rest (checked bit for bit through greedy ids), not
// of one whole-prompt prefill: that one computes the answer tokens with the chunked kernel and
// the GEMM instead of decode's serial kernel and GEMV, a rounding difference measured below.
TEST_F(EngineTest, PrefixCacheResumesTheNextTurnAfterTheAnswer) {
    EngineOptions cached = options(2), plain = options(2);
    cached.cache_ram_mib = 256;
    cached.checkpoint_every = plain.checkpoint_every = 32;
    Engine e(cached), f(plain);
    const auto p = ids(37, 21);
    const GenerationResult a = e.generate(greedy(p, 10));
    EXPECT_EQ(a.n_cached, 0);
    std::vector<int32_t> next = p;
    next.insert(next.end(), a.ids.begin(), a.ids.end());
    const auto q = ids(15, 22);
    next.insert(next.end(), q.begin(), q.end());
    const GenerationResult b = e.generate(greedy(next, 12));
    EXPECT_EQ(b.n_cached, 37 + 10 - 1);
    // The plain loop of the resumed computation: the prompt in the engine's pieces (cut at
    // multiples of 32), the answer decoded, then the rest from token 46 as one piece.
    const int V = model_->hparams().n_vocab;
    ForwardOptions fo, step;
    step.gdn_mode = ref::GdnMode::Serial;
    ModelState loop = runner_->new_state(256);
    std::vector<float> logits(static_cast<size_t>(V)), whole(static_cast<size_t>(V));
    runner_->forward(loop, p.data(), 32, fo, logits.data());
    runner_->forward(loop, p.data() + 32, 5, fo, logits.data());
    for (int i = 0; i < 9; ++i) runner_->forward(loop, &a.ids[size_t(i)], 1, step, logits.data());
    runner_->forward(loop, next.data() + 46, int(next.size()) - 46, fo, logits.data());
    std::vector<int32_t> want;
    for (int i = 0; i < 12; ++i) {
        want.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
        if (i + 1 < 12) runner_->forward(loop, &want.back(), 1, step, logits.data());
    }
    EXPECT_EQ(b.ids, want);
    // Against one whole-prompt prefill (the engine without the cache cuts it at 32 and 64).
    ModelState sw = runner_->new_state(256);
    runner_->forward(sw, next.data(), int(next.size()), fo, whole.data());
    ModelState sr = runner_->new_state(256);
    runner_->forward(sr, p.data(), 37, fo, logits.data());
    for (int i = 0; i < 9; ++i) runner_->forward(sr, &a.ids[size_t(i)], 1, step, logits.data());
    runner_->forward(sr, next.data() + 46, int(next.size()) - 46, fo, logits.data());
    const double diff = test::max_row_rel_error(logits, whole, size_t(V));
    RecordProperty("resumed_vs_whole_prefill_rel_error", std::to_string(diff));
    std::printf("prefix cache: next-turn logits, resumed after the answer vs one whole prefill: %.2e relative\n", diff);
    EXPECT_LT(diff, 5e-2);
    EXPECT_EQ(f.generate(greedy(next, 12)).n_cached, 0);
    const EngineStats st = e.stats();
    EXPECT_EQ(st.cache_hits, 1u);
    EXPECT_EQ(st.cached_tokens, 46u);
    EXPECT_GE(st.cache_checkpoints, 3);  // at 32, at the end of each prompt and of the first answer
    EXPECT_LE(st.cache_bytes, uint64_t(256) << 20);
}

// A shared system prompt: the second request resumes at the last checkpoint inside it (a
// multiple of checkpoint_every, where every run cuts its pieces), so its tokens are bit for bit
// those of the same engine without the cache; requests in parallel too.
TEST_F(EngineTest, PrefixCacheSharesASystemPromptExactly) {
    EngineOptions cached = options(3), plain = options(3);
    cached.cache_ram_mib = 256;
    cached.checkpoint_every = plain.checkpoint_every = 32;
    Engine e(cached), f(plain);
    const auto sys = ids(70, 31);
    auto with = [&](uint32_t seed, int n) {
        std::vector<int32_t> v = sys;
        const auto u = ids(n, seed);
        v.insert(v.end(), u.begin(), u.end());
        return v;
    };
    const GenerationResult first = e.generate(greedy(with(32, 9), 6));
    EXPECT_EQ(first.n_cached, 0);
    std::vector<std::future<GenerationResult>> later;
    for (uint32_t s = 33; s < 36; ++s)
        later.push_back(std::async(std::launch::async, [&, s] { return e.generate(greedy(with(s, 12), 8)); }));
    for (uint32_t s = 33; s < 36; ++s) {
        const GenerationResult r = later[s - 33].get();
        EXPECT_EQ(r.n_cached, 64) << s;
        EXPECT_EQ(r.ids, f.generate(greedy(with(s, 12), 8)).ids) << s;
    }
    EXPECT_EQ(e.stats().cache_hits, 3u);
}

// A request's own checkpoint points (the server passes the ends of the chat messages): the
// prompt's pieces end there and a later prompt sharing only that much resumes there, bit for bit
// as the same engine without the cache; points out of order or range are refused.
TEST_F(EngineTest, PrefixCacheKeepsTheRequestsOwnCheckpoints) {
    EngineOptions cached = options(1), plain = options(1);
    cached.cache_ram_mib = 64;
    Engine e(cached), f(plain);
    auto a = greedy(ids(37, 51), 4);
    a.checkpoint_at = {20};
    e.generate(a);
    std::vector<int32_t> p(a.prompt.begin(), a.prompt.begin() + 20);
    const auto tail = ids(9, 52);
    p.insert(p.end(), tail.begin(), tail.end());
    auto b = greedy(p, 6);
    b.checkpoint_at = {20};
    const GenerationResult rb = e.generate(b);
    EXPECT_EQ(rb.n_cached, 20);
    EXPECT_EQ(rb.ids, f.generate(b).ids);
    for (std::vector<int> bad : {std::vector<int>{0}, {37}, {10, 10}, {12, 5}}) {
        auto r = greedy(ids(37, 53), 1);
        r.checkpoint_at = bad;
        EXPECT_THROW(e.submit(r), Error);
    }
}

// A budget too small for one checkpoint keeps none and changes nothing.
TEST_F(EngineTest, PrefixCacheWithinATinyBudgetKeepsNothing) {
    EngineOptions o = options(1);
    o.cache_ram_mib = 1;  // a tiny-model checkpoint is larger than 1 MiB? then none is kept
    Engine e(o);
    const auto p = ids(20, 41);
    const GenerationResult a = e.generate(greedy(p, 5));
    const GenerationResult b = e.generate(greedy(p, 5));
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_LE(e.stats().cache_bytes, uint64_t(1) << 20);
    EXPECT_THROW(
        [&] {
            EngineOptions bad = options(1);
            bad.checkpoint_every = 0;
            Engine x(bad);
        }(),
        Error);
}

TEST_F(EngineTest, OneRequestEqualsThePlainLoop) {
    Engine e(options(1));
    const auto prompt = ids(37, 1);
    const GenerationResult r = e.generate(greedy(prompt, 20));
    EXPECT_EQ(r.ids, plain_loop(prompt, 20));
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.n_prompt, 37);
}

// 7 requests on 3 slots (4 wait in the queue and take slots as others finish), of different
// prompt lengths and budgets: each gives exactly its alone result.
TEST_F(EngineTest, RequestsRunningTogetherEachGiveTheirAloneResult) {
    Engine e(options(3));
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int> budgets;
    for (int i = 0; i < 7; ++i) {
        prompts.push_back(ids(5 + 11 * i, 10 + uint32_t(i)));
        budgets.push_back(6 + 3 * i);
    }
    std::vector<std::promise<GenerationResult>> done(7);
    for (int i = 0; i < 7; ++i) {
        GenerationCallbacks cb;
        cb.on_done = [&done, i](const GenerationResult& r) { done[size_t(i)].set_value(r); };
        e.submit(greedy(prompts[size_t(i)], budgets[size_t(i)]), cb);
    }
    for (int i = 0; i < 7; ++i) {
        const GenerationResult r = done[size_t(i)].get_future().get();
        EXPECT_EQ(r.ids, plain_loop(prompts[size_t(i)], budgets[size_t(i)])) << "request " << i;
    }
    const EngineStats st = e.stats();
    EXPECT_GE(st.max_batch_sequences, 2);  // decode steps carried several requests
}

TEST_F(EngineTest, CancelStopsARequestAtTheNextStep) {
    Engine e(options(2));
    std::promise<GenerationResult> done;
    std::atomic<uint64_t> id{0};
    std::atomic<int> seen{0};
    GenerationCallbacks cb;
    cb.on_done = [&](const GenerationResult& r) { done.set_value(r); };
    // The engine may run the first steps before submit returns the id: until it is set, the
    // callback waits for a later token.
    cb.on_token = [&](int32_t) {
        if (++seen >= 3 && id.load() != 0) e.cancel(id.load());
    };
    id = e.submit(greedy(ids(12, 3), 200), cb);
    const GenerationResult r = done.get_future().get();
    EXPECT_EQ(r.finish_reason, "cancelled");
    EXPECT_LT(r.ids.size(), 20u);
    // A queued request cancelled before it runs never starts.
    std::promise<GenerationResult> a, b;
    GenerationCallbacks ca, cbb;
    ca.on_done = [&](const GenerationResult& r2) { a.set_value(r2); };
    cbb.on_done = [&](const GenerationResult& r2) { b.set_value(r2); };
    GenerationRequest big = greedy(ids(12, 4), 60), small = greedy(ids(12, 5), 5);
    const uint64_t first = e.submit(big, ca);
    e.submit(big, GenerationCallbacks{});
    const uint64_t third = e.submit(small, cbb);  // both slots are taken: waits
    e.cancel(third);
    EXPECT_EQ(b.get_future().get().finish_reason, "cancelled");
    e.cancel(first);
    EXPECT_EQ(a.get_future().get().finish_reason, "cancelled");
}

// Engine::slots(), the view GET /slots shows. A decodes; from its first token on, B (a prompt
// of ten 64-token pieces) and C arrive; with two slots C waits. Decode steps and B's pieces
// alternate, so each of A's tokens sees the view the step before left: B prefilling piece by
// piece (prompt done = tokens in its context), C queued, A decoding with its own counts.
TEST_F(EngineTest, SlotsShowEachRequestsProgress) {
    EngineOptions o = options(2);
    o.n_ctx = 1024;
    o.batch_size = 64;
    Engine e(o);
    {  // nothing running: every slot idle
        const EngineSlots v = e.slots();
        ASSERT_EQ(v.slots.size(), 2u);
        for (int i = 0; i < 2; ++i) {
            EXPECT_EQ(v.slots[size_t(i)].id, i);
            EXPECT_EQ(v.slots[size_t(i)].state, "idle");
            EXPECT_EQ(v.slots[size_t(i)].request, 0u);
        }
        EXPECT_EQ(v.queued, 0);
    }
    const GenerationRequest b_req = greedy(ids(640, 11), 2), c_req = greedy(ids(8, 12), 2);
    std::vector<EngineSlots> seen;
    std::vector<int> a_tokens;  // A's tokens sampled when each view was taken
    std::atomic<uint64_t> a_id{0}, b_id{0}, c_id{0};
    GenerationCallbacks a_cb;
    a_cb.on_token = [&](int32_t) {
        if (a_tokens.empty()) {
            b_id = e.submit(b_req);
            c_id = e.submit(c_req);
        }
        a_tokens.push_back(int(a_tokens.size()) + 1);
        seen.push_back(e.slots());
    };
    const GenerationRequest a_req = greedy(ids(20, 10), 40);
    std::promise<GenerationResult> a_done;
    a_cb.on_done = [&](const GenerationResult& r) { a_done.set_value(r); };
    a_id = e.submit(a_req, a_cb);
    ASSERT_EQ(a_done.get_future().get().ids.size(), 40u);
    int prefilling = 0, queued_seen = 0, last_done = -1;
    for (size_t k = 0; k < seen.size(); ++k) {
        const EngineSlots& v = seen[k];
        ASSERT_EQ(v.slots.size(), 2u);
        for (const SlotInfo& s : v.slots) {
            if (s.request == a_id && k == 0) {  // its first token comes from its prompt's step
                EXPECT_EQ(s.state, "prefilling");
                EXPECT_EQ(s.n_prompt_done, 0);
                EXPECT_EQ(s.n_past, 0);
            } else if (s.request == a_id) {
                EXPECT_EQ(s.state, "decoding");
                EXPECT_EQ(s.n_prompt, 20);
                EXPECT_EQ(s.n_prompt_done, 20);
                // The view is the previous step's: A's tokens then were one fewer than now.
                EXPECT_EQ(s.n_generated, a_tokens[k] - 1) << "view " << k;
                EXPECT_EQ(s.n_past, 20 + s.n_generated - 1) << "view " << k;
            } else if (s.request == b_id && s.state == "prefilling") {
                EXPECT_EQ(s.n_prompt, 640);
                EXPECT_EQ(s.n_prompt_done % 64, 0);
                EXPECT_GE(s.n_prompt_done, last_done);
                last_done = s.n_prompt_done;
                EXPECT_EQ(s.n_past, s.n_prompt_done);
                EXPECT_EQ(s.n_generated, 0);
                if (s.n_prompt_done > 0 && s.n_prompt_done < 640) ++prefilling;
            }
        }
        if (v.queued == 1) ++queued_seen;
    }
    EXPECT_GE(prefilling, 8) << "B's pieces were not seen one by one";
    EXPECT_GE(queued_seen, 8) << "C was not seen waiting";
    // Every request done: the slots are idle again (the view after the last step).
    for (int i = 0; i < 500; ++i) {
        const EngineSlots v = e.slots();
        if (v.queued == 0 && std::all_of(v.slots.begin(), v.slots.end(), [](const SlotInfo& s) { return s.state == "idle"; }))
            return;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "the slots did not return to idle";
}

// response_format json_object: with random weights (the tiny model's answers are noise) and
// sampling at temperature 1 over several seeds, with and without truncation, the text always
// parses as one JSON object and the generation stops where the object closes; a budget far
// below a free answer's length still closes it in time. Unconstrained, the same requests are
// not JSON (so the check can fail).
TEST_F(EngineTest, JsonObjectOutputAlwaysParses) {
    Engine e(options(8));
    const std::vector<int32_t> prompt = e.tokenize("Give me a JSON object describing a cat:", false);
    std::vector<GenerationRequest> reqs;
    for (uint64_t seed = 1; seed <= 6; ++seed)
        for (int variant = 0; variant < 3; ++variant) {
            GenerationRequest r;
            r.prompt = prompt;
            r.max_tokens = variant == 2 ? 6 : 32;  // 6: the budget rule must close it early
            r.sampling.temperature = 1;
            r.sampling.seed = seed;
            if (variant == 1) r.sampling.top_k = 0, r.sampling.top_p = 1, r.sampling.min_p = 0;  // the whole vocabulary
            reqs.push_back(r);
        }
    // All at once (they batch); then the same requests unconstrained.
    auto run_all = [&](bool json) {
        std::vector<std::future<GenerationResult>> f;
        for (GenerationRequest r : reqs) {
            if (json) r.format = GenerationRequest::Format::JsonObject;
            auto done = std::make_shared<std::promise<GenerationResult>>();
            f.push_back(done->get_future());
            GenerationCallbacks cb;
            cb.on_done = [done](const GenerationResult& g) { done->set_value(g); };
            e.submit(std::move(r), std::move(cb));
        }
        std::vector<GenerationResult> out;
        for (auto& x : f) out.push_back(x.get());
        return out;
    };
    auto t0 = std::chrono::steady_clock::now();
    const std::vector<GenerationResult> got = run_all(true);
    const double t_json = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int nonempty = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const GenerationResult& g = got[i];
        SCOPED_TRACE("request " + std::to_string(i) + ": " + g.text);
        const nlohmann::json j = nlohmann::json::parse(g.text, nullptr, /*allow_exceptions=*/false);
        ASSERT_FALSE(j.is_discarded()) << "not JSON";
        EXPECT_TRUE(j.is_object());
        EXPECT_EQ(g.finish_reason, "stop");
        EXPECT_LE(int(g.ids.size()), reqs[i].max_tokens);
        EXPECT_EQ(g.text.back(), '}') << "the generation goes on after the object";
        nonempty += !j.empty();
    }
    EXPECT_GT(nonempty, 0) << "only {} came out: the constraint leaves the model no room";
    int free_json = 0;
    t0 = std::chrono::steady_clock::now();
    const std::vector<GenerationResult> free = run_all(false);
    const double t_free = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    size_t n_json = 0, n_free = 0;
    for (const GenerationResult& g : got) n_json += g.ids.size();
    for (const GenerationResult& u : free) n_free += u.ids.size();
    std::printf("constrained %zu tokens in %.2f s, free %zu tokens in %.2f s\n", n_json, t_json, n_free, t_free);
    for (const GenerationResult& u : free) free_json += !nlohmann::json::parse(u.text, nullptr, false).is_discarded();
    EXPECT_EQ(free_json, 0) << "the model writes JSON unconstrained: the check above proves nothing";
    std::printf("e.g. %s\n    %s\n", got[0].text.c_str(), got[2].text.c_str());
}

// format_after: the text up to and including that token is free, the JSON starts after it.
TEST_F(EngineTest, JsonObjectAfterATokenStartsThere) {
    Engine e(options(1));
    GenerationRequest r = greedy(ids(10, 21), 40);
    r.text = true;
    r.ignore_eos = false;
    const GenerationResult free = e.generate(r);
    ASSERT_GE(free.ids.size(), 1u);
    r.format = GenerationRequest::Format::JsonObject;
    r.format_after = free.ids[0];  // greedy: the first token comes again, unconstrained
    const GenerationResult g = e.generate(r);
    ASSERT_GE(g.ids.size(), 3u);
    EXPECT_EQ(g.ids[0], free.ids[0]);
    const std::string head = e.token_bytes(g.ids[0]);
    EXPECT_NE(head.front(), '{') << "the free token would also start the JSON";
    ASSERT_EQ(g.text.substr(0, head.size()), head);
    const nlohmann::json j = nlohmann::json::parse(g.text.substr(head.size()), nullptr, false);
    EXPECT_TRUE(j.is_object()) << g.text;
    // A format needs the text; format_after must be a token.
    GenerationRequest bad = r;
    bad.text = false;
    EXPECT_THROW(e.submit(bad), Error);
    bad = r;
    bad.format_after = e.n_vocab();
    EXPECT_THROW(e.submit(bad), Error);
}

TEST_F(EngineTest, StopAndZeroTokens) {
    Engine e(options(1));
    GenerationRequest r = greedy(ids(8, 6), 0);
    const GenerationResult none = e.generate(r);
    EXPECT_EQ(none.finish_reason, "length");
    EXPECT_TRUE(none.ids.empty());
    r.max_tokens = 50;
    r.text = true;
    int pieces = 0;
    const GenerationResult stopped = e.generate(r, [&](const std::string&) { return ++pieces < 2; });
    EXPECT_EQ(stopped.finish_reason, "stop");
    EXPECT_LT(stopped.ids.size(), 50u);
}

// evaluate(): every position's logits, as a plain prefill (or decode steps) over the model,
// while a generation runs beside it.
TEST_F(EngineTest, EvaluateGivesThePlainForwardsLogits) {
    Engine e(options(1));
    const auto seq = ids(70, 21);
    const size_t V = size_t(model_->hparams().n_vocab);
    std::vector<float> want(seq.size() * V), want_dec(seq.size() * V);
    {
        ModelState st = runner_->new_state(256);
        ForwardOptions fo;
        fo.all_logits = true;
        runner_->forward(st, seq.data(), int(seq.size()), fo, want.data());
        ModelState sd = runner_->new_state(256);
        ForwardOptions dec;
        dec.gdn_mode = ref::GdnMode::Serial;
        for (size_t t = 0; t < seq.size(); ++t) runner_->forward(sd, &seq[t], 1, dec, want_dec.data() + t * V);
    }
    std::promise<GenerationResult> done;
    GenerationCallbacks cb;
    cb.on_done = [&](const GenerationResult& r) { done.set_value(r); };
    const auto prompt = ids(9, 22);
    e.submit(greedy(prompt, 40), cb);
    EXPECT_EQ(e.evaluate(seq), want);
    EXPECT_EQ(e.evaluate(seq, /*tokens_per_step=*/1), want_dec);
    EXPECT_EQ(done.get_future().get().ids, plain_loop(prompt, 40));  // undisturbed
    EXPECT_THROW(e.evaluate(ids(300, 23)), Error);
    EXPECT_THROW(e.evaluate({}), Error);
}

// A callback that throws fails its own request ("error", the message kept), not the engine.
TEST_F(EngineTest, AThrowingCallbackFailsOnlyItsRequest) {
    Engine e(options(2));
    std::promise<GenerationResult> done;
    GenerationCallbacks cb;
    cb.on_token = [](int32_t) { throw std::runtime_error("client code failed"); };
    cb.on_done = [&](const GenerationResult& r) { done.set_value(r); };
    e.submit(greedy(ids(6, 30), 10), cb);
    const GenerationResult r = done.get_future().get();
    EXPECT_EQ(r.finish_reason, "error");
    EXPECT_NE(r.error.find("client code failed"), std::string::npos) << r.error;
    const auto prompt = ids(6, 31);
    EXPECT_EQ(e.generate(greedy(prompt, 8)).ids, plain_loop(prompt, 8));
}

TEST_F(EngineTest, BadRequestsAndOptionsNameWhatIsWrong) {
    Engine e(options(1));
    auto expect_error = [](auto&& f, const std::string& part) {
        try {
            f();
            ADD_FAILURE() << "no error";
        } catch (const Error& err) {
            EXPECT_NE(std::string(err.what()).find(part), std::string::npos) << err.what();
        }
    };
    expect_error([&] { e.submit(greedy({}, 4)); }, "prompt is empty");
    expect_error([&] { e.submit(greedy({1, 2, 9999999}, 4)); }, "prompt token 2");
    expect_error([&] { e.submit(greedy(ids(200, 7), 100)); }, "exceeds the context size of 256");
    expect_error([&] { e.submit(greedy(ids(300, 7), 1)); }, "the context holds 256");
    EngineOptions bad = options(0);
    expect_error([&] { Engine x(bad); }, "n_parallel");
    bad = options(1);
    bad.cache_type_k = "q4_0";
    expect_error([&] { Engine x(bad); }, "cache_type_k");
    bad = options(1);
    bad.model_path = (dir_ / "missing.gguf").string();
    expect_error([&] { Engine x(bad); }, "missing.gguf");
    // The MTP head (perplexity --mtp): the synthetic model has none; too few ids.
    expect_error([&] { e.evaluate_mtp(ids(8, 3)); }, "no MTP block");
    expect_error([&] { e.evaluate_mtp({5}); }, "at least 2 token ids");
}

}  // namespace
}  // namespace alloy
