#include "runtime/json_constraint.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <numeric>

#include "tokenizer/tokenizer.h"

namespace alloy {

namespace {

constexpr const char* kLiterals[3] = {"true", "false", "null"};
constexpr uint8_t kLiteralLen[3] = {4, 5, 4};

bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

JsonPrefix::JsonPrefix(bool object_only) : object_only_(object_only) {}

void JsonPrefix::value_done() {
    mode_ = depth_ == 0 ? kDone : kAfter;
    ws_ = 0;
}

bool JsonPrefix::value_start(unsigned char c) {
    if (depth_ == 0 && object_only_ && c != '{') return false;
    switch (c) {
    case '{':
    case '[':
        if (depth_ >= kMaxDepth) return false;
        if (c == '{') objects_ |= uint64_t(1) << depth_;
        else objects_ &= ~(uint64_t(1) << depth_);
        ++depth_;
        mode_ = c == '{' ? kObjFirst : kArrFirst;
        return true;
    case '"':
        mode_ = kString;
        key_ = false;
        return true;
    case '-': mode_ = kMinus; return true;
    case '0': mode_ = kZero; return true;
    case 't': case 'f': case 'n':
        mode_ = kLiteral;
        lo_ = c == 't' ? 0 : c == 'f' ? 1 : 2;
        left_ = 1;
        return true;
    default:
        if (c >= '1' && c <= '9') {
            mode_ = kInt;
            return true;
        }
        return false;
    }
}

// A number ends at the first byte that cannot continue it; that byte belongs to what follows.
bool JsonPrefix::number_end(unsigned char c) {
    value_done();
    return push(c);
}

bool JsonPrefix::push(unsigned char c) {
    switch (mode_) {
    case kDone:
        return false;  // the caller stops at the value's end: no trailing bytes
    case kValue: case kArrFirst: case kObjFirst: case kObjKey: case kColon: case kAfter: {
        // No whitespace before the top-level value: the text starts with it (a sampler fond of
        // whitespace tokens would otherwise pad the front); between tokens up to kMaxWhitespace.
        if (is_ws(c)) return (depth_ > 0 || mode_ != kValue) && ++ws_ <= kMaxWhitespace;
        ws_ = 0;
        switch (mode_) {
        case kValue: return value_start(c);
        case kArrFirst:
            if (c != ']') return value_start(c);
            break;  // closes below
        case kObjFirst:
            if (c == '}') break;
            [[fallthrough]];
        case kObjKey:
            if (c != '"') return false;
            mode_ = kString;
            key_ = true;
            return true;
        case kColon:
            if (c != ':') return false;
            mode_ = kValue;
            return true;
        default: {  // kAfter
            const bool in_object = (objects_ >> (depth_ - 1)) & 1;
            if (c == ',') {
                mode_ = in_object ? kObjKey : kValue;
                return true;
            }
            if (c != (in_object ? '}' : ']')) return false;
        }
        }
        --depth_;  // a container closes
        objects_ &= (uint64_t(1) << depth_) - 1;  // no stale bits: equal states compare equal
        value_done();
        return true;
    }
    case kString:
        if (c == '"') {
            if (key_) {
                key_ = false;
                mode_ = kColon;
            } else {
                value_done();
            }
            return true;
        }
        if (c == '\\') {
            mode_ = kEscape;
            return true;
        }
        if (c < 0x20) return false;  // control characters must be escaped
        if (c < 0x80) return true;
        // A UTF-8 lead byte and the range of the byte after it (no overlongs, no surrogates,
        // nothing past U+10FFFF), as the Unicode standard's table 3-7.
        lo_ = 0x80;
        hi_ = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) left_ = 1;
        else if (c == 0xE0) left_ = 2, lo_ = 0xA0;
        else if (c == 0xED) left_ = 2, hi_ = 0x9F;
        else if (c >= 0xE1 && c <= 0xEF) left_ = 2;
        else if (c == 0xF0) left_ = 3, lo_ = 0x90;
        else if (c >= 0xF1 && c <= 0xF3) left_ = 3;
        else if (c == 0xF4) left_ = 3, hi_ = 0x8F;
        else return false;
        mode_ = kUtf8;
        return true;
    case kUtf8:
        if (c < lo_ || c > hi_) return false;
        lo_ = 0x80;
        hi_ = 0xBF;
        if (--left_ == 0) mode_ = kString;
        return true;
    case kEscape:
        if (c == 'u') {
            mode_ = kHex;
            left_ = 4;
            lo_ = 0;
            return true;
        }
        if (!std::strchr("\"\\/bfnrt", c) || c == 0) return false;
        mode_ = kString;
        return true;
    case kHex:
        if (!is_hex(c)) return false;
        if (left_ == 4) lo_ = c == 'd' || c == 'D';
        else if (left_ == 3 && lo_ && !(c >= '0' && c <= '7')) return false;  // \uD800-\uDFFF
        if (--left_ == 0) mode_ = kString;
        return true;
    case kMinus:
        if (c == '0') mode_ = kZero;
        else if (c >= '1' && c <= '9') mode_ = kInt;
        else return false;
        return true;
    case kZero:
    case kInt:
        if (mode_ == kInt && is_digit(c)) return true;
        if (c == '.') mode_ = kDot;
        else if (c == 'e' || c == 'E') mode_ = kExp;
        else return number_end(c);
        return true;
    case kDot:
        if (!is_digit(c)) return false;
        mode_ = kFrac;
        return true;
    case kFrac:
        if (is_digit(c)) return true;
        if (c == 'e' || c == 'E') {
            mode_ = kExp;
            return true;
        }
        return number_end(c);
    case kExp:
        if (c == '+' || c == '-') mode_ = kExpSign;
        else if (is_digit(c)) mode_ = kExpDigits;
        else return false;
        return true;
    case kExpSign:
        if (!is_digit(c)) return false;
        mode_ = kExpDigits;
        return true;
    case kExpDigits:
        if (is_digit(c)) return true;
        return number_end(c);
    case kLiteral:
        if (c != static_cast<unsigned char>(kLiterals[lo_][left_])) return false;
        if (++left_ == kLiteralLen[lo_]) value_done();
        return true;
    }
    return false;
}

bool JsonPrefix::push(std::string_view bytes) {
    for (char c : bytes)
        if (!push(static_cast<unsigned char>(c))) return false;
    return true;
}

bool JsonPrefix::complete() const {
    if (mode_ == kDone) return true;
    return depth_ == 0 && (mode_ == kZero || mode_ == kInt || mode_ == kFrac || mode_ == kExpDigits);
}

// The shortest completion: a closer per open container, plus what the current token of the
// grammar needs (a key string still needs its quote, ':' and a one-byte value such as 0).
int JsonPrefix::min_to_complete() const {
    const int after_string = key_ ? 3 : 1;  // '"' (+ ':' and a value for a key)
    int local = 0;
    switch (mode_) {
    case kValue: local = depth_ == 0 && object_only_ ? 2 : 1; break;
    case kObjKey: local = 4; break;        // "":0
    case kColon: local = 2; break;         // :0
    case kString: local = after_string; break;
    case kEscape: local = 1 + after_string; break;
    case kHex: case kUtf8: local = left_ + after_string; break;
    case kMinus: case kDot: case kExp: case kExpSign: local = 1; break;
    case kLiteral: local = kLiteralLen[lo_] - left_; break;
    default: break;  // kArrFirst, kObjFirst, kAfter, kDone, complete numbers
    }
    return local + depth_;
}

bool JsonPrefix::operator==(const JsonPrefix& o) const {
    return objects_ == o.objects_ && depth_ == o.depth_ && mode_ == o.mode_ && left_ == o.left_ && lo_ == o.lo_ &&
           hi_ == o.hi_ && ws_ == o.ws_ && key_ == o.key_ && object_only_ == o.object_only_;
}

size_t JsonPrefix::hash() const {
    uint64_t h = objects_ * 0x9E3779B97F4A7C15ull;
    const uint64_t small = uint64_t(depth_) | uint64_t(mode_) << 8 | uint64_t(left_) << 16 | uint64_t(lo_) << 24 |
                           uint64_t(hi_) << 32 | uint64_t(ws_) << 40 | uint64_t(key_) << 48 | uint64_t(object_only_) << 49;
    h ^= small + 0x7F4A7C159E3779B9ull + (h << 6) + (h >> 2);
    return size_t(h);
}

JsonTokenMask::JsonTokenMask(const Tokenizer& tokenizer, int n_vocab) : n_vocab_(n_vocab), bytes_(size_t(n_vocab)) {
    const Vocab& v = tokenizer.vocab();
    const int n_text = std::min(n_vocab, tokenizer.n_vocab());
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < n_text; ++id) {
        const TokenType t = v.types[size_t(id)];
        if (t != TokenType::Normal && t != TokenType::Byte) continue;
        bytes_[size_t(id)] = tokenizer.token_bytes(id);
        if (!bytes_[size_t(id)].empty()) ids.push_back(id);
    }
    {
        JsonPrefix in_string;
        in_string.push("{\"a\":\"");
        for (int32_t id : ids) {
            const std::string& b = bytes_[size_t(id)];
            if (b.find_first_of("\"\\") != std::string::npos) {
                string_other_.push_back(id);
                continue;
            }
            JsonPrefix t = in_string;
            if (t.push(b)) string_text_.emplace_back(id, uint8_t(t.utf8_left()));
        }
        std::sort(string_text_.begin(), string_text_.end());  // by id: the mask is written in address order
        std::sort(string_other_.begin(), string_other_.end());
    }
    // The trie, breadth first: a node's children are contiguous; the tokens sorted by bytes,
    // so those ending at a node (a common prefix of length = its depth) are contiguous too.
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return bytes_[size_t(a)] < bytes_[size_t(b)]; });
    toks_ = ids;
    struct Todo {
        uint32_t node, begin, end, depth;  // tokens toks_[begin, end) share the node's depth bytes
    };
    nodes_.emplace_back();
    std::deque<Todo> todo{{0, 0, uint32_t(ids.size()), 0}};
    while (!todo.empty()) {
        const Todo t = todo.front();
        todo.pop_front();
        uint32_t i = t.begin;
        while (i < t.end && bytes_[size_t(toks_[i])].size() == t.depth) ++i;
        nodes_[t.node].tok_begin = t.begin;
        nodes_[t.node].tok_end = i;
        nodes_[t.node].child_begin = uint32_t(nodes_.size());
        while (i < t.end) {
            const unsigned char b = static_cast<unsigned char>(bytes_[size_t(toks_[i])][t.depth]);
            uint32_t j = i;
            while (j < t.end && static_cast<unsigned char>(bytes_[size_t(toks_[j])][t.depth]) == b) ++j;
            Node child;
            child.byte = b;
            todo.push_back({uint32_t(nodes_.size()), i, j, t.depth + 1});
            nodes_.push_back(child);
            i = j;
        }
        nodes_[t.node].child_end = uint32_t(nodes_.size());
    }
}

