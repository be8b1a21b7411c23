// libFuzzer target: any request body must either parse as a completion or chat request of
// `alloy serve` or throw server::RequestError (the 400 the server sends), never crash; and any
// text, read as a model's answer, parses into content and tool calls (server/tool_calls.h)
// without crashing, also fed to the stream filter in two pieces.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string body(reinterpret_cast<const char*>(data), size);
    for (bool chat : {false, true}) {
        try {
            const auto r = alloy::server::parse_completion_request(body, chat);
            volatile size_t sink = r.prompt.size() + r.messages.size() + r.stop.size() + (r.max_tokens ? 1 : 0);
            for (const auto& m : r.messages) sink = sink + m.role.size() + m.content.size() + m.tool_calls.size();
            const auto a = alloy::server::parse_tool_calls(body, r.tools);
            sink = sink + a.content.size() + a.calls.size();
            (void)sink;
        } catch (const alloy::server::RequestError&) {
        }
    }
    const auto a = alloy::server::parse_tool_calls(body, {});
    alloy::server::ToolCallStream st;
    const std::string sent = st.push(body.substr(0, size / 2)) + st.push(body.substr(size / 2));
    // Nothing is lost or made up: what was sent, the call text and the held-back rest are the input.
    if (sent.size() + st.call_text().size() + st.flush_text().size() != body.size()) __builtin_trap();
    (void)a;
    return 0;
}
