#include "server/tool_calls.h"

#include <cstdio>
#include <utility>

#include "server/held_tail.h"

namespace alloy::server {

namespace {
constexpr const char* kOpen = "<tool_call>";

void python_string(const std::string& s, std::string& out) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += char(c);  // UTF-8 bytes as they are (ensure_ascii=False)
                }
        }
    }
    out += '"';
}

void python_json_into(const ojson& v, std::string& out) {
    if (v.is_object()) {
        out += '{';
        bool first = true;
        for (auto it = v.begin(); it != v.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            python_string(it.key(), out);
            out += ": ";
            python_json_into(it.value(), out);
        }
        out += '}';
    } else if (v.is_array()) {
        out += '[';
        for (size_t i = 0; i < v.size(); ++i) {
            if (i) out += ", ";
            python_json_into(v[i], out);
        }
        out += ']';
    } else if (v.is_string()) {
        python_string(v.get<std::string>(), out);
    } else {
        out += v.dump();  // numbers, true / false / null as JSON writes them
    }
}

std::string strip_one_newline(std::string s) {
    if (!s.empty() && s.front() == '\n') s.erase(0, 1);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
}

}  // namespace

std::string python_json(const ojson& v) {
    std::string out;
    python_json_into(v, out);
    return out;
}

std::string template_value(const ojson& v) {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() || v.is_array()) return python_json(v);
    if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
    if (v.is_null()) return "None";
    return v.dump();
}

ParsedAnswer parse_tool_calls(const std::string& text, const std::vector<ToolSpec>& tools) {
    ParsedAnswer a;
    const size_t first = text.find(kOpen);
    if (first == std::string::npos) {
        a.content = text;
        return a;
    }
    a.content = text.substr(0, first);
    while (!a.content.empty() && (a.content.back() == '\n' || a.content.back() == ' ')) a.content.pop_back();
    size_t pos = first;
    while ((pos = text.find(kOpen, pos)) != std::string::npos) {
        const size_t end = text.find("</tool_call>", pos);
        const size_t fn = text.find("<function=", pos);
        if (end == std::string::npos || fn == std::string::npos || fn > end) break;
        const size_t name_end = text.find('>', fn);
        if (name_end == std::string::npos || name_end > end) break;
        ToolCall call;
        call.name = text.substr(fn + 10, name_end - fn - 10);
        const ToolSpec* spec = nullptr;
        for (const ToolSpec& t : tools)
            if (t.name == call.name) spec = &t;
        size_t p = name_end + 1;
        for (;;) {
            const size_t par = text.find("<parameter=", p);
            if (par == std::string::npos || par > end) break;
            const size_t pn = text.find('>', par);
            const size_t pe = text.find("</parameter>", par);
            if (pn == std::string::npos || pe == std::string::npos || pe > end) break;
            const std::string key = text.substr(par + 11, pn - par - 11);
            const std::string value = strip_one_newline(text.substr(pn + 1, pe - pn - 1));
            // The schema says how to read it: a string stays text; otherwise JSON when it is JSON.
            const auto type = spec ? spec->types.find(key) : std::map<std::string, std::string>::const_iterator{};
            const bool text_type = !spec || type == spec->types.end() || type->second == "string" || type->second.empty();
            ojson v = value;
            if (!text_type) {
                ojson parsed = ojson::parse(value, nullptr, /*allow_exceptions=*/false);
                if (!parsed.is_discarded()) v = std::move(parsed);
            }
            call.arguments[key] = std::move(v);
            p = pe + 12;
        }
        a.calls.push_back(std::move(call));
        pos = end + 12;
    }
    if (a.calls.empty()) a.content = text;  // malformed: the answer as text
    return a;
}

std::string ToolCallStream::push(const std::string& text) {
    if (in_call_) {
        call_ += text;
        return "";
    }
    std::string buf = held_ + text;
    held_.clear();
    const size_t open = buf.find(kOpen);
    if (open != std::string::npos) {
        in_call_ = true;
        call_ = buf.substr(open);
        return buf.substr(0, open);
    }
    const size_t p = held_tail(buf, kOpen);
    held_ = buf.substr(buf.size() - p);
    return buf.substr(0, buf.size() - p);
}

std::string ToolCallStream::flush_text() { return std::exchange(held_, std::string()); }

}  // namespace alloy::server
