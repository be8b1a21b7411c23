// A sharded HF checkpoint seen as one set of tensors.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "alloy/error.h"
#include "format/safetensors.h"

namespace alloy {

namespace fs = std::filesystem;

namespace {

// Shard file names from model.safetensors.index.json's "weight_map" (tensor -> file).
std::map<std::string, std::string> read_index(const fs::path& index) {
    std::ifstream in(index);
    if (!in) throw Error(index.string() + ": cannot open");
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
        throw Error(index.string() + ": invalid JSON: " + e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        throw Error(index.string() + ": missing \"weight_map\" object");
    }
    std::map<std::string, std::string> map;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) throw Error(index.string() + ": weight_map['" + it.key() + "'] is not a string");
        const std::string file = it.value().get<std::string>();
        // Shards live next to the index; a path component would escape the checkpoint.
        if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
            throw Error(index.string() + ": weight_map['" + it.key() + "'] names bad shard file '" + file + "'");
        }
        map.emplace(it.key(), file);
    }
    return map;
}

}  // namespace

std::unique_ptr<SafetensorsDir> SafetensorsDir::open(const std::string& dir) {
    std::unique_ptr<SafetensorsDir> d(new SafetensorsDir());
    const fs::path root(dir);
    std::error_code ec;
    std::vector<fs::path> shards;
    std::map<std::string, std::string> weight_map;
    if (fs::is_regular_file(root, ec)) {
        shards.push_back(root);
    } else if (!fs::is_directory(root, ec)) {
        throw Error(dir + ": not a file or directory");
    } else if (fs::exists(root / "model.safetensors.index.json", ec)) {
        weight_map = read_index(root / "model.safetensors.index.json");
        std::set<std::string> names;
        for (const auto& [tensor, file] : weight_map) names.insert(file);
        for (const std::string& f : names) shards.push_back(root / f);
    } else if (fs::exists(root / "model.safetensors", ec)) {
        shards.push_back(root / "model.safetensors");
    } else {
        for (const auto& e : fs::directory_iterator(root, ec)) {
            if (e.path().extension() == ".safetensors") shards.push_back(e.path());
        }
        if (ec) throw Error(dir + ": cannot list directory: " + ec.message());
        std::sort(shards.begin(), shards.end());
    }
    if (shards.empty()) throw Error(dir + ": no .safetensors files");

    std::map<std::string, std::string> owner;  // tensor -> shard file name, for errors
    for (const fs::path& p : shards) {
        d->files_.push_back(SafetensorsFile::open(p.string()));
        for (const Tensor& t : d->files_.back()->tensors()) {
            auto [it, fresh] = owner.emplace(t.name, p.filename().string());
            if (!fresh) {
                throw Error(p.string() + ": tensor '" + t.name + "' also present in shard " + it->second);
            }
            d->index_.emplace(t.name, &t);
        }
    }
    for (const auto& [tensor, file] : weight_map) {
        auto it = owner.find(tensor);
        if (it == owner.end() || it->second != file) {
            throw Error(dir + ": index lists tensor '" + tensor + "' in " + file + " but it is not there");
        }
    }
    for (const auto& [name, t] : d->index_) d->tensors_.push_back(t);
    return d;
}

const SafetensorsFile::Tensor* SafetensorsDir::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : it->second;
}

}  // namespace alloy
