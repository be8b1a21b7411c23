// StreamDecoder: holds back the bytes of a character that a later token will complete, so a
// streaming client never sees half an emoji or CJK character.
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace alloy {

std::string StreamDecoder::push(int32_t id) {
    pending_ += tok_.token_bytes(id);
    std::string out;
    size_t i = 0;
    while (i < pending_.size()) {
        size_t len = 0;
        const utf8::Seq seq = utf8::classify(pending_, i, &len);
        if (seq == utf8::Seq::Incomplete) break;  // only possible at the end: wait for more bytes
        if (seq == utf8::Seq::Complete) out.append(pending_, i, len);
        else out += "\xEF\xBF\xBD";  // can never become a character
        i += len;
    }
    pending_.erase(0, i);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out = utf8::sanitize(pending_);
    pending_.clear();
    return out;
}

}  // namespace alloy
