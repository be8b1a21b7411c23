// Tokenizer::from_hf_json: reads a Hugging Face tokenizer.json (byte-level BPE only) and,
// when it sits next to it, tokenizer_config.json (eos/pad/bos tokens, add_bos_token,
// chat_template), the files llama.cpp's converter reads for the same keys.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "alloy/error.h"
#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

using nlohmann::json;

json parse_json(std::string_view text, const std::string& name) {
    try {
        return json::parse(text);
    } catch (const json::exception& e) {
        throw Error(name + ": not valid JSON: " + e.what());
    }
}

json read_json(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return parse_json(ss.str(), path);
}

// llama.cpp's converter also marks added tokens that merely look special (<|...|>) as
// CONTROL even when tokenizer.json says special=false (e.g. <|fim_prefix|>); we do the same
// so a vocabulary written to GGUF matches what the converter writes.
bool looks_special(const std::string& t) {
    return t.size() >= 4 && t.compare(0, 2, "<|") == 0 && t.compare(t.size() - 2, 2, "|>") == 0;
}

// A special token in tokenizer_config.json is either "text" or {"content": "text", ...}.
std::optional<std::string> token_text(const json& cfg, const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return std::nullopt;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
        return (*it)["content"].get<std::string>();
    return std::nullopt;
}

void read_config(const std::string& path, Vocab& v) {
    const json cfg = read_json(path);
    if (!cfg.is_object()) throw Error(path + ": top level is not an object");
    auto id_of = [&](const char* key) -> int32_t {
        auto text = token_text(cfg, key);
        if (!text) return -1;
        for (size_t i = 0; i < v.tokens.size(); ++i)
            if (v.tokens[i] == *text) return static_cast<int32_t>(i);
        throw Error(path + ": " + key + " '" + *text + "' is not a token of the vocabulary");
    };
    v.eos_id = id_of("eos_token");
    v.pad_id = id_of("pad_token");
    v.bos_id = id_of("bos_token");
    if (auto it = cfg.find("add_bos_token"); it != cfg.end() && it->is_boolean()) v.add_bos = it->get<bool>();
    if (auto it = cfg.find("chat_template"); it != cfg.end()) {
        if (it->is_string()) {
            v.chat_template = it->get<std::string>();
        } else if (it->is_array()) {  // [{"name": "default", "template": "..."}, ...]
            for (const auto& t : *it)
                if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
                    t["template"].is_string())
                    v.chat_template = t["template"].get<std::string>();
        }
    }
}

// The Split regex of the pre-tokenizer decides the family: Qwen3.5 adds \p{M}.
PreTokenizer read_pre_tokenizer(const json& j, const std::string& path) {
    const json& pt = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json();
    std::vector<json> steps;
    if (pt.is_object() && pt.value("type", "") == "Sequence" && pt.contains("pretokenizers"))
        for (const auto& s : pt["pretokenizers"]) steps.push_back(s);
    else if (pt.is_object())
        steps.push_back(pt);
    std::string regex;
    bool byte_level = false;
    for (const auto& s : steps) {
        const std::string type = s.value("type", "");
        if (type == "Split" && s.contains("pattern") && s["pattern"].is_object() &&
            s["pattern"].contains("Regex") && s["pattern"]["Regex"].is_string()) {
            regex = s["pattern"]["Regex"].get<std::string>();
            if (s.value("behavior", "") != "Isolated")
                throw Error(path + ": pre_tokenizer Split behavior '" + s.value("behavior", "") +
                            "' is not supported (only Isolated)");
        } else if (type == "ByteLevel") {
            if (s.value("use_regex", true))
                throw Error(path + ": pre_tokenizer ByteLevel with use_regex (GPT-2 regex) is not supported");
            byte_level = true;
        } else {
            throw Error(path + ": pre_tokenizer type '" + type + "' is not supported");
        }
    }
    if (regex.empty() || !byte_level)
        throw Error(path + ": pre_tokenizer is not a Split regex followed by ByteLevel");
    return regex.find("\\p{M}") != std::string::npos ? PreTokenizer::Qwen35 : PreTokenizer::Qwen2;
}

