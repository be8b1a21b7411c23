// Qwen3.5 chat template (models/templates/Qwen3.5-4B.jinja, spec/GGUF.md section 9) written
// out by hand for the no-tools case. Each step names the Jinja construct it mirrors.
#include <string_view>

#include "alloy/error.h"
#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Jinja `|trim` (Python str.strip() on ASCII whitespace).
std::string trim(std::string_view s) {
    size_t b = 0, e = s.size();
    while (b < e && is_ws(s[b])) ++b;
    while (e > b && is_ws(s[e - 1])) --e;
    return std::string(s.substr(b, e - b));
}
std::string lstrip_nl(std::string_view s) {
    size_t b = 0;
    while (b < s.size() && s[b] == '\n') ++b;
    return std::string(s.substr(b));
}
std::string rstrip_nl(std::string_view s) {
    size_t e = s.size();
    while (e > 0 && s[e - 1] == '\n') --e;
    return std::string(s.substr(0, e));
}
bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
    return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

}  // namespace

// The instructions Qwen3.5's template puts after the tool list (models/templates/Qwen3.5-4B.jinja).
constexpr const char* kToolFormat =
    "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n"
    "<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
    "Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural "
    "language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question "
    "like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                bool enable_thinking, const std::vector<std::string>& tools) {
    if (messages.empty()) throw Error("chat template: no messages provided");
    std::string out;
    if (!tools.empty()) {
        out += "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
        for (const std::string& t : tools) out += "\n" + t;
        out += "\n</tools>";
        out += kToolFormat;
        if (messages[0].role == "system") {
            const std::string sys = trim(messages[0].content);
            if (!sys.empty()) out += "\n\n" + sys;
        }
        out += "<|im_end|>\n";
    } else if (messages[0].role == "system") {
        out += "<|im_start|>system\n" + trim(messages[0].content) + "<|im_end|>\n";
    }

    // ns.last_query_index: the last user message that is not just a wrapped tool response.
    long last_query = -1;
    for (long i = static_cast<long>(messages.size()) - 1; i >= 0; --i) {
        if (messages[i].role != "user") continue;
        const std::string c = trim(messages[i].content);
        if (!(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    if (last_query < 0) throw Error("chat template: no user query found in messages");

    for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        std::string content = trim(m.content);
        if (m.role == "system") {
            if (i != 0) throw Error("chat template: system message must be at the beginning (message " +
                                    std::to_string(i) + ")");
        } else if (m.role == "user") {
            out += "<|im_start|>user\n" + content + "<|im_end|>\n";
        } else if (m.role == "assistant") {
            // An empty reasoning_content stands for "not given": then reasoning is whatever
            // precedes </think> in the content.
            std::string reasoning = m.reasoning_content;
            if (reasoning.empty()) {
                const size_t close = content.find("</think>");
                if (close != std::string::npos) {
                    std::string before = rstrip_nl(std::string_view(content).substr(0, close));
                    const size_t open = before.rfind("<think>");
                    if (open != std::string::npos) before = before.substr(open + 7);
                    reasoning = lstrip_nl(before);
                    content = lstrip_nl(std::string_view(content).substr(content.rfind("</think>") + 8));
                }
            }
            reasoning = trim(reasoning);
            // After the last user query the think block is written even when the reasoning is empty
            // (Qwen3.5's template; Qwen3's wrote it only with reasoning).
            if (static_cast<long>(i) > last_query)
                out += "<|im_start|>assistant\n<think>\n" + reasoning + "\n</think>\n\n" + content;
            else
                out += "<|im_start|>assistant\n" + content;
            for (size_t c = 0; c < m.tool_calls.size(); ++c) {
                const ChatToolCallText& call = m.tool_calls[c];
                if (c > 0) out += "\n<tool_call>\n<function=" + call.name + ">\n";
                else if (!trim(content).empty()) out += "\n\n<tool_call>\n<function=" + call.name + ">\n";
                else out += "<tool_call>\n<function=" + call.name + ">\n";
                for (const auto& [name, value] : call.arguments) out += "<parameter=" + name + ">\n" + value + "\n</parameter>\n";
                out += "</function>\n</tool_call>";
            }
            out += "<|im_end|>\n";
        } else if (m.role == "tool") {
            // loop.previtem is undefined for the first message, so a leading tool turn gets no header.
            if (i > 0 && messages[i - 1].role != "tool") out += "<|im_start|>user";
            out += "\n<tool_response>\n" + content + "\n</tool_response>";
            if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
        } else {
            throw Error("chat template: unexpected message role '" + m.role + "' (message " +
                        std::to_string(i) + ")");
        }
    }
    if (add_generation_prompt) {
        out += "<|im_start|>assistant\n";
        out += enable_thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
    }
    return out;
}

}  // namespace alloy