void JsonTokenMask::scan(const JsonPrefix& s, std::vector<uint16_t>& out) const {
    out.assign(size_t(n_vocab_), kRefused);
    if (s.in_string()) {
        const int base = s.min_to_complete();
        for (const auto& [id, extra] : string_text_) out[size_t(id)] = uint16_t(std::min(base + extra, int(kRefused) - 1));
        for (int32_t id : string_other_) {
            JsonPrefix next = s;
            if (next.push(bytes_[size_t(id)])) out[size_t(id)] = uint16_t(std::min(next.min_to_complete(), int(kRefused) - 1));
        }
        return;
    }
    std::vector<std::pair<uint32_t, JsonPrefix>> stack{{0, s}};
    while (!stack.empty()) {
        const auto [n, state] = stack.back();
        stack.pop_back();
        const Node& node = nodes_[n];
        for (uint32_t c = node.child_begin; c < node.child_end; ++c) {
            JsonPrefix next = state;
            if (!next.push(nodes_[c].byte)) continue;  // every token below starts with these bytes
            const Node& child = nodes_[c];
            if (child.tok_begin < child.tok_end) {
                const uint16_t m = uint16_t(std::min(next.min_to_complete(), int(kRefused) - 1));
                for (uint32_t k = child.tok_begin; k < child.tok_end; ++k) out[size_t(toks_[k])] = m;
            }
            if (child.child_begin < child.child_end) stack.emplace_back(c, next);
        }
    }
}

const std::vector<uint16_t>& JsonTokenMask::after(const JsonPrefix& s) {
    if (auto it = index_.find(s); it != index_.end()) {
        ++hits_;
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
    }
    ++misses_;
    std::vector<uint16_t> out;
    if (lru_.size() >= kCacheEntries) {  // reuse the oldest entry's memory
        out = std::move(lru_.back().second);
        index_.erase(lru_.back().first);
        lru_.pop_back();
    }
    scan(s, out);
    lru_.emplace_front(s, std::move(out));
    index_.emplace(s, lru_.begin());
    return lru_.front().second;
}

}  // namespace alloy
