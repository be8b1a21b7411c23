#include "alloy/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <nlohmann/json.hpp>

#include "alloy/error.h"
#include "server/chat_page.h"  // generated from server/web/index.html (CMakeLists.txt)
#include "server/reasoning.h"
#include "server/request.h"

namespace alloy::server {

using json = nlohmann::json;

namespace {

// JSON text of a response; bytes that are not UTF-8 (a parse error message can quote the
// request's own bytes) become U+FFFD instead of making dump() throw.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json error_body(const std::string& message, const std::string& type, const std::string& param) {
    return {{"error", {{"message", message}, {"type", type}, {"param", param.empty() ? json() : json(param)}, {"code", nullptr}}}};
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& param = "") {
    res.status = status;
    res.set_content(dump(error_body(message, type, param)), "application/json");
}

int64_t unix_time() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The texts of one streamed request's choices (n generations), from the engine's thread to the
// connection's: one queue of events in the order they happened, so the stream interleaves the
// choices as their text becomes final and a choice's end comes after all of its text.
struct StreamChannel {
    struct Event {
        int choice;
        bool done;         // the choice finished (its result is in choices[choice].result)
        std::string text;  // else: a piece of its text
    };
    struct Choice {
        std::vector<TokenLogprob> logprobs;  // every sampled token's so far (requests that ask)
        GenerationResult result;
    };
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> events;
    std::vector<Choice> choices;
    bool client_gone = false;
    explicit StreamChannel(int n) : choices(size_t(n)) {}
};

// How long a stream waits for its next piece before it sends an SSE comment (checking that the
// client is still there).
constexpr std::chrono::milliseconds kPing{500};

// Connection threads: every slot's request (blocking or streaming) and a few waiting.
int http_threads(const Engine& e) { return e.options().n_parallel * 2 + 4; }

}  // namespace

struct Server::Impl {
    Engine& engine;
    ServerOptions opt;
    const int n_ctx;
    httplib::Server http;
    std::atomic<uint64_t> next_id{1};
    // Responses by status class (the logger sees every one) and requests turned away as busy.
    std::atomic<uint64_t> responses_2xx{0}, responses_4xx{0}, responses_5xx{0}, rejected_busy{0}, unauthorized{0};
    int listen_fd = -1;  // the listening socket, to raise its backlog after bind

    // Completion requests in flight, for the graceful shutdown: one Flight per request, alive
    // until its response is done (a stream's until its provider is released), holding the
    // engine requests it submitted so that a shutdown past its timeout can cancel them.
    struct Flight {
        Impl& s;
        std::mutex mu;
        std::vector<uint64_t> ids;   // the engine's requests, choice i at i
        std::string response_id;     // the id its response carries (chatcmpl-N), for /slots
        explicit Flight(Impl& server) : s(server) {
            std::lock_guard<std::mutex> lock(s.flights_mu);
            s.flights.insert(this);
        }
        ~Flight() {
            std::lock_guard<std::mutex> lock(s.flights_mu);
            s.flights.erase(this);
            s.flights_cv.notify_all();
        }
        void add(uint64_t id) {
            std::lock_guard<std::mutex> lock(mu);
            ids.push_back(id);
        }
    };
    std::mutex flights_mu;
    std::condition_variable flights_cv;
    std::set<Flight*> flights;
    std::atomic<bool> draining{false};  // shutdown() began: new requests get 503

    // Cancels every engine request of every flight (finished ones are ignored by the engine);
    // returns how many flights there were.
    int cancel_flights() {
        std::lock_guard<std::mutex> lock(flights_mu);
        for (Flight* f : flights) {
            std::lock_guard<std::mutex> l2(f->mu);
            for (uint64_t id : f->ids) engine.cancel(id);
        }
        return int(flights.size());
    }

    Impl(Engine& e, ServerOptions o) : engine(e), opt(std::move(o)), n_ctx(e.options().n_ctx) {
        if (!engine.has_tokenizer()) return;
        auto one = [&](const char* text, bool special) {
            const std::vector<int32_t> t = engine.tokenize(text, special);
            return t.size() == 1 ? t[0] : -1;
        };
        im_start = one("<|im_start|>", true);
        im_end = one("<|im_end|>", true);
        newline = one("\n", false);
        assistant = one("assistant", false);
        think_end = one("</think>", true);
    }
    int32_t im_start = -1, im_end = -1, newline = -1, assistant = -1;  // ChatML's tokens (-1: absent)
    int32_t think_end = -1;  // "</think>": where a thinking answer's content begins

