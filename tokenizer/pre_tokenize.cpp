#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenize.h"

#include <pcre2.h>

#include <memory>
#include <string>

#include "alloy/error.h"

namespace alloy {
namespace {

// Qwen2/2.5/3 (tokenizer.json of those models) and Qwen3.5 (adds \p{M} to the letter
// classes so combining marks stay with their base letter). The case-insensitive group is
// kept as HF writes it: PCRE2 caseless matching uses the same Unicode case folding as
// Oniguruma (HF's engine), so e.g. "'ſ" (long s) counts as "'s" in both.
constexpr const char* kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen35 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// One compiled, JIT-ed pattern. Compiled code is read-only and shared by all threads;
// match data and the JIT stack are per thread (see Scratch).
struct Compiled {
    pcre2_code* code = nullptr;
    explicit Compiled(const char* pattern) {
        int err = 0;
        PCRE2_SIZE off = 0;
        // UTF + UCP: \s, \p{..} use Unicode properties. MATCH_INVALID_UTF: invalid bytes in
        // the subject never match instead of failing the whole call, so bad input is split
        // around and passes through byte-level BPE as raw bytes.
        code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &off, nullptr);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            throw Error(std::string("pre-tokenizer regex does not compile at offset ") +
                        std::to_string(off) + ": " + reinterpret_cast<char*>(msg));
        }
        pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
    }
    ~Compiled() { pcre2_code_free(code); }
};

const Compiled& compiled(PreTokenizer pre) {
    static const Compiled qwen2(kQwen2), qwen35(kQwen35);
    return pre == PreTokenizer::Qwen2 ? qwen2 : qwen35;
}

struct Scratch {
    pcre2_match_data* md[2] = {nullptr, nullptr};
    pcre2_match_context* mctx = nullptr;
    pcre2_jit_stack* stack = nullptr;
    Scratch() {
        mctx = pcre2_match_context_create(nullptr);
        stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
        pcre2_jit_stack_assign(mctx, nullptr, stack);
    }
    ~Scratch() {
        for (auto* m : md) pcre2_match_data_free(m);
        pcre2_jit_stack_free(stack);
        pcre2_match_context_free(mctx);
    }
};

}  // namespace

const char* pre_tokenizer_regex(PreTokenizer pre) {
    return pre == PreTokenizer::Qwen2 ? kQwen2 : kQwen35;
}

void split_pieces(std::string_view text, PreTokenizer pre,
                  std::vector<std::pair<size_t, size_t>>& out) {
    out.clear();
    const Compiled& re = compiled(pre);
    thread_local Scratch scratch;
    pcre2_match_data*& md = scratch.md[pre == PreTokenizer::Qwen2 ? 0 : 1];
    if (!md) md = pcre2_match_data_create_from_pattern(re.code, nullptr);

    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0, gap = 0;  // gap: start of text not yet covered by a piece
    while (pos < text.size()) {
        const int rc = pcre2_match(re.code, subject, text.size(), pos, 0, md, scratch.mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            throw Error(std::string("pre-tokenizer: regex match failed at byte ") +
                        std::to_string(pos) + ": " + reinterpret_cast<char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        const size_t b = ov[0], e = ov[1];
        // Every alternative consumes at least one character, so e > b; guard anyway so a
        // surprise empty match can never loop forever.
        if (e <= b) { pos = b + 1; continue; }
        if (b > gap) out.emplace_back(gap, b);
        out.emplace_back(b, e);
        pos = gap = e;
    }
    if (gap < text.size()) out.emplace_back(gap, text.size());
}

std::vector<std::string> pre_tokenize(std::string_view text, PreTokenizer pre) {
    std::vector<std::pair<size_t, size_t>> ranges;
    split_pieces(text, pre, ranges);
    std::vector<std::string> pieces;
    pieces.reserve(ranges.size());
    for (auto [b, e] : ranges) pieces.emplace_back(text.substr(b, e - b));
    return pieces;
}

}  // namespace alloy
