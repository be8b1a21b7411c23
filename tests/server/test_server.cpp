// `alloy serve` end to end: the server on a free port in this process, a synthetic tiny model
// with the real Qwen3 vocabulary, requests through cpp-httplib's client. Greedy completions
// must equal a plain prefill + greedy decode loop over the model, a stream must add up to the
// same text, stop strings must cut it, and every bad request must get a JSON error naming
// what was wrong.
#include <gtest/gtest.h>

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "alloy/engine.h"
#include "model/synth.h"
#include "runtime/loaded_model.h"
#include "alloy/server.h"

namespace alloy::server {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class Serve : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir = fs::temp_directory_path() / ("alloy_serve_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        SynthOptions so;
        so.preset = "tiny";
        so.n_layer = 4;
        so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
        so.out_path = (dir / "tiny.gguf").string();
        synth_qwen35(so);
        lm = std::make_unique<LoadedModel>(load_model(so.out_path));
        EngineOptions eo;
        eo.model_path = so.out_path;
        eo.n_ctx = 256;
        eo.n_parallel = 8;
        eo.cache_ram_mib = 64;  // the prefix cache, as alloy serve runs it by default
        engine = std::make_unique<Engine>(eo);
        ServerOptions o;
        o.port = 0;
        o.model_name = "tiny";
        o.max_body_bytes = 1 << 16;
        server = std::make_unique<Server>(*engine, o);
        port = server->bind();
        thread = std::thread([] { server->listen(); });
    }
    static void TearDownTestSuite() {
        server->stop();
        thread.join();
        server.reset();
        engine.reset();
        lm.reset();
        fs::remove_all(dir);
    }
    static httplib::Result post(const std::string& path, const std::string& body) {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(120);
        return c.Post(path, body, "application/json");
    }
    // The logits rows of up to n greedy steps of `prompt` by a plain loop over the model:
    // prefill, then argmax and one serial decode step per token; it stops after a row whose
    // argmax ends the generation.
    static std::vector<std::vector<float>> greedy_logits(const std::string& prompt, int n) {
        const ModelRunner& m = *lm->runner;
        const std::vector<int32_t> ids = lm->tokenizer->encode(prompt, true);
        ModelState st = m.new_state(256);
        std::vector<float> logits(static_cast<size_t>(m.hparams().n_vocab));
        ForwardOptions fo, step;
        step.gdn_mode = ref::GdnMode::Serial;
        m.forward(st, ids.data(), int(ids.size()), fo, logits.data());
        std::vector<std::vector<float>> rows;
        for (int i = 0; i < n; ++i) {
            rows.push_back(logits);
            const int32_t next = argmax(logits);
            if (lm->tokenizer->is_end_of_generation(next)) break;
            if (i + 1 < n) m.forward(st, &next, 1, step, logits.data());
        }
        return rows;
    }
    static int32_t argmax(const std::vector<float>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }
    // The greedy text of `prompt` by that loop, stopping at end-of-generation.
    static std::string direct(const std::string& prompt, int n) {
        StreamDecoder dec(*lm->tokenizer);
        std::string text;
        for (const std::vector<float>& row : greedy_logits(prompt, n)) {
            const int32_t next = argmax(row);
            if (lm->tokenizer->is_end_of_generation(next)) break;
            text += dec.push(next);
        }
        return text + dec.flush();
    }
    static void expect_error(const httplib::Result& r, int status, const std::string& param, const std::string& needle) {
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, status) << r->body;
        const json j = json::parse(r->body);
        ASSERT_TRUE(j.contains("error")) << r->body;
        if (!param.empty()) {
            EXPECT_EQ(j["error"]["param"], param) << r->body;
        }
        EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
    }

    static inline fs::path dir;
    static inline std::unique_ptr<LoadedModel> lm;
    static inline std::unique_ptr<Engine> engine;
    static inline std::unique_ptr<Server> server;
    static inline std::thread thread;
    static inline int port = 0;
};

TEST_F(Serve, HealthAndModels) {
    httplib::Client c("127.0.0.1", port);
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    EXPECT_EQ(json::parse(h->body)["status"], "ok");
    auto m = c.Get("/v1/models");
    ASSERT_TRUE(m);
    EXPECT_EQ(json::parse(m->body)["data"][0]["id"], "tiny");
}

