// Tools through the chat template, against Qwen3.5's own template rendered by jinja2 as
// transformers does (tests/fixtures/chat_template/qwen35_cases.json, from
// scripts/make_chat_template_vectors.py): the request's tools as the template's tojson writes
// them, assistant tool_calls written back (arguments in order, values as the template prints
// them), tool messages; and the model's <tool_call> blocks parsed back into OpenAI's tool_calls.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/request.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace alloy::server {
namespace {

TEST(ToolCalls, RequestsRenderAsTheTemplateDoes) {
    // Ordered: the bodies keep their keys in the order the script wrote them.
    std::ifstream f(std::string(ALLOY_SOURCE_DIR) + "/tests/fixtures/chat_template/qwen35_cases.json");
    ASSERT_TRUE(f.good());
    const nlohmann::ordered_json cases = nlohmann::ordered_json::parse(f);
    ASSERT_GE(cases.size(), 6u);
    for (size_t i = 0; i < cases.size(); ++i) {
        const CompletionRequest r = parse_completion_request(cases[i]["body"].dump(), true);
        std::vector<ChatMessage> msgs;
        for (const ChatTurn& t : r.messages) {
            ChatMessage m{t.role, t.content, t.reasoning_content, {}};
            for (const ChatToolCall& c : t.tool_calls) m.tool_calls.push_back({c.name, c.arguments});
            msgs.push_back(std::move(m));
        }
        std::vector<std::string> tools;
        for (const ToolSpec& t : r.tools) tools.push_back(t.json_text);
        EXPECT_EQ(apply_chat_template(msgs, true, r.enable_thinking, tools), cases[i]["expected"].get<std::string>())
            << "case " << i;
    }
}

TEST(ToolCalls, PythonJsonIsJsonDumps) {
    const auto v = ojson::parse(R"({"b": 1, "a": [true, null, 2.5, "x\"\n\u00e9"], "c": {}})");
    EXPECT_EQ(python_json(v), "{\"b\": 1, \"a\": [true, null, 2.5, \"x\\\"\\n\xc3\xa9\"], \"c\": {}}");
    EXPECT_EQ(template_value(ojson(true)), "True");
    EXPECT_EQ(template_value(ojson(nullptr)), "None");
    EXPECT_EQ(template_value(ojson("as is\n")), "as is\n");
    EXPECT_EQ(template_value(ojson::parse("[1, 2]")), "[1, 2]");
}

std::vector<ToolSpec> weather() {
    ToolSpec t;
    t.name = "get_weather";
    t.types = {{"city", "string"}, {"days", "integer"}, {"where", "object"}, {"note", "string"}};
    return {t};
}

TEST(ToolCalls, AnswersParseIntoContentAndCalls) {
    const std::string text =
        "I will check both cities.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=where>\n{\"lat\": 48.85}\n</parameter>\n<parameter=note>\n42\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan\nJos\xc3\xa9\n"
        "</parameter>\n</function>\n</tool_call>";
    const ParsedAnswer a = parse_tool_calls(text, weather());
    EXPECT_EQ(a.content, "I will check both cities.");
    ASSERT_EQ(a.calls.size(), 2u);
    EXPECT_EQ(a.calls[0].name, "get_weather");
    EXPECT_EQ(a.calls[0].arguments.dump(), R"({"city":"Paris","days":3,"where":{"lat":48.85},"note":"42"})");
    EXPECT_EQ(a.calls[1].arguments["city"], "San\nJos\xc3\xa9");
    // No call, or a malformed one: the text is the content.
    EXPECT_TRUE(parse_tool_calls("plain answer", weather()).calls.empty());
    const ParsedAnswer bad = parse_tool_calls("x <tool_call>\n<function=get_weather>\n(cut off", weather());
    EXPECT_TRUE(bad.calls.empty());
    EXPECT_EQ(bad.content, "x <tool_call>\n<function=get_weather>\n(cut off");
}

TEST(ToolCalls, AStreamHoldsOnlyWhatCouldBeACall) {
    const std::string text = "Checking <tool the city <tool_call>\n<function=now>\n</function>\n</tool_call>";
    for (size_t cut = 0; cut <= text.size(); ++cut) {
        ToolCallStream s;
        std::string sent = s.push(text.substr(0, cut));
        sent += s.push(text.substr(cut));
        ASSERT_TRUE(s.in_call()) << cut;
        EXPECT_EQ(sent, "Checking <tool the city ") << cut;
        EXPECT_EQ(s.call_text(), "<tool_call>\n<function=now>\n</function>\n</tool_call>") << cut;
    }
    ToolCallStream s;
    EXPECT_EQ(s.push("ends with <tool_"), "ends with ");
    EXPECT_EQ(s.flush_text(), "<tool_");
    EXPECT_FALSE(s.in_call());
}

}  // namespace
}  // namespace alloy::server
