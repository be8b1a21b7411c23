// The reasoning split of a chat answer (OpenAI-compatible servers' `reasoning_content`, as
// llama-server's --reasoning-format deepseek and vLLM's reasoning parsers give it). With
// thinking on, Qwen3.5's generation prompt ends inside "<think>\n", so the answer is
//   reasoning "</think>" content
// and the template, reading it back, takes reasoning = the part before "</think>" without its
// leading and trailing newlines, content = the part after it without its leading newlines.
// The splitter does the same on a stream: text pieces in, reasoning and content pieces out,
// holding back only what could still be the start of "</think>" or newlines that may turn out
// to be trailing.
#pragma once
#include <string>

namespace alloy::server {

class ReasoningSplitter {
public:
    // in_reasoning: whether the answer starts inside the think block (thinking on).
    explicit ReasoningSplitter(bool in_reasoning) : in_reasoning_(in_reasoning) {}
    struct Pieces {
        std::string reasoning, content;
    };
    Pieces push(const std::string& text);
    Pieces flush();  // the end of the answer: whatever is held back
    bool in_reasoning() const { return in_reasoning_; }

private:
    bool in_reasoning_;
    bool reasoning_started_ = false;  // a non-newline reasoning character was emitted
    bool content_started_ = false;    // a non-newline content character was emitted
    std::string held_;                // a possible "</think>" prefix, or reasoning's trailing newlines
};

}  // namespace alloy::server
