// Stop strings over streamed text: the text that becomes final as pieces arrive, holding back
// a tail that could still begin a stop string, so streamed text is never taken back.
#pragma once
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace alloy {

// Holds back the tail of the text that could still begin a stop string, so streamed text is
// never taken back.
class StopFilter {
public:
    explicit StopFilter(const std::vector<std::string>& stop) : stop_(stop) {}
    // Appends `piece`; returns the text that became final. Sets `hit` when a stop string appeared
    // (everything from it on is dropped).
    std::string push(const std::string& piece, bool& hit) {
        buf_ += piece;
        size_t cut = std::string::npos;
        for (const auto& s : stop_)
            if (!s.empty()) cut = std::min(cut, buf_.find(s));
        if (cut != std::string::npos) {
            hit = true;
            std::string out = buf_.substr(0, cut);
            buf_.clear();
            return out;
        }
        // Keep the longest suffix that is a proper prefix of some stop string.
        size_t keep = 0;
        for (const auto& s : stop_)
            for (size_t n = std::min(s.size() - (s.empty() ? 0 : 1), buf_.size()); n > keep; --n)
                if (buf_.compare(buf_.size() - n, n, s, 0, n) == 0) {
                    keep = n;
                    break;
                }
        std::string out = buf_.substr(0, buf_.size() - keep);
        buf_.erase(0, buf_.size() - keep);
        return out;
    }
    std::string flush() { return std::exchange(buf_, std::string()); }

private:
    std::vector<std::string> stop_;
    std::string buf_;
};

}  // namespace alloy
