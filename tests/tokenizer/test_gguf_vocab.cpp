// The vocabulary through GGUF: add_vocab_to_gguf -> gguf::Writer -> gguf::File -> from_gguf.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <functional>

#include "alloy/error.h"
#include "format/gguf.h"
#include "tokenizer/byte_unicode.h"
#include "tokenizer_test_util.h"

namespace alloy {
namespace {

std::string tmp_gguf(const std::string& name) {
    return testing::TempDir() + "alloy_tok_" + std::to_string(::getpid()) + "_" + name + ".gguf";
}

TEST(GgufVocab, RoundTripGivesIdenticalEncodings) {
    const Tokenizer& hf = test::qwen3();
    gguf::Writer w;
    w.set("general.architecture", gguf::Value::str("qwen35"));
    add_vocab_to_gguf(hf.vocab(), w);
    const std::string path = tmp_gguf("roundtrip");
    w.write(path);

    auto file = gguf::File::open(path);
    EXPECT_EQ(file->get_string("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(file->get_string("tokenizer.ggml.pre"), "qwen2");
    EXPECT_EQ(file->find("tokenizer.ggml.token_type")->elem_type, gguf::ValueType::INT32);
    EXPECT_EQ(file->get_u32("tokenizer.ggml.eos_token_id"), 151645u);
    EXPECT_EQ(file->get_u32("tokenizer.ggml.padding_token_id"), 151643u);
    EXPECT_FALSE(file->has("tokenizer.ggml.bos_token_id"));
    EXPECT_FALSE(file->get_bool_or("tokenizer.ggml.add_bos_token", true));
    EXPECT_EQ(file->get_string("tokenizer.chat_template"), hf.vocab().chat_template);
    EXPECT_EQ(file->get_string_array("tokenizer.ggml.merges")[2], "i n");

    const Tokenizer g = Tokenizer::from_gguf(*file);
    EXPECT_EQ(g.vocab().tokens, hf.vocab().tokens);
    EXPECT_EQ(g.vocab().types, hf.vocab().types);
    EXPECT_EQ(g.vocab().merges, hf.vocab().merges);
    EXPECT_EQ(g.vocab().nfc, hf.vocab().nfc);
    int bad = 0;
    for (const auto& c : test::vectors()["cases"]) {
        const std::string text = c["text"];
        for (bool special : {true, false}) bad += g.encode(text, special) != hf.encode(text, special);
    }
    EXPECT_EQ(bad, 0);

    const Tokenizer p = Tokenizer::from_path(path);  // .gguf suffix -> GGUF
    EXPECT_EQ(p.encode("<|im_start|>user\nhi", true), hf.encode("<|im_start|>user\nhi", true));
    std::remove(path.c_str());
}

// A small vocabulary written with one key changed; from_gguf must name the key and value.
void expect_gguf_error(const std::string& name, const std::function<void(gguf::Writer&)>& edit,
                       const std::string& what) {
    Vocab v;
    for (int b = 0; b < 256; ++b) {
        v.tokens.push_back(byte_unicode::from_byte(static_cast<uint8_t>(b)));
        v.types.push_back(TokenType::Normal);
    }
    gguf::Writer w;
    add_vocab_to_gguf(v, w);
    edit(w);
    const std::string path = tmp_gguf(name);
    w.write(path);
    auto file = gguf::File::open(path);
    try {
        Tokenizer::from_gguf(*file);
        ADD_FAILURE() << "no error for " << name;
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(path), std::string::npos) << msg;
        EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
    std::remove(path.c_str());
}

TEST(GgufVocab, BadMetadataIsNamed) {
    expect_gguf_error("model", [](gguf::Writer& w) { w.set("tokenizer.ggml.model", gguf::Value::str("llama")); },
                      "tokenizer.ggml.model is 'llama'");
    expect_gguf_error("pre", [](gguf::Writer& w) { w.set("tokenizer.ggml.pre", gguf::Value::str("llama-bpe")); },
                      "'llama-bpe'");
    expect_gguf_error("types", [](gguf::Writer& w) { w.set("tokenizer.ggml.token_type", gguf::Value::i32_array({1, 1})); },
                      "tokenizer.ggml.token_type has 2");
    expect_gguf_error("typeval", [](gguf::Writer& w) {
        std::vector<int32_t> t(256, 1);
        t[17] = 9;
        w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(t));
    }, "tokenizer.ggml.token_type[17] = 9");
    expect_gguf_error("eos", [](gguf::Writer& w) { w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(300)); },
                      "tokenizer.ggml.eos_token_id = 300");
    expect_gguf_error("merge", [](gguf::Writer& w) { w.set("tokenizer.ggml.merges", gguf::Value::str_array({"a b"})); },
                      "merge 0");
    expect_gguf_error("notokens", [](gguf::Writer& w) { w.set("tokenizer.ggml.tokens", gguf::Value::str("x")); },
                      "tokenizer.ggml.tokens");
}

}  // namespace
}  // namespace alloy
