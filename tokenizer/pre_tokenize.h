// Regex pre-tokenizer: splits text into the pieces that BPE then encodes one by one.
// Semantics of HF tokenizers' Split(Regex, behavior = Isolated): every match is a piece and
// every stretch between matches is a piece too (only invalid UTF-8 bytes ever fall between
// matches, because the alternatives of both regexes together cover every character).
#pragma once
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace alloy {

// The split regex exactly as written in the HF tokenizer.json of each family.
const char* pre_tokenizer_regex(PreTokenizer pre);

// Appends [begin, end) byte ranges of the pieces of `text` to `out` (cleared first).
void split_pieces(std::string_view text, PreTokenizer pre,
                  std::vector<std::pair<size_t, size_t>>& out);

}  // namespace alloy
