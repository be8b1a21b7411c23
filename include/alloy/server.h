// Public API of `alloy serve` (implemented in server/): an OpenAI-compatible HTTP server over
// one Engine, as llama.cpp's llama-server and vLLM offer it:
//   GET  /health                 {"status": "ok"}
//   GET  /v1/models              the one model
//   GET  /slots                  each engine slot's state and request, and the queue depth
//   POST /v1/completions         {"prompt": ...} -> text_completion (or SSE chunks with "stream": true)
//   POST /v1/chat/completions    {"messages": [...]} -> chat.completion (or chat.completion.chunk SSE)
// Requests run on the Engine (include/alloy/engine.h): up to its n_parallel at once, batched
// step by step; more wait in its queue. Each starts from an empty context. Errors are JSON {"error": {"message", "type", "param", "code"}}: 400 for a request
// that cannot be served as sent (naming the field), 404 for an unknown path, 413 for a body
// over the limit, 500 for a failure of the engine.
#pragma once
#include <memory>
#include <string>

#include "alloy/engine.h"

namespace alloy::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                 // 0: any free port (bind() returns it)
    std::string model_name;          // reported by /v1/models and in responses
    size_t max_body_bytes = 8u << 20;
    std::string api_key;             // non-empty: every endpoint but /health needs "Authorization: Bearer <key>"
    int max_queued = 64;             // requests waiting for a slot beyond this get 503 + Retry-After
    // "deepseek": a chat answer's reasoning (before "</think>", thinking on) goes to
    // reasoning_content, streamed as its own deltas; "none": left in content as generated.
    std::string reasoning_format = "deepseek";
};

class Server {
public:
    // The engine must outlive the server; its n_ctx bounds each request.
    Server(Engine& engine, ServerOptions opt);
    ~Server();
    int bind();    // binds host:port; returns the port; throws alloy::Error naming host:port
    void listen(); // serves until stop() or shutdown(); call after bind()
    void stop();   // at once: the listener closes, streams not yet begun end unfinished
    // Graceful stop (SIGTERM): accepts no new connection, lets the requests in flight finish
    // (a request arriving on an open connection gets 503), and after timeout_s seconds cancels
    // those still running (their streams end well-formed, finish_reason "cancelled"). Returns,
    // with the number of requests it cancelled, once none is in flight; listen() returns when
    // the connection threads are done. Call from a thread other than listen()'s.
    int shutdown(double timeout_s);
    void cancel_in_flight();  // cancels every request in flight now (a second signal)
    int in_flight() const;    // completion requests whose response is not yet written

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace alloy::server