    // Where a chat prompt's messages end (after each "<|im_end|>\n") and where the assistant's
    // turn begins (after the last "<|im_start|>assistant\n", before the generation prompt's
    // thinking block): the points a later request shares with this one (the same system prompt;
    // the next turn, whose history renders this turn's answer without that block). The engine
    // ends prompt pieces there and, with the prefix cache on, keeps checkpoints.
    std::vector<int> message_ends(const std::vector<int32_t>& ids) const {
        std::vector<int> at;
        if (im_end < 0 || newline < 0) return at;
        for (size_t i = 0; i + 1 < ids.size(); ++i)
            if (ids[i] == im_end && ids[i + 1] == newline && i + 2 < ids.size()) at.push_back(int(i + 2));
        for (size_t i = ids.size(); i-- > 0;)
            if (ids[i] == im_start) {
                if (i + 3 < ids.size() && ids[i + 1] == assistant && ids[i + 2] == newline &&
                    (at.empty() || at.back() < int(i + 3)))
                    at.push_back(int(i + 3));
                break;
            }
        return at;
    }

    // The prompt's token ids; RequestError when it cannot be run.
    std::vector<int32_t> tokenize(const CompletionRequest& r) const {
        if (r.json_object && r.chat && r.enable_thinking && think_end < 0)
            throw RequestError("response_format", "response_format json_object with thinking needs a \"</think>\" token, which "
                                                  "this model's vocabulary lacks: set chat_template_kwargs.enable_thinking false");
        std::string text;
        try {
            std::vector<std::string> tools;
            for (const ToolSpec& t : r.tools) tools.push_back(t.json_text);
            text = r.chat ? engine.chat_prompt(r.messages, /*add_generation_prompt=*/true, r.enable_thinking, tools)
                          : r.prompt;
        } catch (const Error& e) {
            throw RequestError("messages", e.what());
        }
        std::vector<int32_t> ids = engine.tokenize(text, /*parse_special=*/true);
        const char* what = r.chat ? "messages" : "prompt";
        if (ids.empty()) throw RequestError(what, std::string(what) + " is empty after tokenization");
        if (int64_t(ids.size()) >= n_ctx)
            throw RequestError(what, std::string(what) + " is " + std::to_string(ids.size()) +
                                         " tokens, the context holds " + std::to_string(n_ctx));
        if (r.max_tokens && int64_t(ids.size()) + *r.max_tokens > n_ctx)
            throw RequestError(r.chat ? "max_completion_tokens" : "max_tokens",
                               std::to_string(ids.size()) + " prompt tokens + " + std::to_string(*r.max_tokens) +
                                   " tokens to generate exceed the context of " + std::to_string(n_ctx));
        return ids;
    }

