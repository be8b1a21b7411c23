#include "server/request.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace alloy::server {

namespace {

// Ordered: the tools' JSON and the calls' arguments keep the order the client sent (the chat
// template writes them back in that order).
using json = nlohmann::ordered_json;

constexpr int kMaxStop = 16;            // llama.cpp's server takes any number; OpenAI 4
constexpr int kMaxChoices = 16;         // n: OpenAI allows up to 128; each choice holds a slot
constexpr int kMaxTokensLimit = 1 << 24;

// The text of a message's `content`: a string, or OpenAI's array of parts of which only
// {"type": "text", "text": ...} are supported here (no images).
std::string content_text(const json& c, const std::string& param) {
    if (c.is_string()) return c.get<std::string>();
    if (c.is_null()) return "";
    if (!c.is_array()) throw RequestError(param, param + " must be a string or an array of text parts");
    std::string text;
    for (size_t i = 0; i < c.size(); ++i) {
        const json& part = c[i];
        const std::string p = param + "[" + std::to_string(i) + "]";
        if (!part.is_object() || !part.contains("type") || part["type"] != "text")
            throw RequestError(p, p + " must be an object with \"type\": \"text\" (other content is not supported)");
        if (!part.contains("text") || !part["text"].is_string()) throw RequestError(p + ".text", p + ".text must be a string");
        text += part["text"].get<std::string>();
    }
    return text;
}

double number(const json& j, const char* name, double lo, double hi) {
    const json& v = j[name];
    if (!v.is_number()) throw RequestError(name, std::string(name) + " must be a number");
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi))
        throw RequestError(name, std::string(name) + " must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " +
                                     v.dump());
    return x;
}

int64_t integer(const json& j, const char* name, int64_t lo, int64_t hi) {
    const json& v = j[name];
    if (!v.is_number_integer()) throw RequestError(name, std::string(name) + " must be an integer");
    // Unsigned values beyond int64 read as negative through get<int64_t>: check the sign first.
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
        throw RequestError(name, std::string(name) + " is too large");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi)
        throw RequestError(name, std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                     "], got " + std::to_string(x));
    return x;
}

}  // namespace

