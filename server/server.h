// `alloy serve`: an OpenAI-compatible HTTP server over one loaded model, as llama.cpp's
// llama-server and vLLM offer it:
//   GET  /health                 {"status": "ok"}
//   GET  /v1/models              the one model
//   POST /v1/completions         {"prompt": ...} -> text_completion (or SSE chunks with "stream": true)
//   POST /v1/chat/completions    {"messages": [...]} -> chat.completion (or chat.completion.chunk SSE)
// Requests run one at a time (the engine holds one sequence state); each starts from an empty
// context. Errors are JSON {"error": {"message", "type", "param", "code"}}: 400 for a request
// that cannot be served as sent (naming the field), 404 for an unknown path, 413 for a body
// over the limit, 500 for a failure of the engine.
#pragma once
#include <memory>
#include <string>

#include "model/qwen35.h"
#include "runtime/loaded_model.h"

namespace alloy::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;                 // 0: any free port (bind() returns it)
    int n_ctx = 4096;                // per request: prompt + generated tokens
    KvCacheTypes kv;
    ForwardOptions forward;
    std::string model_name;          // reported by /v1/models and in responses
    size_t max_body_bytes = 8u << 20;
};

class Server {
public:
    Server(const LoadedModel& model, ServerOptions opt);
    ~Server();
    int bind();    // binds host:port; returns the port; throws alloy::Error naming host:port
    void listen(); // serves until stop(); call after bind()
    void stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace alloy::server
