#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "alloy/error.h"

namespace alloy {

namespace {

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

}  // namespace

GenerateResult generate(const LoadedModel& lm, const std::vector<int32_t>& prompt, const GenerateParams& p,
                        int n_ctx, KvCacheTypes kv, const ForwardOptions& fo,
                        const std::function<bool(const std::string&)>& on_text,
                        const std::function<void(int32_t)>& on_token) {
    if (prompt.empty()) throw Error("the prompt is empty after tokenization");
    if (p.max_tokens < 0) throw Error("max_tokens must be >= 0, got " + std::to_string(p.max_tokens));
    if (int64_t(prompt.size()) + p.max_tokens > n_ctx)
        throw Error("prompt (" + std::to_string(prompt.size()) + " tokens) + " + std::to_string(p.max_tokens) +
                    " tokens to generate exceeds the context size of " + std::to_string(n_ctx));
    if (p.text) lm.require_tokenizer();
    const Qwen35Model& model = *lm.model;
    const int V = model.hparams().n_vocab;
    ModelState st = model.new_state(n_ctx, kv);
    std::vector<float> logits(static_cast<size_t>(V));
    Sampler sampler(p.sampler);
    GenerateResult r;
    r.n_prompt = int(prompt.size());
    r.finish_reason = "length";

    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    if (p.max_tokens > 0) model.forward(st, prompt.data(), int(prompt.size()), fo, logits.data());
    const auto t1 = clock::now();
    std::optional<StreamDecoder> dec;
    if (p.text) dec.emplace(*lm.tokenizer);
    StopFilter filter(p.stop);
    ForwardOptions step = fo;
    step.gdn_mode = ref::GdnMode::Serial;  // decode runs the serial kernel
    auto emit = [&](const std::string& text) {
        r.text += text;
        return text.empty() || !on_text || on_text(text);
    };
    for (int i = 0; i < p.max_tokens; ++i) {
        const int32_t next = sampler.sample(logits.data(), V);
        r.ids.push_back(next);
        if (on_token) on_token(next);
        if (!p.ignore_eos && lm.tokenizer && lm.tokenizer->is_end_of_generation(next)) {
            r.finish_reason = "stop";
            break;
        }
        bool hit = false;
        if (dec && !emit(filter.push(dec->push(next), hit))) hit = true;
        if (hit) {
            r.finish_reason = "stop";
            dec.reset();  // the rest is dropped
            break;
        }
        if (i + 1 < p.max_tokens) model.forward(st, &next, 1, step, logits.data());
    }
    if (dec) {
        bool hit = false;
        std::string tail = filter.push(dec->flush(), hit);
        if (!hit) tail += filter.flush();
        else r.finish_reason = "stop";
        emit(tail);
    }
    r.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
    r.generate_seconds = std::chrono::duration<double>(clock::now() - t1).count();
    return r;
}

}  // namespace alloy