    // OpenAI's tool_calls array (stream: with the index of each call in the delta).
    static json tool_calls_json(const std::string& id, const std::vector<ToolCall>& calls, bool stream) {
        json out = json::array();
        for (size_t i = 0; i < calls.size(); ++i) {
            json c = {{"id", "call_" + id + "_" + std::to_string(i)},
                      {"type", "function"},
                      {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments.dump()}}}};
            if (stream) c["index"] = int(i);
            out.push_back(std::move(c));
        }
        return out;
    }

    // Chat answers with thinking on split their reasoning out (--reasoning-format deepseek).
    bool splits_reasoning(const CompletionRequest& r) const {
        return r.chat && r.enable_thinking && opt.reasoning_format != "none";
    }

    GenerationRequest params(const CompletionRequest& r, std::vector<int32_t> ids) const {
        GenerationRequest gp;
        gp.max_tokens = r.max_tokens ? *r.max_tokens : int(n_ctx - int64_t(ids.size()));
        gp.prompt = std::move(ids);
        gp.sampling = r.sampler;
        gp.stop = r.stop;
        gp.logprobs = r.logprobs;
        if (r.json_object) {
            gp.format = GenerationRequest::Format::JsonObject;
            // With thinking on the answer opens a think block: the reasoning stays free text and
            // the JSON is the content after "</think>" (as vLLM's structured output with a
            // reasoning parser). The template's generation prompt opens it (chat_template.cpp).
            if (r.chat && r.enable_thinking) gp.format_after = think_end;
        }
        return gp;
    }

    // OpenAI's logprobs object for tokens [from, to) of `lp`: chat {"content": [{token, logprob,
    // bytes, top_logprobs}]}; completions the legacy {tokens, token_logprobs, top_logprobs,
    // text_offset} (text_offset counts bytes from the completion's start, `offset` the bytes
    // before `from`). A token's text is its bytes (invalid UTF-8 replaced when sent; bytes exact).
    json logprobs_json(const CompletionRequest& r, const std::vector<TokenLogprob>& lp, size_t from, size_t to,
                       size_t offset = 0) const {
        auto bytes = [](const std::string& s) {
            json b = json::array();
            for (unsigned char c : s) b.push_back(int(c));
            return b;
        };
        if (r.chat) {
            json content = json::array();
            for (size_t i = from; i < to; ++i) {
                const std::string t = engine.token_bytes(lp[i].id);
                json top = json::array();
                for (const auto& [id, l] : lp[i].top) {
                    const std::string a = engine.token_bytes(id);
                    top.push_back({{"token", a}, {"logprob", l}, {"bytes", bytes(a)}});
                }
                content.push_back({{"token", t}, {"logprob", lp[i].logprob}, {"bytes", bytes(t)}, {"top_logprobs", top}});
            }
            return {{"content", content}};
        }
        json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
        for (size_t i = from; i < to; ++i) {
            const std::string t = engine.token_bytes(lp[i].id);
            tokens.push_back(t);
            lps.push_back(lp[i].logprob);
            json top = json::object();
            for (const auto& [id, l] : lp[i].top) top[engine.token_bytes(id)] = l;
            tops.push_back(top);
            offsets.push_back(offset);
            offset += t.size();
        }
        return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
    }

    // The usage of n choices of one prompt: the prompt counts once (the first choice's, with its
    // cache hit), completion tokens are summed over the choices, as OpenAI's.
    static json usage(const std::vector<const GenerationResult*>& gs) {
        int n = 0;
        for (const GenerationResult* g : gs) n += int(g->ids.size());
        const GenerationResult& g = *gs.front();
        // prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache resumed (OpenAI's field).
        return {{"prompt_tokens", g.n_prompt},
                {"completion_tokens", n},
                {"total_tokens", g.n_prompt + n},
                {"prompt_tokens_details", {{"cached_tokens", g.n_cached}}}};
    }
    static json usage(const GenerationResult& g) { return usage(std::vector<const GenerationResult*>{&g}); }

    // The response object (or, with `delta`, one stream chunk) of either endpoint.
    // A chat stream names the role in its first chunk only, as OpenAI's does (first_chunk).
    // With the reasoning split on, `reasoning` goes to reasoning_content (the message's, or the
    // chunk's delta: a chunk carries one of the two).
    json choice_object(const CompletionRequest& r, const std::string& id, const std::string& text,
                       const json& finish_reason, bool chunk, bool first_chunk = false,
                       const std::string* reasoning = nullptr) const {
        json choice = {{"index", 0}, {"finish_reason", finish_reason}};
        if (!r.chat) {
            choice["text"] = text;
            choice["logprobs"] = nullptr;
        } else if (chunk) {
            choice["delta"] = !finish_reason.is_null() ? json::object()
                              : reasoning               ? json{{"reasoning_content", *reasoning}}
                                                        : json{{"content", text}};
            if (first_chunk) choice["delta"]["role"] = "assistant";
        } else {
            choice["message"] = {{"role", "assistant"}, {"content", text}};
            if (reasoning) choice["message"]["reasoning_content"] = *reasoning;
            if (!r.tools.empty()) {  // calls parsed out of the content
                ParsedAnswer a = parse_tool_calls(text, r.tools);
                if (!a.calls.empty()) {
                    choice["message"]["content"] = a.content.empty() ? json(nullptr) : json(a.content);
                    choice["message"]["tool_calls"] = tool_calls_json(id, a.calls, false);
                    if (finish_reason == "stop") choice["finish_reason"] = "tool_calls";
                }
            }
        }
        return {{"id", id},
                {"object", r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
                {"created", unix_time()},
                {"model", opt.model_name},
                {"choices", json::array({choice})}};
    }

    void complete(const httplib::Request& req, httplib::Response& res, bool chat) {
        auto flight = std::make_shared<Flight>(*this);  // before the check: shutdown() waits for it
        if (draining) {
            res.set_header("Connection", "close");
            return send_error(res, 503, "the server is shutting down", "server_shutting_down");
        }
        CompletionRequest r;
        std::vector<int32_t> ids;
        try {
            r = parse_completion_request(req.body, chat);
            ids = tokenize(r);
        } catch (const RequestError& e) {
            return send_error(res, 400, e.what(), "invalid_request_error", e.param);
        } catch (const Error& e) {
            return send_error(res, 500, e.what(), "server_error");
        }
        // Back-pressure: a bounded queue instead of unbounded memory.
        if (const EngineStats st = engine.stats(); st.active >= engine.options().n_parallel && st.queued >= opt.max_queued) {
            ++rejected_busy;
            res.set_header("Retry-After", "1");
            return send_error(res, 503, "the server is busy: " + std::to_string(opt.max_queued) +
                                            " requests are waiting for a slot; retry later", "server_busy");
        }
        const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
        {
            std::lock_guard<std::mutex> lock(flight->mu);
            flight->response_id = id;
        }
        GenerationRequest gp = params(r, std::move(ids));
        if (chat) gp.checkpoint_at = message_ends(gp.prompt);
        if (!r.stream) {
            try {
                // n choices: n generations of the prompt at once (choice i with seed + i), so
                // they batch like n requests; the prompt counts once in usage, as OpenAI's.
                std::vector<std::future<GenerationResult>> runs;
                for (int i = 0; i < r.n; ++i) {
                    GenerationRequest gi = gp;
                    gi.sampling.seed = gp.sampling.seed + uint64_t(i);
                    auto done = std::make_shared<std::promise<GenerationResult>>();
                    runs.push_back(done->get_future());
                    GenerationCallbacks cb;
                    cb.on_done = [done](const GenerationResult& g) { done->set_value(g); };
                    flight->add(engine.submit(std::move(gi), std::move(cb)));
                }
                json body, choices = json::array();
                std::vector<GenerationResult> results;
                for (int i = 0; i < r.n; ++i) {
                    results.push_back(runs[size_t(i)].get());
                    const GenerationResult& g = results.back();
                    if (g.finish_reason == "error") throw Error("engine: " + g.error);
                    json b;
                    if (splits_reasoning(r)) {
                        ReasoningSplitter sp(true);
                        ReasoningSplitter::Pieces a = sp.push(g.text), c = sp.flush();
                        const std::string reasoning = a.reasoning + c.reasoning;
                        b = choice_object(r, id, a.content + c.content, g.finish_reason, false, false, &reasoning);
                    } else {
                        b = choice_object(r, id, g.text, g.finish_reason, false);
                    }
                    json choice = b["choices"][0];
                    choice["index"] = i;
                    if (r.logprobs >= 0) choice["logprobs"] = logprobs_json(r, g.logprobs, 0, g.logprobs.size());
                    choices.push_back(std::move(choice));
                    if (i == 0) body = std::move(b);
                }
                std::vector<const GenerationResult*> all;
                for (const GenerationResult& g : results) all.push_back(&g);
                body["choices"] = std::move(choices);
                body["usage"] = usage(all);
                res.set_content(dump(body), "application/json");
            } catch (const std::exception& e) {
                send_error(res, 500, e.what(), "server_error");
            }
            return;
        }
        // Server-sent events: per choice, one chunk per piece of text as it becomes final (its
        // `index` set; with n > 1 the choices interleave), then its finish_reason chunk; with
        // stream_options.include_usage a last chunk with no choices and the whole usage (OpenAI's
        // stream); then [DONE]. A single choice's finish chunk also carries its usage, as
        // llama-server's does. The engine's thread hands the pieces over through a channel; a
        // client that goes away cancels every choice.
        auto ch = std::make_shared<StreamChannel>(r.n);
        std::vector<uint64_t> request_ids;
        try {
            for (int i = 0; i < r.n; ++i) {
                GenerationRequest gi = gp;
                gi.sampling.seed = gp.sampling.seed + uint64_t(i);  // choice i: seed + i, as without stream
                GenerationCallbacks cb;
                cb.on_text = [ch, i](const std::string& text) {
                    std::lock_guard<std::mutex> lock(ch->mu);
                    ch->events.push_back({i, false, text});
                    ch->cv.notify_all();
                    return !ch->client_gone;
                };
                if (r.logprobs >= 0)
                    cb.on_logprob = [ch, i](const TokenLogprob& t) {
                        std::lock_guard<std::mutex> lock(ch->mu);
                        ch->choices[size_t(i)].logprobs.push_back(t);
                    };
                cb.on_done = [ch, i](const GenerationResult& g) {
                    std::lock_guard<std::mutex> lock(ch->mu);
                    ch->choices[size_t(i)].result = g;
                    ch->events.push_back({i, true, {}});
                    ch->cv.notify_all();
                };
                request_ids.push_back(engine.submit(std::move(gi), std::move(cb)));
                flight->add(request_ids.back());
            }
        } catch (const Error& e) {
            for (uint64_t q : request_ids) engine.cancel(q);  // the choices already running
            return send_error(res, 400, e.what(), "invalid_request_error");
        }
        res.set_chunked_content_provider("text/event-stream", [this, r, id, ch, request_ids, flight](size_t, httplib::DataSink& sink) {
            // A choice's own state in the stream.
            struct ChoiceStream {
                bool first = true;                   // its role goes in its first chunk
                size_t lp_sent = 0, lp_bytes = 0;    // logprobs sent so far, and their text's bytes
                std::optional<ReasoningSplitter> split;
                std::optional<ToolCallStream> calls;  // with tools: content from "<tool_call>" on, held
            };
            std::vector<ChoiceStream> cs(size_t(r.n));
            for (ChoiceStream& c : cs) {
                if (splits_reasoning(r)) c.split.emplace(true);
                if (!r.tools.empty()) c.calls.emplace();
            }
            bool ok = true;  // false: the client left or a choice failed; nothing more is sent
            auto stop_all = [&] {
                ok = false;
                {
                    std::lock_guard<std::mutex> l2(ch->mu);
                    ch->client_gone = true;
                }
                for (uint64_t q : request_ids) engine.cancel(q);
            };
            auto write = [&](const std::string& line) {
                if (ok && !sink.write(line.data(), line.size())) stop_all();
                return ok;
            };
            // One chunk of choice i. Each carries the logprobs of the choice's tokens sampled since
            // its chunk before (the text of a token can come later, held back by a stop string's or
            // a tool call's check; the last chunk carries the rest).
            auto send = [&](json j, int i) {
                if (!ok) return false;
                ChoiceStream& c = cs[size_t(i)];
                j["choices"][0]["index"] = i;
                if (r.logprobs >= 0) {
                    std::vector<TokenLogprob> lp;
                    {
                        std::lock_guard<std::mutex> l2(ch->mu);
                        const std::vector<TokenLogprob>& all = ch->choices[size_t(i)].logprobs;
                        lp.assign(all.begin() + std::ptrdiff_t(c.lp_sent), all.end());
                    }
                    j["choices"][0]["logprobs"] = logprobs_json(r, lp, 0, lp.size(), c.lp_bytes);
                    for (const TokenLogprob& t : lp) c.lp_bytes += engine.token_bytes(t.id).size();
                    c.lp_sent += lp.size();
                }
                return write("data: " + dump(j) + "\n\n");
            };
            // One text piece of choice i as its chunks: reasoning_content and/or content deltas.
            auto send_text = [&](int i, const std::string& text, bool end) {
                ChoiceStream& c = cs[size_t(i)];
                ReasoningSplitter::Pieces p;
                if (c.split) p = end ? c.split->flush() : c.split->push(text);
                else p.content = text;
                if (c.calls) p.content = c.calls->push(p.content) + (end ? c.calls->flush_text() : "");
                if (!p.reasoning.empty())
                    send(choice_object(r, id, "", nullptr, true, std::exchange(c.first, false), &p.reasoning), i);
                if (!p.content.empty() || (!end && !c.split))
                    send(choice_object(r, id, p.content, nullptr, true, std::exchange(c.first, false)), i);
            };
            // Choice i is done: the rest of its text, its tool calls, its finish_reason chunk.
            auto finish = [&](int i, const GenerationResult& g) {
                ChoiceStream& c = cs[size_t(i)];
                if (c.split || c.calls) send_text(i, "", true);
                bool called = false;
                if (c.calls && c.calls->in_call() && ok) {
                    ParsedAnswer a = parse_tool_calls(c.calls->call_text(), r.tools);
                    if (a.calls.empty()) {  // malformed: the text as it came
                        send(choice_object(r, id, c.calls->call_text(), nullptr, true, std::exchange(c.first, false)), i);
                    } else {
                        const bool was_first = std::exchange(c.first, false);
                        json chunk = choice_object(r, id, "", nullptr, true, was_first);
                        // Call ids unique across the choices.
                        json delta = {{"tool_calls", tool_calls_json(i == 0 ? id : id + "-" + std::to_string(i), a.calls, true)}};
                        if (was_first) delta["role"] = "assistant";
                        chunk["choices"][0]["delta"] = std::move(delta);
                        send(chunk, i);
                        called = true;
                    }
                }
                if (!ok) return;
                if (g.finish_reason == "error") {  // the stream ends here, without [DONE]
                    write("data: " + dump(error_body(g.error, "server_error", "")) + "\n\n");
                    stop_all();
                    return;
                }
                json last = choice_object(r, id, "", called && g.finish_reason == "stop" ? "tool_calls" : g.finish_reason, true);
                if (r.n == 1) last["usage"] = usage(g);
                send(last, i);
            };
            // Until every choice is done (after a stop_all too: cancelled choices end at once).
            for (int running = r.n; running > 0;) {
                std::unique_lock<std::mutex> lock(ch->mu);
                // While nothing comes (queued for a slot, a long prompt), an SSE comment every
                // kPing: a client that left is only seen by a failing write, and one that left
                // while queued would otherwise hold its place in the queue until it got a slot
                // (enough of them fill the queue: 503s for clients still there). Clients skip
                // comment lines (the SSE format).
                if (!ch->cv.wait_for(lock, kPing, [&] { return !ch->events.empty(); })) {
                    lock.unlock();
                    write(": ping\n\n");
                    continue;
                }
                StreamChannel::Event e = std::move(ch->events.front());
                ch->events.pop_front();
                const GenerationResult* g = e.done ? &ch->choices[size_t(e.choice)].result : nullptr;
                lock.unlock();  // a choice's result is written once, before its done event
                if (e.done) {
                    --running;
                    if (ok) finish(e.choice, *g);
                } else if (ok) {
                    send_text(e.choice, e.text, false);
                }
            }
            if (ok && r.include_usage) {
                std::vector<const GenerationResult*> all;
                for (const StreamChannel::Choice& c : ch->choices) all.push_back(&c.result);
                json u = choice_object(r, id, "", nullptr, true);
                u["choices"] = json::array();
                u["usage"] = usage(all);
                write("data: " + dump(u) + "\n\n");
            }
            write("data: [DONE]\n\n");
            sink.done();
            return true;
        }, [this, ch, request_ids](bool success) {
            // The connection ended (or the client left before the first byte): stop the work.
            if (!success) {
                {
                    std::lock_guard<std::mutex> lock(ch->mu);
                    ch->client_gone = true;
                }
                for (uint64_t q : request_ids) engine.cancel(q);
            }
        });
    }

    // Prometheus text format (version 0.0.4): the engine's counters and the server's.
    std::string metrics() const {
        const EngineStats st = engine.stats();
        std::ostringstream o;
        auto metric = [&](const char* name, const char* type, const char* help, double v, const char* labels = "") {
            o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n' << name << labels << ' ' << v << '\n';
        };
        metric("alloy_requests_finished_total", "counter", "Generation requests finished (any reason).", double(st.finished));
        metric("alloy_prompt_tokens_total", "counter", "Prompt tokens run through the model (cache hits excluded).",
               double(st.prompt_tokens));
        metric("alloy_generated_tokens_total", "counter", "Tokens generated.", double(st.generated_tokens));
        metric("alloy_prompt_seconds_total", "counter", "Seconds from a request's start to its first token, summed.",
               st.prompt_seconds);
        metric("alloy_generate_seconds_total", "counter", "Seconds of generation after the first token, summed.",
               st.generate_seconds);
        metric("alloy_prefill_tokens_per_second", "gauge", "Prompt tokens per prompt second, over finished requests.",
               st.prompt_seconds > 0 ? double(st.prompt_tokens) / st.prompt_seconds : 0.0);
        metric("alloy_decode_tokens_per_second", "gauge", "Generated tokens per generation second, over finished requests.",
               st.generate_seconds > 0 ? double(st.generated_tokens) / st.generate_seconds : 0.0);
        metric("alloy_requests_active", "gauge", "Requests holding a slot now.", double(st.active));
        metric("alloy_requests_queued", "gauge", "Requests waiting for a slot now.", double(st.queued));
        metric("alloy_slots_total", "gauge", "State slots (--parallel).", double(engine.options().n_parallel));
        metric("alloy_steps_total", "counter", "Forward steps run.", double(st.steps));
        metric("alloy_prefix_cache_hits_total", "counter", "Requests resumed from the prefix cache.", double(st.cache_hits));
        metric("alloy_prefix_cache_tokens_saved_total", "counter", "Prompt tokens the prefix cache spared.",
               double(st.cached_tokens));
        metric("alloy_prefix_cache_bytes", "gauge", "Bytes the prefix cache holds.", double(st.cache_bytes));
        metric("alloy_prefix_cache_checkpoints", "gauge", "Checkpoints the prefix cache holds.", double(st.cache_checkpoints));
        metric("alloy_spec_drafted_tokens_total", "counter", "Speculative drafts verified (--spec).", double(st.drafted_tokens));
        metric("alloy_spec_accepted_tokens_total", "counter", "Speculative drafts the verification kept (--spec).",
               double(st.accepted_tokens));
        o << "# HELP alloy_http_responses_total HTTP responses by status class.\n# TYPE alloy_http_responses_total counter\n";
        o << "alloy_http_responses_total{class=\"2xx\"} " << responses_2xx << '\n';
        o << "alloy_http_responses_total{class=\"4xx\"} " << responses_4xx << '\n';
        o << "alloy_http_responses_total{class=\"5xx\"} " << responses_5xx << '\n';
        metric("alloy_http_rejected_busy_total", "counter", "Requests answered 503 because the queue was full.",
               double(rejected_busy));
        metric("alloy_http_unauthorized_total", "counter", "Requests answered 401 (API key).", double(unauthorized));
        return o.str();
    }

    // GET /slots: every engine slot (llama-server's /slots, in this server's terms): its state, the
    // response id and choice of the request holding it (the id the client sees), the tokens in its
    // context, the prompt's progress and the tokens generated; and the queue depth.
    json slots_json() {
        const EngineSlots v = engine.slots();
        std::map<uint64_t, std::pair<std::string, int>> owner;  // engine request -> (response id, choice)
        {
            std::lock_guard<std::mutex> lock(flights_mu);
            for (Flight* f : flights) {
                std::lock_guard<std::mutex> l2(f->mu);
                for (size_t i = 0; i < f->ids.size(); ++i) owner[f->ids[i]] = {f->response_id, int(i)};
            }
        }
        json out = json::array();
        for (const SlotInfo& s : v.slots) {
            json o = {{"id", s.id}, {"state", s.state}, {"request_id", nullptr}, {"choice", nullptr}, {"task_id", nullptr},
                      {"n_past", s.n_past}, {"prompt", nullptr}, {"n_generated", s.n_generated}};
            if (s.request != 0) {
                o["task_id"] = s.request;
                // Absent for a moment: the engine admits a request before its submit() returns
                // to the handler that records it.
                if (auto it = owner.find(s.request); it != owner.end()) {
                    o["request_id"] = it->second.first;
                    o["choice"] = it->second.second;
                }
                o["prompt"] = {{"done", s.n_prompt_done}, {"total", s.n_prompt}, {"cached", s.n_cached}};
            }
            out.push_back(std::move(o));
        }
        return {{"object", "slots"}, {"n_parallel", int(v.slots.size())}, {"queue_depth", v.queued}, {"slots", out}};
    }

    void routes() {
        http.set_payload_max_length(opt.max_body_bytes);
        // CORS for browser clients: any origin; preflights answered here.
        http.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
        http.Options(R"(.*)", [](const httplib::Request&, httplib::Response& res) {
            res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
            res.status = 204;
        });
        // --api-key: Bearer token on everything but /health, the chat page (it holds nothing; its
        // API calls send the key typed into it) and preflights (OpenAI's 401 shape).
        http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
            if (opt.api_key.empty() || req.path == "/health" || req.path == "/" || req.method == "OPTIONS")
                return httplib::Server::HandlerResponse::Unhandled;
            if (req.get_header_value("Authorization") == "Bearer " + opt.api_key)
                return httplib::Server::HandlerResponse::Unhandled;
            ++unauthorized;
            res.status = 401;
            res.set_content(dump({{"error", {{"message", "Incorrect or missing API key: send \"Authorization: Bearer <key>\""},
                                             {"type", "invalid_request_error"},
                                             {"param", nullptr},
                                             {"code", "invalid_api_key"}}}}),
                            "application/json");
            return httplib::Server::HandlerResponse::Handled;
        });
        http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
            (res.status >= 500 ? responses_5xx : res.status >= 400 ? responses_4xx : responses_2xx)++;
        });
        http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(metrics(), "text/plain; version=0.0.4");
        });
        http.new_task_queue = [n = http_threads(engine)] { return new httplib::ThreadPool(size_t(n)); };
        // cpp-httplib listens with a backlog of 5: a burst of clients (16 at once) overflows it
        // and some connections die unanswered. Keep its socket options and remember the socket.
        http.set_socket_options([this](socket_t sock) {
            httplib::default_socket_options(sock);
            listen_fd = int(sock);
        });
        // The chat page (server/web/index.html). Its policy allows this origin only: the page
        // fetches nothing from elsewhere, and a browser enforces that it cannot.
        http.Get("/", [](const httplib::Request&, httplib::Response& res) {
            res.set_header("Content-Security-Policy",
                           "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
                           "connect-src 'self'; img-src 'self' data:");
            res.set_header("Cache-Control", "no-cache");
            res.set_content(reinterpret_cast<const char*>(kChatPage), kChatPage_size, "text/html; charset=utf-8");
        });
        http.Get("/slots", [this](const httplib::Request&, httplib::Response& res) {
            res.set_content(dump(slots_json()), "application/json");
        });
        http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
            res.set_content(R"({"status":"ok"})", "application/json");
        });
        http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
            const json body = {{"object", "list"},
                               {"data", json::array({{{"id", opt.model_name}, {"object", "model"}, {"created", unix_time()},
                                                      {"owned_by", "alloy"}, {"max_model_len", n_ctx}}})}};
            res.set_content(dump(body), "application/json");
        });
        http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) { complete(q, s, false); });
        http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { complete(q, s, true); });
        // Unknown paths and oversized bodies get a JSON error too (handlers that set a body keep it).
        http.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
            if (!res.body.empty()) return;
            if (res.status == 404)
                send_error(res, 404, "no endpoint " + req.method + " " + req.path, "not_found_error");
            else if (res.status == 413)
                send_error(res, 413, "the request body is larger than the server accepts", "invalid_request_error");
            else
                send_error(res, res.status, "HTTP error " + std::to_string(res.status), "invalid_request_error");
        });
    }
};

