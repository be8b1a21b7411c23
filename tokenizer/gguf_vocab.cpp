// The vocabulary as GGUF metadata (tokenizer.ggml.*, spec/GGUF.md section 7): reading it in
// Tokenizer::from_gguf and writing it like llama.cpp's converter in add_vocab_to_gguf.
#include "alloy/error.h"
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

namespace alloy {

const char* pre_tokenizer_name(PreTokenizer pre) {
    return pre == PreTokenizer::Qwen2 ? "qwen2" : "qwen35";
}

Tokenizer Tokenizer::from_gguf(const gguf::File& f) {
    const std::string& path = f.path();
    const std::string model = f.get_string("tokenizer.ggml.model");
    if (model != "gpt2")
        throw Error(path + ": tokenizer.ggml.model is '" + model + "', only 'gpt2' (byte-level BPE) is supported");

    Vocab v;
    const std::string pre = f.get_string("tokenizer.ggml.pre");
    if (pre == "qwen2") v.pre = PreTokenizer::Qwen2;
    else if (pre == "qwen35") v.pre = PreTokenizer::Qwen35;
    else throw Error(path + ": tokenizer.ggml.pre is '" + pre + "', expected 'qwen2' or 'qwen35'");
    // GGUF has no normalizer key. The HF tokenizers of the qwen2 family (Qwen2/2.5/3) apply
    // NFC, Qwen3.5's does not; we follow HF (llama.cpp skips NFC for both).
    v.nfc = v.pre == PreTokenizer::Qwen2;

    v.tokens = f.get_string_array("tokenizer.ggml.tokens");
    const std::vector<int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != v.tokens.size())
        throw Error(path + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                    " entries but tokenizer.ggml.tokens has " + std::to_string(v.tokens.size()));
    v.types.reserve(types.size());
    for (size_t i = 0; i < types.size(); ++i) {
        if (types[i] < 1 || types[i] > 6)
            throw Error(path + ": tokenizer.ggml.token_type[" + std::to_string(i) + "] = " +
                        std::to_string(types[i]) + " is not a token type (1..6)");
        v.types.push_back(static_cast<TokenType>(types[i]));
    }
    if (f.has("tokenizer.ggml.merges")) v.merges = f.get_string_array("tokenizer.ggml.merges");

    const auto n = static_cast<int64_t>(v.tokens.size());
    auto read_id = [&](const char* key) -> int32_t {
        if (!f.has(key)) return -1;
        const uint32_t id = f.get_u32(key);
        if (static_cast<int64_t>(id) >= n)
            throw Error(path + ": " + key + " = " + std::to_string(id) + " is outside the vocabulary of " +
                        std::to_string(n) + " tokens");
        return static_cast<int32_t>(id);
    };
    v.eos_id = read_id("tokenizer.ggml.eos_token_id");
    v.pad_id = read_id("tokenizer.ggml.padding_token_id");
    v.bos_id = read_id("tokenizer.ggml.bos_token_id");
    v.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
    v.chat_template = f.get_string_or("tokenizer.chat_template", "");
    try {
        return Tokenizer(std::move(v));
    } catch (const Error& e) {
        throw Error(path + ": tokenizer.ggml.*: " + e.what());
    }
}

void pad_vocab(Vocab& v, size_t n_tokens, const std::string& what) {
    if (v.tokens.size() > n_tokens)
        throw Error(what + ": the vocabulary has " + std::to_string(v.tokens.size()) + " tokens, more than the " +
                    std::to_string(n_tokens) + " rows of the embedding");
    v.types.resize(v.tokens.size(), TokenType::Normal);
    while (v.tokens.size() < n_tokens) {
        v.tokens.push_back("[PAD" + std::to_string(v.tokens.size()) + "]");
        v.types.push_back(TokenType::Unused);
    }
}

void add_vocab_to_gguf(const Vocab& v, gguf::Writer& w) {
    std::vector<int32_t> types;
    types.reserve(v.types.size());
    for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
    // Same keys, types and order as gguf-py's add_tokenizer_model/add_tokenizer_pre/
    // add_token_list/add_token_types/add_token_merges, then SpecialVocab's ids and flags.
    w.set("tokenizer.ggml.model", gguf::Value::str("gpt2"));
    w.set("tokenizer.ggml.pre", gguf::Value::str(pre_tokenizer_name(v.pre)));
    w.set("tokenizer.ggml.tokens", gguf::Value::str_array(v.tokens));
    w.set("tokenizer.ggml.token_type", gguf::Value::i32_array(std::move(types)));
    w.set("tokenizer.ggml.merges", gguf::Value::str_array(v.merges));
    if (v.bos_id >= 0) w.set("tokenizer.ggml.bos_token_id", gguf::Value::u32(static_cast<uint32_t>(v.bos_id)));
    if (v.eos_id >= 0) w.set("tokenizer.ggml.eos_token_id", gguf::Value::u32(static_cast<uint32_t>(v.eos_id)));
    if (v.pad_id >= 0) w.set("tokenizer.ggml.padding_token_id", gguf::Value::u32(static_cast<uint32_t>(v.pad_id)));
    w.set("tokenizer.ggml.add_bos_token", gguf::Value::boolean(v.add_bos));
    if (!v.chat_template.empty()) w.set("tokenizer.chat_template", gguf::Value::str(v.chat_template));
}

}  // namespace alloy