// "/" is the chat page, byte for byte the file in the repo (embedded at build time), with a
// policy that keeps the browser from fetching anything but this server.
TEST_F(Serve, ChatPageAtRootIsTheShippedFile) {
    std::ifstream f(std::string(ALLOY_SOURCE_DIR) + "/server/web/index.html", std::ios::binary);
    const std::string file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(file.empty());
    httplib::Client c("127.0.0.1", port);
    auto r = c.Get("/");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
    EXPECT_EQ(r->body, file);
    EXPECT_NE(r->get_header_value("Content-Security-Policy").find("connect-src 'self'"), std::string::npos);
    EXPECT_NE(r->body.find("/v1/chat/completions"), std::string::npos);
    EXPECT_EQ(r->body.find("http://"), std::string::npos) << "the page names another origin";
    EXPECT_EQ(r->body.find("https://"), std::string::npos) << "the page names another origin";
}

TEST_F(Serve, GreedyCompletionEqualsTheGenerationLoop) {
    const std::string prompt = "The capital of France is";
    auto r = post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}}.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["choices"][0]["text"], direct(prompt, 12));
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 12);
    EXPECT_EQ(j["usage"]["prompt_tokens"], int(lm->tokenizer->encode(prompt, true).size()));
}

// The SSE chunks of a stream, in order: their text pieces and the last chunk's finish_reason.
// The text, reasoning (chat deltas' reasoning_content) and finish_reason of a stream.
struct Streamed {
    std::string text, finish, reasoning;
};
Streamed read_stream(const std::string& body, bool chat) {
    std::string text, finish, reasoning;
    size_t pos = 0;
    bool done = false;
    while ((pos = body.find("data: ", pos)) != std::string::npos) {
        const size_t end = body.find("\n\n", pos);
        const std::string payload = body.substr(pos + 6, end - pos - 6);
        pos = end;
        if (payload == "[DONE]") {
            done = true;
            break;
        }
        const json c = json::parse(payload);
        const json& ch = c["choices"][0];
        if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
        else if (!chat) text += ch["text"].get<std::string>();
        else if (ch["delta"].contains("reasoning_content")) reasoning += ch["delta"]["reasoning_content"].get<std::string>();
        else text += ch["delta"]["content"].get<std::string>();
    }
    EXPECT_TRUE(done) << body;
    return {text, finish, reasoning};
}

TEST_F(Serve, StreamAddsUpToTheSameText) {
    for (bool chat : {false, true}) {
        json req = {{"max_tokens", 10}, {"temperature", 0}};
        if (chat) req["messages"] = json::array({{{"role", "user"}, {"content", "Hello there"}}});
        else req["prompt"] = "Once upon a time";
        const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
        auto whole = post(path, req.dump());
        req["stream"] = true;
        auto streamed = post(path, req.dump());
        ASSERT_TRUE(whole && streamed);
        ASSERT_EQ(streamed->status, 200) << streamed->body;
        const json w = json::parse(whole->body);
        const std::string want = chat ? w["choices"][0]["message"]["content"] : w["choices"][0]["text"];
        const Streamed got = read_stream(streamed->body, chat);
        EXPECT_EQ(got.text, want) << (chat ? "chat" : "completion");
        EXPECT_EQ(got.finish, w["choices"][0]["finish_reason"]);
        if (chat) EXPECT_EQ(got.reasoning, w["choices"][0]["message"]["reasoning_content"]);
    }
}

