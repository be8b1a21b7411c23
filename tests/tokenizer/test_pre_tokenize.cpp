// The split regexes on their own: whitespace-run lookahead, letters vs marks, invalid UTF-8.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

using Pieces = std::vector<std::string>;

// \s+(?!\S) gives back the last space of a run so that it can start the next word, as HF's
// regex engine does by backtracking: "a   b" -> "a", "  ", " b"; at the end of the text the
// whole run stays together.
TEST(PreTokenize, WhitespaceRunLeavesOneSpaceForTheNextWord) {
    for (PreTokenizer pre : {PreTokenizer::Qwen2, PreTokenizer::Qwen35}) {
        EXPECT_EQ(pre_tokenize("a   b", pre), (Pieces{"a", "  ", " b"}));
        EXPECT_EQ(pre_tokenize("a   ", pre), (Pieces{"a", "   "}));
        EXPECT_EQ(pre_tokenize("   a", pre), (Pieces{"  ", " a"}));
        EXPECT_EQ(pre_tokenize("a \t b", pre), (Pieces{"a", " \t", " b"}));
        EXPECT_EQ(pre_tokenize("x  \n  y", pre), (Pieces{"x", "  \n", " ", " y"}));
        EXPECT_EQ(pre_tokenize("\r\n\r\n", pre), (Pieces{"\r\n\r\n"}));
        EXPECT_EQ(pre_tokenize(" !!", pre), (Pieces{" !!"}));
    }
}

TEST(PreTokenize, ContractionsAnyCaseAndDigitsOneByOne) {
    for (PreTokenizer pre : {PreTokenizer::Qwen2, PreTokenizer::Qwen35}) {
        EXPECT_EQ(pre_tokenize("WE'LL it'S", pre), (Pieces{"WE", "'LL", " it", "'S"}));
        EXPECT_EQ(pre_tokenize("x2024", pre), (Pieces{"x", "2", "0", "2", "4"}));
    }
}

// Qwen3.5 keeps a combining mark with its letter; Qwen2 splits it off as punctuation.
TEST(PreTokenize, CombiningMarksDifferBetweenFamilies) {
    const std::string text = "cafe\xCC\x81s";  // e + U+0301
    EXPECT_EQ(pre_tokenize(text, PreTokenizer::Qwen35), (Pieces{text}));
    EXPECT_EQ(pre_tokenize(text, PreTokenizer::Qwen2), (Pieces{"cafe", "\xCC\x81s"}));
}

// Invalid bytes never match; they become their own pieces and nothing is lost.
TEST(PreTokenize, InvalidUtf8IsKeptAsSeparatePieces) {
    EXPECT_EQ(pre_tokenize("ab\xFF" "cd", PreTokenizer::Qwen2), (Pieces{"ab", "\xFF", "cd"}));
    EXPECT_EQ(pre_tokenize("\xE4\xBD", PreTokenizer::Qwen35), (Pieces{"\xE4\xBD"}));  // truncated 3-byte char

    std::mt19937 rng(7);
    for (int iter = 0; iter < 300; ++iter) {
        std::string s(1 + rng() % 97, '\0');
        for (char& c : s) c = static_cast<char>(rng() % 3 == 0 ? rng() % 256 : "a \n\xC3\xA9\xE4\xB8\xAD'1."[rng() % 12]);
        for (PreTokenizer pre : {PreTokenizer::Qwen2, PreTokenizer::Qwen35}) {
            std::string joined;
            for (const auto& p : pre_tokenize(s, pre)) {
                EXPECT_FALSE(p.empty());
                joined += p;
            }
            EXPECT_EQ(joined, s);
        }
    }
}

}  // namespace
}  // namespace alloy
