// Synthetic vocabularies: the BPE merge order on random words, vocabulary checks, and the
// tokenizer.json reader on small hand-made files.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "alloy/error.h"
#include "tokenizer/byte_unicode.h"
#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

// 256 byte tokens (in byte order, so id == byte value) plus whatever the test adds.
Vocab byte_vocab() {
    Vocab v;
    for (int b = 0; b < 256; ++b) {
        v.tokens.push_back(byte_unicode::from_byte(static_cast<uint8_t>(b)));
        v.types.push_back(TokenType::Normal);
    }
    v.pre = PreTokenizer::Qwen2;
    return v;
}

// The textbook rule written independently: merge the lowest-rank adjacent pair, leftmost
// on ties, until no pair is mergeable.
std::vector<std::string> reference_bpe(const std::string& word, const std::vector<std::string>& merges) {
    std::vector<std::string> sym;
    for (unsigned char c : word) sym.push_back(byte_unicode::from_byte(c));
    for (;;) {
        size_t best_rank = merges.size(), best_pos = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
            for (size_t r = 0; r < best_rank; ++r) {
                if (merges[r] == sym[i] + " " + sym[i + 1]) { best_rank = r; best_pos = i; break; }
            }
        }
        if (best_rank == merges.size()) return sym;
        sym[best_pos] += sym[best_pos + 1];
        sym.erase(sym.begin() + best_pos + 1);
    }
}

// Random merges over a 3-letter alphabet, random words up to 70 letters (both the short-word
// scan and the heap path for longer words), compared with the reference rule.
TEST(Bpe, MatchesReferenceMergeOrderOnRandomWords) {
    std::mt19937 rng(1234);
    for (int trial = 0; trial < 20; ++trial) {
        Vocab v = byte_vocab();
        std::vector<std::string> pool = {"a", "b", "c"};
        for (int m = 0; m < 37; ++m) {
            const std::string l = pool[rng() % pool.size()], r = pool[rng() % pool.size()];
            const std::string merge = l + " " + r;
            if (std::find(v.merges.begin(), v.merges.end(), merge) != v.merges.end()) continue;
            v.merges.push_back(merge);
            if (std::find(v.tokens.begin(), v.tokens.end(), l + r) == v.tokens.end()) {
                v.tokens.push_back(l + r);
                v.types.push_back(TokenType::Normal);
                pool.push_back(l + r);
            }
        }
        const Tokenizer tok(v);
        for (int w = 0; w < 40; ++w) {
            std::string word(1 + rng() % 70, 'a');
            for (char& ch : word) ch = "abc"[rng() % 3];
            std::vector<int32_t> want;
            for (const auto& s : reference_bpe(word, v.merges)) want.push_back(*tok.find_token(s));
            ASSERT_EQ(tok.encode(word, false), want) << "trial " << trial << " word " << word;
        }
    }
}

TEST(Vocab, InconsistentVocabulariesAreRejected) {
    auto throws_with = [](Vocab v, const std::string& what) {
        try {
            Tokenizer t(std::move(v));
            ADD_FAILURE() << "no error, expected one mentioning " << what;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
        }
    };
    Vocab v = byte_vocab();
    v.types.pop_back();
    throws_with(v, "token types");

    v = byte_vocab();
    v.tokens[0x41] = "A_";  // no token for byte 'A' any more
    throws_with(v, "byte 0x41");

    v = byte_vocab();
    v.merges = {"a b"};  // "ab" is not a token
    throws_with(v, "merge 0 'a b'");

    v = byte_vocab();
    v.merges = {"ab"};
    throws_with(v, "not two tokens");

    v = byte_vocab();
    v.eos_id = 256;
    throws_with(v, "eos_id");

    v = byte_vocab();
    v.types[3] = static_cast<TokenType>(9);
    throws_with(v, "unknown type 9");
}

TEST(Vocab, OutOfRangeIdsThrowOnDecode) {
    const Tokenizer tok(byte_vocab());
    EXPECT_THROW(tok.token_bytes(256), Error);
    EXPECT_THROW(tok.token_bytes(-1), Error);
    EXPECT_THROW(tok.decode({1, 2, 999}), Error);
    EXPECT_EQ(tok.decode({0x68, 0x69}), "hi");
}

// Special tokens: leftmost, then longest; UserDefined too; parse_special=false ignores them.
TEST(Vocab, SpecialTokensLeftmostLongest) {
    Vocab v = byte_vocab();
    for (const char* s : {"<a>", "<a><b>", "<b>"}) {
        v.tokens.push_back(s);
        v.types.push_back(std::string(s) == "<b>" ? TokenType::UserDefined : TokenType::Control);
    }
    const Tokenizer tok(v);
    EXPECT_EQ(tok.encode("x<a><b><b>", true), (std::vector<int32_t>{'x', 257, 258}));
    EXPECT_EQ(tok.encode("<<a>", true), (std::vector<int32_t>{'<', 256}));
    EXPECT_EQ(tok.encode("<a>", false), (std::vector<int32_t>{'<', 'a', '>'}));
    EXPECT_EQ(tok.decode({256, 'z', 258}), "<a>z<b>");
}