// logprobs: each generated token's log-softmax, checked against the model's own logits from a
// plain prefill + serial decode loop (the oracle of GreedyCompletionEqualsTheGenerationLoop);
// greedy, so the chosen token is the most likely alternative; the legacy completions layout.
TEST_F(Serve, LogprobsAreTheModelsLogSoftmax) {
    const std::string prompt = "The capital of France is";
    const int n = 8, top = 3;
    auto r = post("/v1/completions", json{{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"logprobs", top}}.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json lp = json::parse(r->body)["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), size_t(n)) << r->body;
    // The model's logits along the same tokens.
    const std::vector<std::vector<float>> rows = greedy_logits(prompt, n);
    ASSERT_EQ(rows.size(), size_t(n));
    size_t offset = 0;
    for (int i = 0; i < n; ++i) {
        const std::vector<float>& logits = rows[size_t(i)];
        const int32_t next = argmax(logits);
        double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
        for (float v : logits) sum += std::exp(double(v) - mx);
        const double lse = mx + std::log(sum);
        const std::string bytes = lm->tokenizer->token_bytes(next);
        // As sent: a token that is part of a UTF-8 character has its bytes replaced (U+FFFD).
        const std::string tok = json::parse(json(bytes).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
        EXPECT_EQ(lp["tokens"][size_t(i)], tok) << "token " << i;
        EXPECT_NEAR(lp["token_logprobs"][size_t(i)].get<double>(), double(logits[size_t(next)]) - lse, 1e-4) << "token " << i;
        EXPECT_LE(lp["token_logprobs"][size_t(i)].get<double>(), 0.0);
        ASSERT_EQ(lp["top_logprobs"][size_t(i)].size(), size_t(top));
        EXPECT_NEAR(lp["top_logprobs"][size_t(i)][tok].get<double>(), lp["token_logprobs"][size_t(i)].get<double>(), 1e-6);
        EXPECT_EQ(lp["text_offset"][size_t(i)], offset);
        offset += bytes.size();
    }
}

// Chat logprobs (logprobs + top_logprobs): content entries sorted most likely first, the
// greedy token first among them, bytes exact; the stream's chunks add up to the same entries.
TEST_F(Serve, ChatLogprobsAndTheirStream) {
    json req = {{"messages", json::array({{{"role", "user"}, {"content", "Hello there"}}})},
                {"max_tokens", 6}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 4},
                {"chat_template_kwargs", {{"enable_thinking", false}}}};
    auto whole = post("/v1/chat/completions", req.dump());
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->status, 200) << whole->body;
    const json w = json::parse(whole->body);
    const json content = w["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(), size_t(w["usage"]["completion_tokens"].get<int>())) << whole->body;
    for (const json& e : content) {
        ASSERT_EQ(e["top_logprobs"].size(), size_t(4));
        EXPECT_EQ(e["top_logprobs"][0]["bytes"], e["bytes"]);
        EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]);
        for (size_t k = 1; k < 4; ++k) EXPECT_GE(e["top_logprobs"][k - 1]["logprob"], e["top_logprobs"][k]["logprob"]);
    }
    req["stream"] = true;
    auto streamed = post("/v1/chat/completions", req.dump());
    ASSERT_TRUE(streamed);
    json got = json::array();
    size_t pos = 0;
    while ((pos = streamed->body.find("data: ", pos)) != std::string::npos) {
        const size_t end = streamed->body.find("\n\n", pos);
        const std::string payload = streamed->body.substr(pos + 6, end - pos - 6);
        pos = end;
        if (payload == "[DONE]") break;
        const json c = json::parse(payload)["choices"][0];
        if (c.contains("logprobs") && c["logprobs"].is_object())
            for (const json& e : c["logprobs"]["content"]) got.push_back(e);
    }
    EXPECT_EQ(got, content);
    // Without logprobs, none.
    req.erase("logprobs");
    req.erase("top_logprobs");
    req["stream"] = false;
    auto plain = post("/v1/chat/completions", req.dump());
    ASSERT_TRUE(plain);
    EXPECT_FALSE(json::parse(plain->body)["choices"][0].contains("logprobs") &&
                 json::parse(plain->body)["choices"][0]["logprobs"].is_object());
}

// n choices: choice i is the answer of one request with seed + i; the prompt counts once.
TEST_F(Serve, NChoicesAreTheirSeedsAnswers) {
    json req = {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"temperature", 1.0}, {"seed", 5}, {"n", 3}};
    auto r = post("/v1/completions", req.dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    ASSERT_EQ(j["choices"].size(), size_t(3));
    int completion = 0;
    std::set<std::string> distinct;
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(j["choices"][size_t(i)]["index"], i);
        json one = req;
        one["n"] = 1;
        one["seed"] = 5 + i;
        auto o = post("/v1/completions", one.dump());
        ASSERT_TRUE(o);
        const json oj = json::parse(o->body);
        EXPECT_EQ(j["choices"][size_t(i)]["text"], oj["choices"][0]["text"]) << "choice " << i;
        completion += oj["usage"]["completion_tokens"].get<int>();
        distinct.insert(j["choices"][size_t(i)]["text"].get<std::string>());
    }
    EXPECT_GT(distinct.size(), size_t(1)) << "three seeds gave one text: the seeds were not applied";
    EXPECT_EQ(j["usage"]["completion_tokens"], completion);
    EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + completion);
    req["n"] = 17;
    expect_error(post("/v1/completions", req.dump()), 400, "n", "n");
}