CompletionRequest parse_completion_request(const std::string& body, bool chat) {
    json j;
    try {
        j = json::parse(body);
    } catch (const json::exception& e) {
        throw RequestError("", std::string("the request body is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw RequestError("", "the request body must be a JSON object");
    CompletionRequest r;
    r.chat = chat;
    auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };

    if (has("model")) {
        if (!j["model"].is_string()) throw RequestError("model", "model must be a string");
        r.model = j["model"].get<std::string>();
    }
    if (chat) {
        if (!has("messages")) throw RequestError("messages", "messages is required");
        const json& m = j["messages"];
        if (!m.is_array() || m.empty()) throw RequestError("messages", "messages must be a non-empty array");
        for (size_t i = 0; i < m.size(); ++i) {
            const std::string p = "messages[" + std::to_string(i) + "]";
            if (!m[i].is_object()) throw RequestError(p, p + " must be an object");
            if (!m[i].contains("role") || !m[i]["role"].is_string())
                throw RequestError(p + ".role", p + ".role must be a string");
            ChatTurn msg;
            msg.role = m[i]["role"].get<std::string>();
            if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
                throw RequestError(p + ".role", p + ".role must be system, user, assistant or tool, got '" + msg.role + "'");
            msg.content = content_text(m[i].contains("content") ? m[i]["content"] : json(), p + ".content");
            if (m[i].contains("reasoning_content") && m[i]["reasoning_content"].is_string())
                msg.reasoning_content = m[i]["reasoning_content"].get<std::string>();
            if (msg.role == "assistant" && m[i].contains("tool_calls") && !m[i]["tool_calls"].is_null()) {
                const json& tc = m[i]["tool_calls"];
                if (!tc.is_array()) throw RequestError(p + ".tool_calls", p + ".tool_calls must be an array");
                for (size_t c = 0; c < tc.size(); ++c) {
                    const std::string q = p + ".tool_calls[" + std::to_string(c) + "]";
                    const json& f = tc[c].is_object() && tc[c].contains("function") ? tc[c]["function"] : tc[c];
                    if (!f.is_object() || !f.contains("name") || !f["name"].is_string())
                        throw RequestError(q + ".function.name", q + ".function.name must be a string");
                    ChatToolCall call;
                    call.name = f["name"].get<std::string>();
                    json args = f.contains("arguments") ? f["arguments"] : json::object();
                    if (args.is_string()) {  // OpenAI sends the arguments as JSON text
                        args = json::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
                        if (args.is_discarded())
                            throw RequestError(q + ".function.arguments", q + ".function.arguments is not valid JSON");
                    }
                    if (!args.is_object())
                        throw RequestError(q + ".function.arguments", q + ".function.arguments must be a JSON object");
                    for (auto it = args.begin(); it != args.end(); ++it) call.arguments.emplace_back(it.key(), template_value(it.value()));
                    msg.tool_calls.push_back(std::move(call));
                }
            }
            r.messages.push_back(std::move(msg));
        }
        if (has("chat_template_kwargs")) {
            const json& k = j["chat_template_kwargs"];
            if (!k.is_object()) throw RequestError("chat_template_kwargs", "chat_template_kwargs must be an object");
            if (k.contains("enable_thinking")) {
                if (!k["enable_thinking"].is_boolean())
                    throw RequestError("chat_template_kwargs.enable_thinking", "chat_template_kwargs.enable_thinking must be a boolean");
                r.enable_thinking = k["enable_thinking"].get<bool>();
            }
        }
    } else {
        if (!has("prompt")) throw RequestError("prompt", "prompt is required");
        const json& p = j["prompt"];
        if (p.is_string()) r.prompt = p.get<std::string>();
        else if (p.is_array() && p.size() == 1 && p[0].is_string()) r.prompt = p[0].get<std::string>();
        else throw RequestError("prompt", "prompt must be a string (or an array of one string)");
    }

    // Sampling and limits. chat also accepts max_completion_tokens (the newer OpenAI name).
    const char* max_key = chat && has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (has(max_key)) r.max_tokens = int(integer(j, max_key, 1, kMaxTokensLimit));
    if (has("temperature")) r.sampler.temperature = float(number(j, "temperature", 0.0, 100.0));
    if (has("top_p")) r.sampler.top_p = float(number(j, "top_p", 0.0, 1.0));
    if (has("min_p")) r.sampler.min_p = float(number(j, "min_p", 0.0, 1.0));
    if (has("top_k")) r.sampler.top_k = int(integer(j, "top_k", 0, 1 << 30));
    if (has("seed")) r.sampler.seed = uint64_t(integer(j, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    if (has("n") && !j["n"].is_null()) r.n = int(integer(j, "n", 1, kMaxChoices));
    // logprobs: chat as OpenAI's (a boolean, with top_logprobs 0..20), completions as the legacy
    // API's (the number of alternatives; OpenAI caps it at 5, vLLM at 20 as here).
    if (chat) {
        bool want = false;
        if (has("logprobs") && !j["logprobs"].is_null()) {
            if (!j["logprobs"].is_boolean()) throw RequestError("logprobs", "logprobs must be a boolean");
            want = j["logprobs"].get<bool>();
        }
        if (has("top_logprobs") && !j["top_logprobs"].is_null()) {
            const int top = int(integer(j, "top_logprobs", 0, kMaxTopLogprobs));
            if (!want) throw RequestError("top_logprobs", "top_logprobs needs logprobs set to true");
            r.logprobs = top;
        } else if (want) {
            r.logprobs = 0;
        }
    } else if (has("logprobs") && !j["logprobs"].is_null()) {
        r.logprobs = int(integer(j, "logprobs", 0, kMaxTopLogprobs));
    }
    // tools: [{"type": "function", "function": {"name", "description", "parameters"}}], rendered
    // into the system turn; tool_choice "none" leaves them out (other choices: the model decides).
    if (chat && has("tools") && !j["tools"].is_null()) {
        const json& t = j["tools"];
        if (!t.is_array()) throw RequestError("tools", "tools must be an array");
        const bool none = has("tool_choice") && j["tool_choice"] == "none";
        for (size_t i = 0; i < t.size() && !none; ++i) {
            const std::string p = "tools[" + std::to_string(i) + "]";
            if (!t[i].is_object() || !t[i].contains("function") || !t[i]["function"].is_object())
                throw RequestError(p + ".function", p + ".function must be an object");
            const json& f = t[i]["function"];
            if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
                throw RequestError(p + ".function.name", p + ".function.name must be a non-empty string");
            ToolSpec spec;
            spec.name = f["name"].get<std::string>();
            spec.json_text = python_json(t[i]);
            if (f.contains("parameters") && f["parameters"].is_object() && f["parameters"].contains("properties") &&
                f["parameters"]["properties"].is_object())
                for (auto it = f["parameters"]["properties"].begin(); it != f["parameters"]["properties"].end(); ++it)
                    spec.types[it.key()] = it.value().is_object() && it.value().contains("type") && it.value()["type"].is_string()
                                               ? it.value()["type"].get<std::string>()
                                               : "";
            r.tools.push_back(std::move(spec));
        }
    }
    if (has("response_format")) {
        const json& f = j["response_format"];
        if (!f.is_object()) throw RequestError("response_format", "response_format must be an object with a \"type\"");
        if (!f.contains("type") || !f["type"].is_string())
            throw RequestError("response_format.type", "response_format.type must be a string: text or json_object");
        const std::string type = f["type"].get<std::string>();
        if (type == "json_object") {
            r.json_object = true;
        } else if (type == "json_schema") {
            throw RequestError("response_format.type",
                               "response_format.type json_schema is not supported (json_object is: any JSON object)");
        } else if (type != "text") {
            throw RequestError("response_format.type", "response_format.type must be text or json_object, got '" + type + "'");
        }
    }
    if (has("stream")) {
        if (!j["stream"].is_boolean()) throw RequestError("stream", "stream must be a boolean");
        r.stream = j["stream"].get<bool>();
    }
    // stream_options.include_usage: a last chunk (choices []) with the whole usage, as OpenAI's.
    if (has("stream_options")) {
        const json& o = j["stream_options"];
        if (!o.is_object()) throw RequestError("stream_options", "stream_options must be an object");
        if (!r.stream) throw RequestError("stream_options", "stream_options is only allowed with stream: true");
        if (o.contains("include_usage") && !o["include_usage"].is_null()) {
            if (!o["include_usage"].is_boolean())
                throw RequestError("stream_options.include_usage", "stream_options.include_usage must be a boolean");
            r.include_usage = o["include_usage"].get<bool>();
        }
    }
    if (has("stop")) {
        const json& s = j["stop"];
        if (s.is_string()) {
            r.stop.push_back(s.get<std::string>());
        } else if (s.is_array() && int(s.size()) <= kMaxStop) {
            for (size_t i = 0; i < s.size(); ++i) {
                if (!s[i].is_string()) throw RequestError("stop", "stop[" + std::to_string(i) + "] must be a string");
                r.stop.push_back(s[i].get<std::string>());
            }
        } else {
            throw RequestError("stop", "stop must be a string or an array of at most " + std::to_string(kMaxStop) + " strings");
        }
        for (const auto& s : r.stop)
            if (s.empty()) throw RequestError("stop", "stop strings must not be empty");
    }
    return r;
}

}  // namespace alloy::server
