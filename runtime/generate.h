// The generation loop every front end shares (`alloy run`, `alloy serve`): prefill the prompt,
// then sample, stream and decode one token at a time until end-of-generation, a stop string
// or the token budget.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/qwen35.h"
#include "runtime/loaded_model.h"
#include "runtime/sampler.h"

namespace alloy {

struct GenerateParams {
    int max_tokens = 64;
    SamplerParams sampler;
    std::vector<std::string> stop;  // stop strings: the text ends before the first one found
    bool ignore_eos = false;        // keep going past end-of-generation tokens
    bool text = true;               // decode text (needs the model's tokenizer), else ids only
};

struct GenerateResult {
    std::string text;                 // the generated text (stop string excluded)
    std::vector<int32_t> ids;         // the generated token ids (as sampled)
    int n_prompt = 0;
    std::string finish_reason;        // "stop" (end-of-generation token or stop string) or "length"
    double prompt_seconds = 0, generate_seconds = 0;
};

// Runs `prompt` from an empty state of n_ctx positions (throws alloy::Error naming the
// sizes when prompt + max_tokens does not fit). on_text, if given, receives the text as it
// becomes final (never a piece that a stop string could still cut) and may return false to
// stop early (finish_reason "stop"). on_token, if given, sees every sampled id as it is drawn
// (an end-of-generation id too). With p.text, a model without a tokenizer is an error
// (after the size check); without it the result has ids only.
GenerateResult generate(const LoadedModel& lm, const std::vector<int32_t>& prompt, const GenerateParams& p,
                        int n_ctx, KvCacheTypes kv, const ForwardOptions& fo,
                        const std::function<bool(const std::string&)>& on_text = nullptr,
                        const std::function<void(int32_t)>& on_token = nullptr);

}  // namespace alloy