// n choices in one stream (OpenAI's shape): every chunk names its choice's index, each choice's
// pieces add up to its non-streamed text (and reasoning), its finish_reason comes in its last
// chunk, and with stream_options.include_usage a last chunk without choices carries the totals.
TEST_F(Serve, NChoicesStreamInOneStreamByIndex) {
    for (bool chat : {false, true}) {
        json req = {{"max_tokens", 8}, {"temperature", 1.0}, {"seed", 11}, {"n", 3}};
        if (chat) req["messages"] = json::array({{{"role", "user"}, {"content", "Hello there"}}});  // thinking on
        else req["prompt"] = "Once upon a time";
        const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
        auto whole = post(path, req.dump());
        ASSERT_TRUE(whole);
        ASSERT_EQ(whole->status, 200) << whole->body;
        const json w = json::parse(whole->body);
        req["stream"] = true;
        req["stream_options"] = {{"include_usage", true}};
        auto r = post(path, req.dump());
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        std::vector<std::string> text(3), reasoning(3), finish(3);
        std::vector<int> roles(3, 0);
        json usage;
        bool done = false;
        size_t pos = 0;
        while ((pos = r->body.find("data: ", pos)) != std::string::npos) {
            const size_t end = r->body.find("\n\n", pos);
            const std::string payload = r->body.substr(pos + 6, end - pos - 6);
            pos = end;
            ASSERT_FALSE(done) << "a chunk after [DONE]";
            if (payload == "[DONE]") {
                done = true;
                continue;
            }
            const json c = json::parse(payload);
            ASSERT_TRUE(usage.is_null()) << "a chunk after the usage chunk: " << payload;
            if (c["choices"].empty()) {
                usage = c["usage"];
                continue;
            }
            ASSERT_EQ(c["choices"].size(), size_t(1)) << payload;
            const json& ch = c["choices"][0];
            const int i = ch["index"].get<int>();
            ASSERT_TRUE(i >= 0 && i < 3) << payload;
            ASSERT_TRUE(finish[size_t(i)].empty()) << "choice " << i << " has a chunk after its finish_reason";
            EXPECT_FALSE(c.contains("usage")) << "n > 1: usage only in the include_usage chunk";
            if (!ch["finish_reason"].is_null()) finish[size_t(i)] = ch["finish_reason"];
            else if (!chat) text[size_t(i)] += ch["text"].get<std::string>();
            else {
                if (ch["delta"].contains("role")) ++roles[size_t(i)];
                if (ch["delta"].contains("reasoning_content")) reasoning[size_t(i)] += ch["delta"]["reasoning_content"].get<std::string>();
                else text[size_t(i)] += ch["delta"]["content"].get<std::string>();
            }
        }
        EXPECT_TRUE(done) << r->body;
        for (size_t i = 0; i < 3; ++i) {
            const json& wc = w["choices"][i];
            EXPECT_EQ(text[i], chat ? wc["message"]["content"] : wc["text"]) << "choice " << i;
            EXPECT_EQ(finish[i], wc["finish_reason"]) << "choice " << i;
            if (chat) {
                EXPECT_EQ(reasoning[i], wc["message"]["reasoning_content"]) << "choice " << i;
                EXPECT_EQ(roles[i], 1) << "choice " << i << ": the role in its first chunk only";
            }
        }
        ASSERT_FALSE(usage.is_null()) << "no usage chunk with include_usage";
        EXPECT_EQ(usage["completion_tokens"], w["usage"]["completion_tokens"]);
        EXPECT_EQ(usage["prompt_tokens"], w["usage"]["prompt_tokens"]);
        EXPECT_EQ(usage["total_tokens"], w["usage"]["total_tokens"]);
    }
    // stream_options belongs to a stream; a bad include_usage is named.
    json req = {{"prompt", "x"}, {"max_tokens", 2}, {"stream_options", {{"include_usage", true}}}};
    expect_error(post("/v1/completions", req.dump()), 400, "stream_options", "stream");
    req["stream"] = true;
    req["stream_options"] = {{"include_usage", "yes"}};
    expect_error(post("/v1/completions", req.dump()), 400, "stream_options.include_usage", "boolean");
}

// A streaming client that goes away cancels its request: the engine stops generating for it
// (well before max_tokens) and its slot is free again.
TEST_F(Serve, AStreamingClientThatLeavesCancelsItsRequest) {
    // Unhindered, this request runs all 220 tokens (no end-of-generation token comes first).
    auto full = post("/v1/completions", json{{"prompt", "Once upon a time"}, {"max_tokens", 220}, {"temperature", 0}}.dump());
    ASSERT_TRUE(full && full->status == 200);
    ASSERT_EQ(json::parse(full->body)["usage"]["completion_tokens"], 220);
    const EngineStats before = engine->stats();
    {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(60);
        int chunks = 0;
        const std::string body =
            json{{"prompt", "Once upon a time"}, {"max_tokens", 220}, {"temperature", 0}, {"stream", true}, {"stop", json::array()}}
                .dump();
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.headers = {{"Content-Type", "application/json"}};
        req.body = body;
        req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 2; };  // leave
        c.send(req);
        EXPECT_GE(chunks, 1);
    }
    EngineStats now = engine->stats();
    for (int i = 0; i < 200 && (now.active > 0 || now.queued > 0); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        now = engine->stats();
    }
    EXPECT_EQ(now.active, 0);
    EXPECT_LT(now.generated_tokens - before.generated_tokens, 200u) << "the request ran on after its client left";
}

