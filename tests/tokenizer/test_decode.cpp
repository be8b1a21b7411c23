// decode / token_bytes / StreamDecoder, and invalid UTF-8 input end to end.
#include <gtest/gtest.h>

#include <random>

#include "alloy/error.h"
#include "tokenizer/normalize.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_util.h"

namespace alloy {
namespace {

using test::show;

TEST(Decode, RoundTripsTheCorpus) {
    for (const auto& c : test::vectors()["cases"]) {
        const std::string text = c["text"];
        // Qwen3 normalizes to NFC first; the Qwen3.5 pipeline keeps the text byte for byte.
        EXPECT_EQ(test::qwen3().decode(test::qwen3().encode(text, true)), nfc_normalize(text)) << show(text);
        const auto& q35 = test::qwen3_vocab_qwen35_pipeline();
        EXPECT_EQ(q35.decode(q35.encode(text, true)), text) << show(text);
        EXPECT_EQ(q35.decode(q35.encode(text, false)), text) << show(text);
    }
}

TEST(Decode, ControlTokensDecodeToTheirText) {
    const auto& tok = test::qwen3();
    const std::string text = "<|im_start|>user\nhi<|im_end|>\n<think>\n</think>";
    const auto ids = tok.encode(text, true);
    EXPECT_EQ(ids.front(), *tok.find_token("<|im_start|>"));
    EXPECT_EQ(tok.decode(ids), text);
    EXPECT_EQ(tok.token_bytes(*tok.find_token("<|endoftext|>")), "<|endoftext|>");
    EXPECT_EQ(tok.token_bytes(*tok.find_token("\xC4\xA0the")), " the");  // "Ġthe"
}

TEST(Decode, EndOfGenerationAndSpecialIds) {
    const auto& tok = test::qwen3();
    EXPECT_EQ(tok.vocab().eos_id, 151645);  // tokenizer_config.json eos_token <|im_end|>
    EXPECT_EQ(tok.vocab().pad_id, 151643);  // pad_token <|endoftext|>
    EXPECT_EQ(tok.vocab().bos_id, -1);
    EXPECT_FALSE(tok.vocab().add_bos);
    EXPECT_TRUE(tok.vocab().nfc);
    EXPECT_EQ(tok.vocab().pre, PreTokenizer::Qwen2);
    EXPECT_EQ(tok.n_vocab(), 151669);
    EXPECT_TRUE(tok.is_end_of_generation(151645));
    EXPECT_TRUE(tok.is_end_of_generation(151643));
    EXPECT_FALSE(tok.is_end_of_generation(151644));
    EXPECT_FALSE(tok.is_end_of_generation(9707));
    EXPECT_EQ(tok.vocab().types[151667], TokenType::UserDefined);  // <think>
    EXPECT_EQ(tok.vocab().types[151644], TokenType::Control);      // <|im_start|>
}

// Pushes ids one at a time: every chunk is valid UTF-8 and the chunks add up to decode().
std::vector<std::string> stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
    StreamDecoder sd(tok);
    std::vector<std::string> chunks;
    for (int32_t id : ids) chunks.push_back(sd.push(id));
    chunks.push_back(sd.flush());
    return chunks;
}

TEST(StreamDecode, NeverEmitsHalfACharacter) {
    const auto& tok = test::qwen3();
    for (const auto& c : test::vectors()["cases"]) {
        const std::string text = c["text"];
        const auto ids = tok.encode(text, true);
        std::string joined;
        for (const auto& chunk : stream(tok, ids)) {
            EXPECT_TRUE(utf8::is_valid(chunk)) << show(text);
            joined += chunk;
        }
        EXPECT_EQ(joined, tok.decode(ids)) << show(text);
    }
    // The llama is 4 bytes spread over three tokens (" \xF0\x9F", "\xA6", "\x99"): nothing of it
    // may appear until its last byte has arrived.
    const auto ids = tok.encode(" \xF0\x9F\xA6\x99!", true);
    ASSERT_EQ(ids.size(), 4u);
    EXPECT_EQ(stream(tok, ids), (std::vector<std::string>{" ", "", "\xF0\x9F\xA6\x99", "!", ""}));
    // A CJK character split over two tokens.
    const auto ids2 = tok.encode("\xE5\xA4\xA9\xEF\xBD\x9E", true);  // 天～
    std::vector<std::string> chunks = stream(tok, ids2);
    for (const auto& ch : chunks) EXPECT_TRUE(utf8::is_valid(ch));
}

TEST(StreamDecode, InvalidBytesBecomeReplacementCharacters) {
    const Tokenizer& tok = test::qwen3();
    StreamDecoder sd(tok);
    // "\xF0\x9F" alone then "!": the lead bytes can never complete -> one U+FFFD, then "!".
    const auto lead = tok.encode(" \xF0\x9F\xA6\x99", false);  // first token: " \xF0\x9F"
    ASSERT_EQ(tok.token_bytes(lead[0]), " \xF0\x9F");
    EXPECT_EQ(sd.push(lead[0]), " ");
    EXPECT_EQ(sd.push(*tok.find_token("!")), "\xEF\xBF\xBD!");
    EXPECT_EQ(sd.push(lead[0]), " ");
    EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");  // truncated tail at the end
    EXPECT_EQ(sd.flush(), "");
}

// Random bytes (many invalid sequences) never throw and survive the round trip: exactly for
// the pipeline without NFC, and up to NFC of the valid runs for Qwen3.
TEST(InvalidUtf8, EncodeNeverThrowsAndRoundTrips) {
    std::mt19937 rng(99);
    const std::vector<std::string> atoms = {"a", " ", "\n", "\xC3\xA9", "e\xCC\x81", "\xE4\xB8\xAD", "\xF0\x9F\x98\x81",
                                            "<|im_end|>", "'s", "7", "\xFF", "\xC3", "\x80", "\xED\xA0\x80", "\xF4\x90"};
    for (int iter = 0; iter < 500; ++iter) {
        std::string s;
        const int n = 1 + rng() % 40;
        for (int k = 0; k < n; ++k) {
            if (rng() % 4 == 0) s += static_cast<char>(rng() % 256);
            else s += atoms[rng() % atoms.size()];
        }
        for (bool special : {false, true}) {
            const auto& q35 = test::qwen3_vocab_qwen35_pipeline();
            EXPECT_EQ(q35.decode(q35.encode(s, special)), s) << show(s);
            EXPECT_EQ(test::qwen3().decode(test::qwen3().encode(s, special)), nfc_normalize(s)) << show(s);
        }
        std::string joined;
        for (const auto& chunk : stream(test::qwen3(), test::qwen3().encode(s, true))) {
            EXPECT_TRUE(utf8::is_valid(chunk)) << show(s);
            joined += chunk;
        }
        EXPECT_EQ(joined, utf8::sanitize(nfc_normalize(s))) << show(s);
    }
}

TEST(InvalidUtf8, NfcLeavesInvalidBytesAlone) {
    EXPECT_EQ(nfc_normalize("e\xCC\x81\xFF" "e\xCC\x81"), "\xC3\xA9\xFF\xC3\xA9");
    EXPECT_EQ(nfc_normalize("\xC3"), "\xC3");
}

}  // namespace
}  // namespace alloy
