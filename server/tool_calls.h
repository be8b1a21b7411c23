// Tool calls in Qwen3.5's format (models' chat template: the call format is XML-like, not JSON):
//   <tool_call>\n<function=NAME>\n<parameter=ARG>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// The request side: each tool of the request written as the template's `tojson` writes it
// (Python's json.dumps: ", " and ": " separators, keys in the order sent, non-ASCII as is);
// the response side: an answer parsed back into the text before the first call (OpenAI's
// `content`) and the calls (`tool_calls`, arguments as a JSON object), typed by the tool's
// JSON schema (a "string" parameter stays text; others are parsed as JSON when they are JSON).
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace alloy::server {

using ojson = nlohmann::ordered_json;

// Python's json.dumps(v, ensure_ascii=False).
std::string python_json(const ojson& v);
// A tool-call argument as the template writes it: strings as they are, objects and arrays as
// python_json, booleans and null as Python prints them (True, False, None), numbers as JSON.
std::string template_value(const ojson& v);

struct ToolSpec {
    std::string name;
    std::string json_text;                      // python_json of the request's tool object
    std::map<std::string, std::string> types;   // parameter -> its schema "type" ("" if none)
};

struct ToolCall {
    std::string name;
    ojson arguments = ojson::object();
};

struct ParsedAnswer {
    std::string content;          // the text before the first <tool_call> (trailing space trimmed)
    std::vector<ToolCall> calls;  // empty: no call, or a malformed one (then content is the text)
};
ParsedAnswer parse_tool_calls(const std::string& text, const std::vector<ToolSpec>& tools);

// On a stream: text passes until a "<tool_call>" begins; from there everything is kept for
// parse_tool_calls at the end. Only a possible "<tool_call>" prefix is held back meanwhile.
class ToolCallStream {
public:
    std::string push(const std::string& text);  // the text to send now
    std::string flush_text();                   // at the end without a call: the held-back prefix
    bool in_call() const { return in_call_; }
    const std::string& call_text() const { return call_; }  // from "<tool_call>" on

private:
    bool in_call_ = false;
    std::string held_, call_;
};

}  // namespace alloy::server