// A streaming client that leaves while its request waits for a slot is noticed (the stream's
// comment pings fail to write) and its request leaves the queue, long before the slot frees.
TEST_F(Serve, AStreamingClientThatLeavesWhileQueuedLeavesTheQueue) {
    EngineOptions eo;
    eo.model_path = engine->options().model_path;
    eo.n_ctx = 32768;
    eo.n_parallel = 1;
    Engine one(eo);
    ServerOptions o;
    o.port = 0;
    Server srv(one, o);
    const int p = srv.bind();
    std::thread t([&] { srv.listen(); });
    auto stream_req = [](int max_tokens) {
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.headers = {{"Content-Type", "application/json"}};
        req.body = json{{"prompt", "Once upon a time"}, {"max_tokens", max_tokens}, {"temperature", 0}, {"stream", true},
                        {"stop", json::array()}}.dump();
        return req;
    };
    // A holds the one slot for seconds (30000 tokens; its client reads until told to leave).
    std::atomic<bool> leave_a{false}, a_done{false};
    std::thread a([&] {
        httplib::Client c("127.0.0.1", p);
        c.set_read_timeout(120);
        httplib::Request req = stream_req(30000);
        req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return !leave_a.load(); };
        c.send(req);
        a_done = true;
    });
    for (int i = 0; i < 200 && one.stats().active == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(one.stats().active, 1);
    {  // B queues behind A; its client leaves at the first bytes of the body (a ping).
        httplib::Client c("127.0.0.1", p);
        c.set_read_timeout(30);
        httplib::Request req = stream_req(8);
        req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return false; };
        c.send(req);
    }
    EngineStats st = one.stats();
    for (int i = 0; i < 300 && st.queued > 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        st = one.stats();
    }
    EXPECT_FALSE(a_done) << "A ended before the check: it must hold the slot throughout";
    EXPECT_EQ(st.queued, 0) << "the request of a client that left stays queued";
    leave_a = true;
    a.join();
    srv.stop();
    t.join();
}

TEST_F(Serve, StopStringsCutTheTextEvenAcrossTokens) {
    const std::string prompt = "The capital of France is";
    const std::string full = direct(prompt, 16);
    ASSERT_GT(full.size(), 12u);
    const std::string stop = full.substr(5, 6);  // most likely spans a token boundary
    const std::string want = full.substr(0, full.find(stop));
    for (bool stream : {false, true}) {
        auto r = post("/v1/completions",
                      json{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"stop", stop}, {"stream", stream}}.dump());
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        if (stream) {
            const Streamed got = read_stream(r->body, false);
            EXPECT_EQ(got.text, want);
            EXPECT_EQ(got.finish, "stop");
        } else {
            const json j = json::parse(r->body);
            EXPECT_EQ(j["choices"][0]["text"], want);
            EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
        }
    }
}

// A prompt that starts with an earlier request's prompt resumes from its checkpoint, and the
// usage says how many prompt tokens were not recomputed (OpenAI's cached_tokens).
TEST_F(Serve, APromptExtendingAnEarlierOneReportsCachedTokens) {
    const std::string base = "The prefix cache keeps the state of this prompt for the next request";
    auto r1 = post("/v1/completions", json{{"prompt", base}, {"max_tokens", 4}, {"temperature", 0}}.dump());
    ASSERT_TRUE(r1 && r1->status == 200);
    const json u1 = json::parse(r1->body)["usage"];
    EXPECT_EQ(u1["prompt_tokens_details"]["cached_tokens"], 0);
    auto r2 = post("/v1/completions", json{{"prompt", base + ", and of this one too."}, {"max_tokens", 4}, {"temperature", 0}}.dump());
    ASSERT_TRUE(r2 && r2->status == 200) << (r2 ? r2->body : "");
    const json u2 = json::parse(r2->body)["usage"];
    const int cached = u2["prompt_tokens_details"]["cached_tokens"].get<int>();
    EXPECT_GT(cached, 0) << u2.dump();
    EXPECT_LT(cached, u2["prompt_tokens"].get<int>());
}

