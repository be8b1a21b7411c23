// parse_completion_request: the fields of both endpoints, their defaults, and an error naming
// the field for every kind of bad value.
#include <gtest/gtest.h>

#include <string>

#include "server/request.h"

namespace alloy::server {
namespace {

CompletionRequest parse(const std::string& body, bool chat = false) { return parse_completion_request(body, chat); }

// The RequestError of `body`: its param must be `param` and its message must contain `needle`.
void expect_error(const std::string& body, bool chat, const std::string& param, const std::string& needle) {
    try {
        parse(body, chat);
        ADD_FAILURE() << "accepted: " << body;
    } catch (const RequestError& e) {
        EXPECT_EQ(e.param, param) << body << " -> " << e.what();
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << body << " -> " << e.what();
    }
}

TEST(Request, CompletionFieldsAndDefaults) {
    const CompletionRequest d = parse(R"({"prompt": "hi"})");
    EXPECT_EQ(d.prompt, "hi");
    EXPECT_FALSE(d.chat);
    EXPECT_FALSE(d.max_tokens.has_value());
    EXPECT_FLOAT_EQ(d.sampler.temperature, SamplingOptions{}.temperature);  // llama.cpp server defaults
    EXPECT_EQ(d.sampler.top_k, SamplingOptions{}.top_k);
    EXPECT_FALSE(d.stream);
    const CompletionRequest r = parse(R"({"model": "m", "prompt": ["x y"], "max_tokens": 7, "temperature": 0,
        "top_p": 0.5, "top_k": 3, "min_p": 0.1, "seed": 9, "stop": ["a", "bc"], "stream": true, "n": 1,
        "frequency_penalty": 0, "user": "ignored"})");
    EXPECT_EQ(r.model, "m");
    EXPECT_EQ(r.prompt, "x y");
    EXPECT_EQ(*r.max_tokens, 7);
    EXPECT_EQ(r.sampler.temperature, 0.0f);
    EXPECT_FLOAT_EQ(r.sampler.top_p, 0.5f);
    EXPECT_EQ(r.sampler.top_k, 3);
    EXPECT_FLOAT_EQ(r.sampler.min_p, 0.1f);
    EXPECT_EQ(r.sampler.seed, 9u);
    EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "bc"}));
    EXPECT_TRUE(r.stream);
    EXPECT_FALSE(r.include_usage);
    EXPECT_TRUE(parse(R"({"prompt": "p", "stream": true, "stream_options": {"include_usage": true}})").include_usage);
    EXPECT_FALSE(parse(R"({"prompt": "p", "stream": true, "stream_options": {}})").include_usage);
    EXPECT_EQ(parse(R"({"prompt": "p", "stop": "z", "max_tokens": null})").stop, std::vector<std::string>{"z"});
}

// logprobs: off unless asked; chat's boolean + top_logprobs, completions' integer.
TEST(Request, Logprobs) {
    const std::string m = R"("messages": [{"role": "user", "content": "x"}])";
    EXPECT_EQ(parse(R"({"prompt": "p"})").logprobs, -1);
    EXPECT_EQ(parse(R"({"prompt": "p", "logprobs": 5})").logprobs, 5);
    EXPECT_EQ(parse(R"({"prompt": "p", "logprobs": null})").logprobs, -1);
    EXPECT_EQ(parse("{" + m + "}", true).logprobs, -1);
    EXPECT_EQ(parse("{" + m + R"(, "logprobs": false})", true).logprobs, -1);
    EXPECT_EQ(parse("{" + m + R"(, "logprobs": true})", true).logprobs, 0);
    EXPECT_EQ(parse("{" + m + R"(, "logprobs": true, "top_logprobs": 20})", true).logprobs, 20);
}

TEST(Request, ChatMessagesAndThinking) {
    const CompletionRequest r = parse(R"({"messages": [{"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "reasoning_content": "hmm"}],
        "max_completion_tokens": 5, "chat_template_kwargs": {"enable_thinking": false}})", true);
    ASSERT_EQ(r.messages.size(), 3u);
    EXPECT_EQ(r.messages[0].role, "system");
    EXPECT_EQ(r.messages[1].content, "ab");
    EXPECT_EQ(r.messages[2].content, "");
    EXPECT_EQ(r.messages[2].reasoning_content, "hmm");
    EXPECT_EQ(*r.max_tokens, 5);
    EXPECT_FALSE(r.enable_thinking);
    EXPECT_TRUE(parse(R"({"messages": [{"role": "user", "content": "x"}]})", true).enable_thinking);
}

