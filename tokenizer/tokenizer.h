// Byte-level BPE tokenizer (GPT-2 / Qwen style), loaded from GGUF metadata
// (tokenizer.ggml.*) or from a Hugging Face tokenizer.json. Facts: spec/GGUF.md sections 7-9.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace alloy {
namespace gguf { class File; }

enum class TokenType : int32_t {
    Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

// Which split regex the pre-tokenizer uses.
enum class PreTokenizer { Qwen2, Qwen35 };

struct Vocab {
    std::vector<std::string> tokens;   // id -> token text in byte-level (GPT-2 unicode) form
    std::vector<TokenType> types;      // id -> type; same length as tokens
    std::vector<std::string> merges;   // "left right", rank = index
    PreTokenizer pre = PreTokenizer::Qwen35;
    bool nfc = false;                  // apply NFC before splitting (HF json with NFC normalizer)
    int32_t eos_id = -1, pad_id = -1, bos_id = -1;
    bool add_bos = false;
    std::string chat_template;
};

class Tokenizer {
public:
    explicit Tokenizer(Vocab vocab);  // throws alloy::Error on inconsistent vocab
    ~Tokenizer();
    Tokenizer(Tokenizer&&) noexcept;
    Tokenizer& operator=(Tokenizer&&) noexcept;

    // Throws alloy::Error naming the file and key that was wrong.
    static Tokenizer from_gguf(const gguf::File& file);
    static Tokenizer from_hf_json(const std::string& path);
    // A .gguf path loads the GGUF vocabulary, anything else is read as tokenizer.json.
    static Tokenizer from_path(const std::string& path);

    // parse_special: match Control/UserDefined tokens verbatim before splitting.
    std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
    // Raw bytes of the tokens concatenated (may end in half a UTF-8 character).
    std::string decode(const std::vector<int32_t>& ids) const;
    std::string token_bytes(int32_t id) const;  // throws on out-of-range id

    int32_t n_vocab() const;
    std::optional<int32_t> find_token(std::string_view text) const;  // exact token text
    bool is_end_of_generation(int32_t id) const;  // eos, <|im_end|>, <|endoftext|>
    const Vocab& vocab() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// Streaming detokenizer: push ids one at a time, get back only complete UTF-8 characters;
// an incomplete tail is held until the next push (flush() returns whatever is left, with
// invalid bytes replaced by U+FFFD).
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
    std::string push(int32_t id);
    std::string flush();

private:
    const Tokenizer& tok_;
    std::string pending_;
};

// Qwen3.5 chat template (ChatML with thinking on/off), spec/GGUF.md section 9.
struct ChatMessage {
    std::string role;     // system | user | assistant | tool
    std::string content;
    std::string reasoning_content;  // assistant only, optional
};
std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, bool enable_thinking);

}  // namespace alloy
