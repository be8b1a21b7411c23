// NFC normalization (utf8proc) that tolerates invalid UTF-8: only maximal valid runs are
// normalized, invalid bytes are copied through unchanged.
#pragma once
#include <string>
#include <string_view>

namespace alloy {

std::string nfc_normalize(std::string_view text);

}  // namespace alloy
