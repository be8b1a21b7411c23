// include/alloy/tokenize.h over the tokenizer.
#include "alloy/tokenize.h"

#include "tokenizer/tokenizer.h"

namespace alloy {

std::vector<int32_t> tokenize_text(const std::string& path, const std::string& text, bool parse_special) {
    return Tokenizer::from_path(path).encode(text, parse_special);
}

}  // namespace alloy
