// Request bodies of `alloy serve`'s OpenAI-compatible endpoints (/v1/completions,
// /v1/chat/completions), parsed and validated in one place. Fields follow the OpenAI API
// (max_tokens, temperature, top_p, stop, stream, seed) plus the extensions llama.cpp's server
// and vLLM accept (top_k, min_p, chat_template_kwargs.enable_thinking); unknown fields are
// ignored, as those servers do. Every error names the field.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "alloy/engine.h"
#include "alloy/error.h"
#include "server/tool_calls.h"

namespace alloy::server {

// A request that cannot be served as sent: HTTP 400, OpenAI's invalid_request_error with
// `param` set to the offending field ("" for the body itself).
struct RequestError : Error {
    std::string param;
    RequestError(std::string param_, const std::string& message) : Error(message), param(std::move(param_)) {}
};

struct CompletionRequest {
    bool chat = false;
    std::string model;                  // echoed back (the server runs its one model whatever it says)
    std::string prompt;                 // /v1/completions
    std::vector<ChatTurn> messages;     // /v1/chat/completions
    bool enable_thinking = true;        // chat_template_kwargs.enable_thinking
    std::optional<int> max_tokens;      // absent: up to the end of the context
    SamplingOptions sampler;            // llama.cpp server defaults unless given
    std::vector<std::string> stop;
    bool stream = false;
    bool include_usage = false;         // stream_options.include_usage (stream only)
    std::vector<ToolSpec> tools;        // chat: the request's tools (empty: none)
    // -1: no logprobs; else each token's and this many alternatives (chat: logprobs = true with
    // top_logprobs; completions: the integer logprobs).
    int logprobs = -1;
    int n = 1;                          // choices (each its own generation; seed + i for choice i)
    // response_format {"type": "json_object"}: the answer is one JSON object (grammar-constrained
    // sampling, GenerationRequest::format); "text" (the default) leaves it free. json_schema is
    // refused by name (no schema-constrained sampling yet).
    bool json_object = false;
};

// body: the raw request body; chat: which endpoint. Throws RequestError.
CompletionRequest parse_completion_request(const std::string& body, bool chat);

}  // namespace alloy::server
