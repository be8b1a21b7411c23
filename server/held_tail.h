// Streaming parsers of an answer (reasoning split, tool calls) send text as it arrives but hold
// back a tail that could still be the start of the tag they look for, so nothing sent is ever
// taken back. (runtime/stop_filter.h does the same for stop strings; the layers may not share.)
#pragma once
#include <algorithm>
#include <cstring>
#include <string>

namespace alloy::server {

// The length of the longest suffix of `s` that is a proper prefix of `tag`.
inline size_t held_tail(const std::string& s, const char* tag) {
    const size_t len = std::strlen(tag);
    for (size_t n = std::min(s.size(), len ? len - 1 : 0); n > 0; --n)
        if (s.compare(s.size() - n, n, tag, n) == 0) return n;
    return 0;
}

}  // namespace alloy::server