TEST(Request, ResponseFormat) {
    EXPECT_FALSE(parse(R"({"prompt": "x"})").json_object);
    EXPECT_FALSE(parse(R"({"prompt": "x", "response_format": {"type": "text"}})").json_object);
    EXPECT_FALSE(parse(R"({"prompt": "x", "response_format": null})").json_object);
    const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
    EXPECT_TRUE(parse("{" + msgs + R"(, "response_format": {"type": "json_object"}})", true).json_object);
    EXPECT_TRUE(parse(R"({"prompt": "x", "response_format": {"type": "json_object"}})").json_object);
    expect_error(R"({"prompt": "x", "response_format": "json_object"})", false, "response_format", "object");
    expect_error(R"({"prompt": "x", "response_format": {}})", false, "response_format.type", "string");
    expect_error(R"({"prompt": "x", "response_format": {"type": 1}})", false, "response_format.type", "string");
    expect_error(R"({"prompt": "x", "response_format": {"type": "xml"}})", false, "response_format.type", "'xml'");
    expect_error("{" + msgs + R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}})",
                 true, "response_format.type", "json_schema is not supported");
}

TEST(Request, EveryBadFieldIsNamed) {
    expect_error("", false, "", "not valid JSON");
    expect_error("{\"prompt\": ", false, "", "not valid JSON");
    expect_error("[1, 2]", false, "", "JSON object");
    expect_error("{}", false, "prompt", "required");
    expect_error(R"({"prompt": 5})", false, "prompt", "string");
    expect_error(R"({"prompt": [1, 2, 3]})", false, "prompt", "string");
    expect_error(R"({"prompt": "x", "model": 1})", false, "model", "string");
    expect_error(R"({"prompt": "x", "max_tokens": 0})", false, "max_tokens", "[1,");
    expect_error(R"({"prompt": "x", "max_tokens": 2.5})", false, "max_tokens", "integer");
    expect_error(R"({"prompt": "x", "max_tokens": 18446744073709551615})", false, "max_tokens", "too large");
    expect_error(R"({"prompt": "x", "temperature": "hot"})", false, "temperature", "number");
    expect_error(R"({"prompt": "x", "temperature": -1})", false, "temperature", "[0");
    expect_error(R"({"prompt": "x", "top_p": 1.5})", false, "top_p", "[0");
    expect_error(R"({"prompt": "x", "min_p": -0.1})", false, "min_p", "[0");
    expect_error(R"({"prompt": "x", "top_k": -1})", false, "top_k", "[0");
    expect_error(R"({"prompt": "x", "seed": "s"})", false, "seed", "integer");
    expect_error(R"({"prompt": "x", "n": 17})", false, "n", "[1, 16]");
    expect_error(R"({"prompt": "x", "n": 0})", false, "n", "[1, 16]");
    expect_error(R"({"prompt": "x", "stream": 1})", false, "stream", "boolean");
    expect_error(R"({"prompt": "x", "stream": true, "stream_options": 1})", false, "stream_options", "object");
    expect_error(R"({"prompt": "x", "stream_options": {"include_usage": true}})", false, "stream_options", "stream: true");
    expect_error(R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})", false,
                 "stream_options.include_usage", "boolean");
    expect_error(R"({"prompt": "x", "stop": 3})", false, "stop", "string");
    expect_error(R"({"prompt": "x", "stop": ["a", 3]})", false, "stop", "stop[1]");
    expect_error(R"({"prompt": "x", "stop": [""]})", false, "stop", "empty");
    expect_error(R"({"prompt": "x", "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]})",
                 false, "stop", "at most");
    expect_error("{}", true, "messages", "required");
    expect_error(R"({"messages": []})", true, "messages", "non-empty");
    expect_error(R"({"messages": ["hi"]})", true, "messages[0]", "object");
    expect_error(R"({"messages": [{"content": "hi"}]})", true, "messages[0].role", "string");
    expect_error(R"({"messages": [{"role": "robot", "content": "hi"}]})", true, "messages[0].role", "robot");
    expect_error(R"({"messages": [{"role": "user", "content": 5}]})", true, "messages[0].content", "string");
    expect_error(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true,
                 "messages[0].content[0]", "not supported");
    expect_error(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})", true,
                 "chat_template_kwargs", "object");
    expect_error(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": 1}})",
                 true, "chat_template_kwargs.enable_thinking", "boolean");
}

}  // namespace
}  // namespace alloy::server
