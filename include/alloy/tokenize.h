// Public API: token ids of a text with the vocabulary of a GGUF model or of a Hugging Face
// tokenizer.json (no weights loaded).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace alloy {

// parse_special: special and added tokens (<|im_start|>, ...) are matched verbatim; else all of
// the text is plain text. Throws alloy::Error naming the file (and key) that is wrong.
std::vector<int32_t> tokenize_text(const std::string& model_or_tokenizer_json, const std::string& text,
                                   bool parse_special);

// Writes the vocabulary of a GGUF model, a tokenizer.json or a .tiktoken ranks file (Qwen3.5's)
// as a Hugging Face tokenizer.json at out_path; throws alloy::Error naming the file.
void write_tokenizer_json(const std::string& model_or_tokenizer, const std::string& out_path);

}  // namespace alloy