// /metrics in Prometheus text: the counters move with a request; CORS on every response.
TEST_F(Serve, MetricsAndCors) {
    auto r = post("/v1/completions", json{{"prompt", "Counting tokens"}, {"max_tokens", 3}, {"temperature", 0}}.dump());
    ASSERT_TRUE(r && r->status == 200);
    EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "*");
    httplib::Client c("127.0.0.1", port);
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m && m->status == 200);
    for (const char* name : {"# TYPE alloy_generated_tokens_total counter", "alloy_requests_active ",
                             "alloy_prefix_cache_hits_total ", "alloy_http_responses_total{class=\"2xx\"} ",
                             "alloy_decode_tokens_per_second ", "alloy_spec_accepted_tokens_total "})
        EXPECT_NE(m->body.find(name), std::string::npos) << name << "\n" << m->body;
    const size_t at = m->body.find("\nalloy_generated_tokens_total ");
    ASSERT_NE(at, std::string::npos);
    EXPECT_GE(std::stod(m->body.substr(at + 30)), 3.0);
    auto pre = c.Options("/v1/chat/completions");
    ASSERT_TRUE(pre);
    EXPECT_EQ(pre->status, 204);
    EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
}

// --api-key: 401 in OpenAI's shape without the right Bearer token; /health stays public.
TEST_F(Serve, ApiKeyIsRequiredButNotForHealth) {
    ServerOptions o;
    o.port = 0;
    o.api_key = "sk-test";
    Server keyed(*engine, o);
    const int p = keyed.bind();
    std::thread t([&] { keyed.listen(); });
    httplib::Client c("127.0.0.1", p);
    const std::string body = json{{"prompt", "Hi"}, {"max_tokens", 2}, {"temperature", 0}}.dump();
    auto none = c.Post("/v1/completions", body, "application/json");
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 401);
    EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key");
    auto wrong = c.Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer nope"}}, body, "application/json");
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
    auto right = c.Post("/v1/completions", httplib::Headers{{"Authorization", "Bearer sk-test"}}, body, "application/json");
    ASSERT_TRUE(right);
    EXPECT_EQ(right->status, 200) << right->body;
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    // /slots names requests and their progress: behind the key like the API itself.
    auto slots = c.Get("/slots");
    ASSERT_TRUE(slots);
    EXPECT_EQ(slots->status, 401);
    auto slots_keyed = c.Get("/slots", httplib::Headers{{"Authorization", "Bearer sk-test"}});
    ASSERT_TRUE(slots_keyed);
    EXPECT_EQ(slots_keyed->status, 200);
    EXPECT_EQ(json::parse(slots_keyed->body)["slots"].size(), 8u);
    auto page = c.Get("/");  // the chat page holds no secret; its API calls carry the key
    ASSERT_TRUE(page);
    EXPECT_EQ(page->status, 200);
    keyed.stop();
    t.join();
}