std::string write_file(const std::string& name, const std::string& text) {
    const std::string dir = testing::TempDir() + "alloy_tok_" + std::to_string(::getpid()) + "_" + name;
    std::filesystem::create_directories(dir);
    const std::string path = dir + "/tokenizer.json";
    std::ofstream(path) << text;
    return path;
}

std::string tiny_json(const std::string& merges, const std::string& normalizer, const std::string& regex_extra) {
    nlohmann::json vocab = nlohmann::json::object();
    for (int b = 0; b < 256; ++b) vocab[byte_unicode::from_byte(static_cast<uint8_t>(b))] = b;
    vocab["ab"] = 256;
    vocab["abc"] = 257;
    nlohmann::json j = {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::parse(merges)}}},
        {"normalizer", nlohmann::json::parse(normalizer)},
        {"added_tokens", {{{"id", 259}, {"content", "<think>"}, {"special", false}},
                          {{"id", 260}, {"content", "<|fim_pad|>"}, {"special", false}},
                          {{"id", 261}, {"content", "<|im_end|>"}, {"special", true}}}},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", std::string("\\p{L}+|\\s+") + regex_extra}}},
             {"behavior", "Isolated"}},
            {{"type", "ByteLevel"}, {"use_regex", false}}}}}},
    };
    return j.dump();
}

TEST(HfJson, ReadsBothMergeFormatsAndAddedTokenTypes) {
    const Tokenizer a = Tokenizer::from_hf_json(write_file("strings", tiny_json(R"(["a b", "ab c"])", "null", "")));
    const Tokenizer b = Tokenizer::from_hf_json(
        write_file("pairs", tiny_json(R"([["a", "b"], ["ab", "c"]])", R"({"type": "NFC"})", "|\\p{M}")));
    EXPECT_EQ(a.encode("abcab", false), (std::vector<int32_t>{257, 256}));
    EXPECT_EQ(b.encode("abcab", false), (std::vector<int32_t>{257, 256}));
    EXPECT_FALSE(a.vocab().nfc);
    EXPECT_TRUE(b.vocab().nfc);
    EXPECT_EQ(a.vocab().pre, PreTokenizer::Qwen2);
    EXPECT_EQ(b.vocab().pre, PreTokenizer::Qwen35);  // regex mentions \p{M}
    ASSERT_EQ(a.n_vocab(), 262);
    EXPECT_EQ(a.vocab().types[258], TokenType::Unused);  // hole in the ids
    EXPECT_EQ(a.vocab().tokens[258], "[PAD258]");
    EXPECT_EQ(a.vocab().types[259], TokenType::UserDefined);
    EXPECT_EQ(a.vocab().types[260], TokenType::Control);  // looks special, like the converter
    EXPECT_EQ(a.vocab().types[261], TokenType::Control);
    EXPECT_TRUE(a.is_end_of_generation(261));
    EXPECT_EQ(a.encode("ab<think>ab", true), (std::vector<int32_t>{256, 259, 256}));
}

TEST(HfJson, BadFilesNameTheFileAndField) {
    auto expect_error = [](const std::string& path, const std::string& what) {
        try {
            Tokenizer::from_hf_json(path);
            ADD_FAILURE() << "no error for " << path;
        } catch (const Error& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(path), std::string::npos) << msg;
            EXPECT_NE(msg.find(what), std::string::npos) << msg;
        }
    };
    expect_error(testing::TempDir() + "does_not_exist/tokenizer.json", "cannot open");
    expect_error(write_file("garbage", "{\"model\": [1, 2"), "not valid JSON");
    expect_error(write_file("nfkc", tiny_json(R"(["a b"])", R"({"type": "NFKC"})", "")), "NFKC");
    expect_error(write_file("badmerge", tiny_json(R"([["a", "b"], ["x", "y"]])", "null", "")), "merge 1");
    expect_error(write_file("mergetype", tiny_json(R"([17])", "null", "")), "model.merges");
    std::string no_vocab = tiny_json("[]", "null", "");
    no_vocab.replace(no_vocab.find("\"vocab\""), 7, "\"vocaX\"");
    expect_error(write_file("novocab", no_vocab), "model.vocab");
}

// The in-memory entry point (the fuzz target's): the same vocabulary as the file, errors
// named by the name given.
TEST(HfJson, TextEntryPointMatchesTheFile) {
    const std::string text = tiny_json(R"([["a", "b"], ["ab", "c"]])", "null", "");
    const Tokenizer a = Tokenizer::from_hf_json(write_file("text", text));
    const Tokenizer b = Tokenizer::from_hf_json_text(text, "mem/tokenizer.json");
    EXPECT_EQ(a.vocab().tokens, b.vocab().tokens);
    EXPECT_EQ(a.vocab().merges, b.vocab().merges);
    EXPECT_EQ(a.encode("abcab <think>", true), b.encode("abcab <think>", true));
    for (const std::string bad : {std::string("{\"model\": [1"), std::string("[]"), tiny_json("[17]", "null", "")}) {
        try {
            Tokenizer::from_hf_json_text(bad, "mem/tokenizer.json");
            ADD_FAILURE() << "no error for " << bad.substr(0, 40);
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("mem/tokenizer.json"), std::string::npos) << e.what();
        }
    }
}

}  // namespace
}  // namespace alloy
