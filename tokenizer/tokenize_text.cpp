// include/alloy/tokenize.h over the tokenizer.
#include "alloy/tokenize.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "alloy/error.h"
#include "tokenizer/tokenizer.h"

namespace alloy {

std::vector<int32_t> tokenize_text(const std::string& path, const std::string& text, bool parse_special) {
    return Tokenizer::from_path(path).encode(text, parse_special);
}

void write_tokenizer_json(const std::string& path, const std::string& out_path) {
    const std::string text = vocab_to_hf_json(Tokenizer::from_path(path).vocab());
    FILE* f = std::fopen(out_path.c_str(), "wb");
    if (!f) throw Error(out_path + ": cannot create: " + std::strerror(errno));
    const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !ok) throw Error(out_path + ": write failed");
}

}  // namespace alloy