Server::Server(Engine& engine, ServerOptions opt) : impl_(std::make_unique<Impl>(engine, std::move(opt))) {
    if (!engine.has_tokenizer()) throw Error("serve: the model " + engine.options().model_path + " has no tokenizer");
    if (impl_->opt.model_name.empty()) impl_->opt.model_name = "alloy";
    impl_->routes();
}

Server::~Server() = default;

int Server::bind() {
    const ServerOptions& o = impl_->opt;
    const int port = o.port == 0 ? impl_->http.bind_to_any_port(o.host) : (impl_->http.bind_to_port(o.host, o.port) ? o.port : -1);
    if (port < 0) throw Error("serve: cannot listen on " + o.host + ":" + std::to_string(o.port) + " (in use, or not an address here)");
    if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);  // a second listen() sets the backlog
    return port;
}

void Server::listen() { impl_->http.listen_after_bind(); }

void Server::stop() {
    // After shutdown() the listener is closed already and listen() returns on its own; a second
    // stop would close that socket number again.
    if (!impl_->draining) impl_->http.stop();
}

int Server::in_flight() const {
    std::lock_guard<std::mutex> lock(impl_->flights_mu);
    return int(impl_->flights.size());
}

int Server::shutdown(double timeout_s) {
    Impl& s = *impl_;
    if (s.draining.exchange(true)) return 0;
    // Stop accepting: shut the listening socket down, not httplib's stop(). Its accept loop then
    // ends (and closes the socket), while its "shutting down" flag stays off: that flag ends a
    // stream whose provider has not started yet without its last chunk. Accepted connections are
    // served to their end (a new request on one of them gets 503).
    if (s.listen_fd >= 0) ::shutdown(s.listen_fd, SHUT_RDWR);
    std::unique_lock<std::mutex> lock(s.flights_mu);
    auto idle = [&] { return s.flights.empty(); };
    if (s.flights_cv.wait_for(lock, std::chrono::duration<double>(timeout_s), idle)) return 0;
    lock.unlock();
    const int cancelled = s.cancel_flights();  // their streams end with finish_reason "cancelled"
    lock.lock();
    // A cancelled request leaves at the engine's next step; its response is then written (a
    // client that reads nothing is cut off by the write timeout).
    s.flights_cv.wait_for(lock, std::chrono::seconds(30), idle);
    return cancelled;
}

void Server::cancel_in_flight() { impl_->cancel_flights(); }

}  // namespace alloy::server
