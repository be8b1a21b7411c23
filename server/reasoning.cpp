#include "server/reasoning.h"

#include <algorithm>

#include "server/held_tail.h"

namespace alloy::server {

namespace {
constexpr const char* kClose = "</think>";
constexpr size_t kCloseLen = 8;

}  // namespace

ReasoningSplitter::Pieces ReasoningSplitter::push(const std::string& text) {
    Pieces out;
    std::string buf = held_ + text;
    held_.clear();
    if (in_reasoning_) {
        const size_t close = buf.find(kClose);
        std::string r = close == std::string::npos ? buf : buf.substr(0, close);
        std::string hold;
        if (close == std::string::npos) {
            const size_t p = held_tail(r, kClose);
            hold = r.substr(r.size() - p);
            r.resize(r.size() - p);
        }
        if (!reasoning_started_) {  // the reasoning's leading newlines are dropped
            const size_t first = r.find_first_not_of('\n');
            r = first == std::string::npos ? "" : r.substr(first);
            reasoning_started_ = !r.empty();
        }
        // Trailing newlines: emitted once more reasoning follows them, dropped before "</think>".
        const size_t last = r.find_last_not_of('\n');
        const std::string tail = last == std::string::npos ? r : r.substr(last + 1);
        r.resize(r.size() - tail.size());
        out.reasoning = r;
        if (close == std::string::npos) {
            held_ = tail + hold;
            return out;
        }
        in_reasoning_ = false;
        buf = buf.substr(close + kCloseLen);
    }
    if (!content_started_) {  // the content's leading newlines are dropped
        const size_t first = buf.find_first_not_of('\n');
        buf = first == std::string::npos ? "" : buf.substr(first);
        content_started_ = !buf.empty();
    }
    out.content += buf;
    return out;
}

ReasoningSplitter::Pieces ReasoningSplitter::flush() {
    Pieces out;
    if (in_reasoning_) {
        // An answer cut off inside its reasoning: the held part is reasoning (newlines trimmed).
        const size_t last = held_.find_last_not_of('\n');
        out.reasoning = last == std::string::npos ? "" : held_.substr(0, last + 1);
    } else {
        out.content = held_;
    }
    held_.clear();
    return out;
}

}  // namespace alloy::server
