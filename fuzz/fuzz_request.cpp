// libFuzzer target: any request body must either parse as a completion or chat request of
// `alloy serve` or throw server::RequestError (the 400 the server sends), never crash.
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
            for (const auto& m : r.messages) sink = sink + m.role.size() + m.content.size();
            (void)sink;
        } catch (const alloy::server::RequestError&) {
        }
    }
    return 0;
}