// GET /slots: one entry per engine slot; idle ones say so and hold no request.
TEST_F(Serve, SlotsAreIdleWithNothingRunning) {
    httplib::Client c("127.0.0.1", port);
    json j;
    for (int i = 0; i < 200; ++i) {  // requests of earlier tests may still be leaving
        auto r = c.Get("/slots");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        j = json::parse(r->body);
        if (j["slots"].size() == 8 && std::all_of(j["slots"].begin(), j["slots"].end(), [](const json& s) { return s["state"] == "idle"; }))
            break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_EQ(j["n_parallel"], 8);
    EXPECT_EQ(j["queue_depth"], 0);
    ASSERT_EQ(j["slots"].size(), 8u);
    for (int i = 0; i < 8; ++i) {
        const json& s = j["slots"][size_t(i)];
        EXPECT_EQ(s["id"], i);
        EXPECT_EQ(s["state"], "idle") << s.dump();
        EXPECT_TRUE(s["request_id"].is_null()) << s.dump();
        EXPECT_TRUE(s["prompt"].is_null()) << s.dump();
    }
}

// While a long stream runs, /slots shows its slot decoding under the stream's own id, with the
// prompt done, the tokens generated so far and a context of prompt + fed tokens; after the
// client leaves the slot is idle again.
TEST_F(Serve, SlotsShowALongStreamDecoding) {
    const std::string prompt = "Once upon a time";
    const int n_prompt = int(lm->tokenizer->encode(prompt, true).size());
    std::atomic<bool> leave{false};
    std::string stream_id;
    std::mutex id_mu;
    std::thread client([&] {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(60);
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.headers = {{"Content-Type", "application/json"}};
        req.body = json{{"prompt", prompt}, {"max_tokens", 220}, {"temperature", 0}, {"stream", true}}.dump();
        std::string got;
        req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
            got.append(d, n);
            if (const size_t p = got.find("\"id\":\""); p != std::string::npos) {
                std::lock_guard<std::mutex> lock(id_mu);
                if (stream_id.empty()) stream_id = got.substr(p + 6, got.find('"', p + 6) - p - 6);
            }
            return !leave.load();
        };
        c.send(req);
    });
    httplib::Client c("127.0.0.1", port);
    json busy;
    for (int i = 0; i < 500 && busy.is_null(); ++i) {
        auto r = c.Get("/slots");
        ASSERT_TRUE(r && r->status == 200);
        const json j = json::parse(r->body);
        for (const json& s : j["slots"])
            if (s["state"] == "decoding" && s["n_generated"].get<int>() >= 4 && s["request_id"].is_string()) busy = s;
        if (busy.is_null()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    leave = true;
    client.join();
    ASSERT_FALSE(busy.is_null()) << "no slot was seen decoding the stream";
    {
        std::lock_guard<std::mutex> lock(id_mu);
        EXPECT_EQ(busy["request_id"], stream_id) << busy.dump();
    }
    EXPECT_EQ(busy["choice"], 0);
    EXPECT_GT(busy["task_id"].get<uint64_t>(), 0u);
    EXPECT_EQ(busy["prompt"]["total"], n_prompt) << busy.dump();
    EXPECT_EQ(busy["prompt"]["done"], n_prompt) << busy.dump();
    // The last sampled token has not run yet: the context is the prompt + all tokens but one.
    EXPECT_EQ(busy["n_past"].get<int>(), n_prompt + busy["n_generated"].get<int>() - 1) << busy.dump();
    EXPECT_LT(busy["n_generated"].get<int>(), 220);
    // The client left: its request is cancelled and its slot idle again.
    bool idle = false;
    for (int i = 0; i < 200 && !idle; ++i) {
        auto r = c.Get("/slots");
        ASSERT_TRUE(r && r->status == 200);
        idle = true;
        for (const json& s : json::parse(r->body)["slots"]) idle = idle && s["state"] == "idle";
        if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    EXPECT_TRUE(idle) << "the stream's slot stayed busy after its client left";
}

// response_format json_object end to end: the content of every answer (random weights,
// temperature 1, several seeds; chat and completions; whole and streamed) parses as a JSON
// object and ends the generation ("stop"); json_schema and unknown types are refused by name.
TEST_F(Serve, ResponseFormatJsonObjectAnswersAreJsonObjects) {
    const json msgs = json::array({{{"role", "user"}, {"content", "Describe a cat as JSON."}}});
    const json off = {{"enable_thinking", false}};
    const json fmt = {{"type", "json_object"}};
    for (int seed = 1; seed <= 4; ++seed) {
        const json body = {{"messages", msgs}, {"max_tokens", 24}, {"temperature", 1}, {"seed", seed},
                           {"chat_template_kwargs", off}, {"response_format", fmt}};
        auto r = post("/v1/chat/completions", body.dump());
        ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
        const json j = json::parse(r->body);
        const std::string content = j["choices"][0]["message"]["content"];
        EXPECT_TRUE(json::parse(content, nullptr, false).is_object()) << "seed " << seed << ": " << content;
        EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << content;
        EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 24);
        if (seed == 1) {  // the same request streamed adds up to the same object
            json sb = body;
            sb["stream"] = true;
            auto st = post("/v1/chat/completions", sb.dump());
            ASSERT_TRUE(st && st->status == 200);
            const Streamed got = read_stream(st->body, true);
            EXPECT_EQ(got.text, content);
            EXPECT_EQ(got.finish, "stop");
        }
    }
    auto c = post("/v1/completions", json{{"prompt", "cat ="}, {"max_tokens", 16}, {"temperature", 1}, {"seed", 9},
                                          {"response_format", fmt}}.dump());
    ASSERT_TRUE(c && c->status == 200) << (c ? c->body : "no response");
    const std::string text = json::parse(c->body)["choices"][0]["text"];
    EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
    expect_error(post("/v1/chat/completions", json{{"messages", msgs}, {"response_format", {{"type", "json_schema"}}}}.dump()),
                 400, "response_format.type", "json_schema");
    expect_error(post("/v1/chat/completions", json{{"messages", msgs}, {"response_format", "json"}}.dump()), 400,
                 "response_format", "object");
}

TEST_F(Serve, BadRequestsGetJsonErrorsNamingTheField) {
    expect_error(post("/v1/completions", "{not json"), 400, "", "not valid JSON");
    expect_error(post("/v1/completions", R"({"max_tokens": 5})"), 400, "prompt", "required");
    expect_error(post("/v1/completions", R"({"prompt": "x", "temperature": "warm"})"), 400, "temperature", "number");
    expect_error(post("/v1/completions", R"({"prompt": "x", "max_tokens": 1000})"), 400, "max_tokens", "context of 256");
    expect_error(post("/v1/chat/completions", R"({"messages": [{"role": "assistant", "content": "x"}]})"), 400,
                 "messages", "user");
    std::string long_prompt;
    for (int i = 0; i < 300; ++i) long_prompt += " word";
    expect_error(post("/v1/completions", json{{"prompt", long_prompt}}.dump()), 400, "prompt", "context holds 256");
    expect_error(post("/v1/completions", json{{"prompt", std::string(70000, 'a')}}.dump()), 413, "", "larger");
    // Bytes that are not UTF-8 in a malformed body: the error still comes back as JSON.
    expect_error(post("/v1/completions", std::string("{\"prompt\": \"\xff\xfe") + "\"}"), 400, "", "not valid JSON");
    const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
    expect_error(post("/v1/chat/completions", "{" + msgs + R"(, "logprobs": true, "top_logprobs": 21})"), 400,
                 "top_logprobs", "top_logprobs");
    expect_error(post("/v1/chat/completions", "{" + msgs + R"(, "top_logprobs": 2})"), 400, "top_logprobs", "logprobs");
    expect_error(post("/v1/chat/completions", "{" + msgs + R"(, "logprobs": 3})"), 400, "logprobs", "boolean");
    expect_error(post("/v1/completions", R"({"prompt": "x", "logprobs": -1})"), 400, "logprobs", "logprobs");
    httplib::Client c("127.0.0.1", port);
    expect_error(c.Get("/v2/nothing"), 404, "", "/v2/nothing");
}

// Issue 17, must-show 2: 16 identical greedy requests at once through the engine's 8 slots
// (8 decode together, 8 wait and join as slots free up) give exactly one distinct answer, the
// one a plain loop gives.
// Issue 19's concurrency checks through --parallel 8: 32 identical greedy requests at once give
// one answer, the one-request answer; 8 different prompts at once each give their own
// one-request answer (decode steps of up to 16 sequences are batch-invariant).
TEST_F(Serve, ThirtyTwoIdenticalAndEightDifferentRequestsAtOnce) {
    auto post_all = [&](const std::vector<std::string>& prompts, int n) {
        std::vector<std::string> texts(prompts.size());
        std::vector<std::thread> clients;
        for (size_t i = 0; i < prompts.size(); ++i)
            clients.emplace_back([&, i] {
                auto r = post("/v1/completions", json{{"prompt", prompts[i]}, {"max_tokens", n}, {"temperature", 0}}.dump());
                texts[i] = r && r->status == 200 ? json::parse(r->body)["choices"][0]["text"].get<std::string>()
                           : r ? "<HTTP " + std::to_string(r->status) + ">"
                               : "<failed: " + httplib::to_string(r.error()) + ">";
            });
        for (auto& c : clients) c.join();
        return texts;
    };
    const std::vector<std::string> same(32, "The river runs past the old mill");
    const auto a = post_all(same, 16);
    EXPECT_EQ(std::set<std::string>(a.begin(), a.end()).size(), 1u);
    EXPECT_EQ(a[0], direct(same[0], 16));
    std::vector<std::string> different;
    for (int i = 0; i < 8; ++i) different.push_back("Story number " + std::to_string(i) + " begins with a");
    const auto b = post_all(different, 16);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(b[size_t(i)], direct(different[size_t(i)], 16)) << different[size_t(i)];
}

TEST_F(Serve, SixteenIdenticalGreedyRequestsInParallelGiveOneAnswer) {
    const std::string prompt = "Once upon a time";
    const std::string body = json{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}}.dump();
    std::vector<std::string> texts(16);
    std::vector<std::thread> clients;
    for (int i = 0; i < 16; ++i)
        clients.emplace_back([&, i] {
            auto r = post("/v1/completions", body);
            if (r && r->status == 200) texts[size_t(i)] = json::parse(r->body)["choices"][0]["text"].get<std::string>();
            else texts[size_t(i)] = r ? "<HTTP " + std::to_string(r->status) + ": " + r->body + ">"
                                      : "<failed: " + httplib::to_string(r.error()) + ">";
        });
    for (auto& t : clients) t.join();
    const std::set<std::string> distinct(texts.begin(), texts.end());
    EXPECT_EQ(distinct.size(), 1u) << *distinct.begin() << " | " << *distinct.rbegin();
    EXPECT_EQ(*distinct.begin(), direct(prompt, 24));
    EXPECT_GT(engine->stats().max_batch_sequences, 4) << "the requests never ran together";
}

}  // namespace
}  // namespace alloy::server