bool read_normalizer(const json& j, const std::string& path) {
    if (!j.contains("normalizer") || j["normalizer"].is_null()) return false;
    const json& n = j["normalizer"];
    const std::string type = n.value("type", "");
    if (type == "NFC") return true;
    if (type == "Sequence" && n.contains("normalizers")) {
        bool nfc = false;
        for (const auto& s : n["normalizers"]) {
            if (s.value("type", "") != "NFC")
                throw Error(path + ": normalizer '" + s.value("type", "") + "' is not supported");
            nfc = true;
        }
        return nfc;
    }
    throw Error(path + ": normalizer '" + type + "' is not supported (only NFC)");
}

// The vocabulary of a parsed tokenizer.json; `path` names it in errors; `config`, when not
// empty, is a tokenizer_config.json to read too.
Tokenizer from_json(const json& j, const std::string& path, const std::string& config) {
    try {
        if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
            throw Error(path + ": no 'model' object");
        const json& model = j["model"];
        if (model.value("type", "BPE") != "BPE")
            throw Error(path + ": model.type '" + model.value("type", "") + "' is not BPE");
        if (!model.contains("vocab") || !model["vocab"].is_object())
            throw Error(path + ": model.vocab is missing or not an object");

        Vocab v;
        // id -> text over vocab and added tokens; holes become [PAD{id}] UNUSED like the converter.
        std::vector<std::string> tokens;
        std::vector<TokenType> types;
        auto put = [&](int64_t id, const std::string& text, TokenType type, const char* where) {
            if (id < 0 || id > (1 << 24))
                throw Error(path + ": " + where + " id " + std::to_string(id) + " for '" + text + "' is out of range");
            if (static_cast<size_t>(id) >= tokens.size()) {
                tokens.resize(id + 1);
                types.resize(id + 1, TokenType::Unused);
            }
            tokens[id] = text;
            types[id] = type;
        };
        for (const auto& [text, id] : model["vocab"].items()) {
            if (!id.is_number_integer()) throw Error(path + ": model.vocab['" + text + "'] is not an integer");
            put(id.get<int64_t>(), text, TokenType::Normal, "model.vocab");
        }
        if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
            for (const auto& t : j["added_tokens"]) {
                if (!t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
                    !t["content"].is_string())
                    throw Error(path + ": added_tokens entry without integer id and string content");
                const std::string text = t["content"].get<std::string>();
                const bool special = t.value("special", false) || looks_special(text);
                put(t["id"].get<int64_t>(), text, special ? TokenType::Control : TokenType::UserDefined,
                    "added_tokens");
            }
        }
        for (size_t id = 0; id < tokens.size(); ++id)
            if (types[id] == TokenType::Unused) tokens[id] = "[PAD" + std::to_string(id) + "]";
        v.tokens = std::move(tokens);
        v.types = std::move(types);

        if (!model.contains("merges") || !model["merges"].is_array())
            throw Error(path + ": model.merges is missing or not an array");
        v.merges.reserve(model["merges"].size());
        for (const auto& m : model["merges"]) {
            if (m.is_string()) {
                v.merges.push_back(m.get<std::string>());  // older files: "left right"
            } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
                v.merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
            } else {
                throw Error(path + ": model.merges entry " + std::to_string(v.merges.size()) +
                            " is neither \"a b\" nor [a, b]");
            }
        }
        v.nfc = read_normalizer(j, path);
        v.pre = read_pre_tokenizer(j, path);

        if (!config.empty()) read_config(config, v);
        try {
            return Tokenizer(std::move(v));
        } catch (const Error& e) {
            throw Error(path + ": " + e.what());  // vocabulary inconsistencies, named by file
        }
    } catch (const json::exception& e) {
        throw Error(path + ": unexpected JSON structure: " + e.what());
    }
}

}  // namespace

Tokenizer Tokenizer::from_hf_json(const std::string& path) {
    const auto cfg = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
    return from_json(read_json(path), path, std::filesystem::exists(cfg) ? cfg.string() : std::string());
}

Tokenizer Tokenizer::from_hf_json_text(std::string_view text, const std::string& name) {
    return from_json(parse_json(text, name), name, std::string());
}

}  // namespace alloy
