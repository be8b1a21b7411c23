#include "cli/common.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "alloy/error.h"

namespace alloy::cli {

void ModelOptions::add_to(CLI::App* cmd, bool model_required) {
    auto* m = cmd->add_option("-m,--model", model, "GGUF model: a file, or a name in the models folder ($ALLOY_MODELS, default ~/.cache/alloy/models)");
    if (model_required) m->required();
    cmd->add_option("--gdn", gdn, "GDN prefill kernel: serial | chunked")->capture_default_str();
    cmd->add_option("--chunk", chunk, "GDN chunk size for the chunked kernel")->capture_default_str();
    cmd->add_option("-c,--ctx", ctx, "context size in tokens")->capture_default_str();
    cmd->add_option("-t,--threads", threads, "threads (0 = all cores)")->capture_default_str();
    cmd->add_option("-b,--batch-size", batch,
                    "longest prefill piece in tokens (a multiple of --chunk; default 512, 4096 with --backend cuda)");
    cmd->add_option("--cache-type-k", cache_type_k, "-ctk: KV cache type for K: f32 | f16 | bf16")->capture_default_str();
    cmd->add_option("--cache-type-v", cache_type_v, "-ctv: KV cache type for V: f32 | f16 | bf16")->capture_default_str();
    cmd->add_flag("--mmap", mmap, "use the file mapping for the weights instead of reading them into memory "
                                   "(faster start; slower decode)");
    cmd->add_option("--backend", backend, "where the model runs: cpu | cuda (a build with nvcc, on an NVIDIA GPU)")
        ->capture_default_str();
    cmd->add_option("--tp", tp, "tensor parallel: the model split over this many GPUs 0..N-1 (--backend cuda, NCCL) "
                                "or CPU ranks (a test of the split, not a speed-up)")
        ->capture_default_str();
    cmd->add_option("--ep", ep, "expert parallel: as --tp N, with a MoE model's routed experts placed whole, E/N a "
                                "rank, instead of each split by width");
}

void ModelOptions::validate() const {
    if (gdn != "serial" && gdn != "chunked") throw Error("--gdn must be 'serial' or 'chunked', got '" + gdn + "'");
    if (chunk < 1 || chunk > 1024) throw Error("--chunk must be in [1, 1024], got " + std::to_string(chunk));
    if (batch < 0) throw Error("--batch-size must be positive (0: the backend's default), got " + std::to_string(batch));
    if (batch_or_default() < chunk) throw Error("--batch-size must be >= --chunk (" + std::to_string(chunk) + ")");
    if (ctx < 1) throw Error("--ctx must be positive, got " + std::to_string(ctx));
    if (threads < 0) throw Error("--threads must be >= 0");
    check_cache_type(cache_type_k, kCacheTypeKFlag);  // a bad -ctk/-ctv fails before the model is loaded
    check_cache_type(cache_type_v, kCacheTypeVFlag);
    if (backend != "cpu" && backend != "cuda") throw Error("--backend must be 'cpu' or 'cuda', got '" + backend + "'");
    if (tp < 1 || tp > 64) throw Error("--tp must be in [1, 64], got " + std::to_string(tp));
    if (ep < 0 || ep > 64) throw Error("--ep must be in [1, 64], got " + std::to_string(ep));
    if (ep > 0 && tp > 1 && tp != ep)
        throw Error("--ep " + std::to_string(ep) + " and --tp " + std::to_string(tp) + ": the experts are placed over the "
                    "same ranks as the heads; give one of them");
}

alloy::EngineOptions ModelOptions::engine_options(int n_parallel) const {
    validate();
    alloy::EngineOptions e;
    e.model_path = model_path();
    e.n_parallel = n_parallel;
    e.n_ctx = ctx;
    e.threads = threads;
    e.batch_size = batch_or_default();
    e.gdn = gdn;
    e.gdn_chunk = chunk;
    e.cache_type_k = cache_type_k;
    e.cache_type_v = cache_type_v;
    e.mmap = mmap;
    e.backend = backend;
    e.tensor_parallel = ranks();
    e.expert_parallel = ep > 0;
    return e;
}

void SpecOptions::add_to(CLI::App* cmd) {
    cmd->add_option("--spec", mode,
                    "speculative decoding: off | ngram (prompt lookup) | mtp (the model's MTP head) | draft (a smaller model "
                    "with the same vocabulary: --draft-model). Exact: greedy output (--temp 0) is token for "
                    "token plain decode's; sampled output (temperature > 0) keeps plain sampling's distribution "
                    "(the speculative sampling rule), not its token stream for a seed. Drafts per step follow their "
                    "measured cost and acceptance (none where they do not pay)")
        ->capture_default_str();
    cmd->add_option("--spec-k", k, "with --spec: the most drafts verified per step, 1..3")->capture_default_str();
    cmd->add_option("--draft-model", draft_model, "with --spec draft: the draft model's GGUF file");
}

void SpecOptions::validate() const {
    if (mode != "off" && mode != "ngram" && mode != "mtp" && mode != "draft")
        throw Error("--spec must be 'off', 'ngram', 'mtp' or 'draft', got '" + mode + "'");
    if ((mode == "draft") != !draft_model.empty())
        throw Error(mode == "draft" ? "--spec draft needs --draft-model FILE" : "--draft-model is used with --spec draft only");
    if (k < 1 || k > 3) throw Error("--spec-k must be in [1, 3] (drafts per step), got " + std::to_string(k));
}

void SpecOptions::apply(alloy::EngineOptions& e) const {
    validate();
    e.spec = mode;
    e.spec_k = k;
    e.draft_model = draft_model.empty() ? draft_model : resolve_model(draft_model);
}

std::string ModelOptions::model_path() const { return model.empty() ? default_model_path() : resolve_model(model); }

std::string models_dir() {
    if (const char* d = std::getenv("ALLOY_MODELS"); d && *d) return d;
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : ".") + "/.cache/alloy/models";
}

std::string resolve_model(const std::string& m) {
    namespace fs = std::filesystem;
    std::error_code ec;
    auto ends_with = [&](const char* suffix) {
        const std::string s = suffix;
        return m.size() >= s.size() && m.compare(m.size() - s.size(), s.size(), s) == 0;
    };
    if (m.empty() || fs::is_regular_file(m, ec) || m.find('/') != std::string::npos || ends_with(".gguf") ||
        ends_with(".json"))
        return m;
    const fs::path dir = models_dir();
    for (const fs::path& p : {dir / (m + ".gguf"), dir / m})
        if (fs::is_regular_file(p, ec)) return p.string();
    // Unknown: say where we looked and what is there (the names -m takes).
    std::vector<std::string> names;
    if (fs::is_directory(dir, ec))
        for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
            if (e.is_regular_file(ec)) {
                const fs::path f = e.path().filename();
                names.push_back(f.extension() == ".gguf" ? f.stem().string() : f.string());
            }
    std::sort(names.begin(), names.end());
    std::string there;
    for (const std::string& n : names) there += (there.empty() ? "" : ", ") + n;
    const std::string where = dir.string() + " ($ALLOY_MODELS)";
    if (!fs::is_directory(dir, ec))
        throw Error("-m " + m + ": not a file, and no model of that name: the models folder " + where + " does not exist");
    if (names.empty()) throw Error("-m " + m + ": not a file, and no model of that name: the models folder " + where + " is empty");
    throw Error("-m " + m + ": not a file, and no model of that name in " + where + "; models there: " + there);
}

std::vector<int> parse_int_list(const std::string& s, const char* flag, int min_value) {
    std::vector<int> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || v < min_value || v > (1 << 24))
            throw Error(std::string(flag) + ": '" + item + "' is not an integer >= " + std::to_string(min_value));
        out.push_back(int(v));
    }
    return out;
}

std::vector<int32_t> parse_ids(const std::string& text) {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
        while (i < text.size() && (text[i] == ' ' || text[i] == ',' || text[i] == '\n' || text[i] == '\t')) ++i;
        if (i >= text.size()) break;
        size_t j = i;
        while (j < text.size() && !(text[j] == ' ' || text[j] == ',' || text[j] == '\n' || text[j] == '\t')) ++j;
        const std::string tok = text.substr(i, j - i);
        char* end = nullptr;
        errno = 0;
        const long v = std::strtol(tok.c_str(), &end, 10);
        if (errno || *end || v < 0 || v > INT32_MAX)
            throw Error("--ids: '" + tok + "' is not a token id (non-negative integer)");
        ids.push_back(int32_t(v));
        i = j;
    }
    return ids;
}

const char* const kCacheTypeKFlag = "-ctk/--cache-type-k";
const char* const kCacheTypeVFlag = "-ctv/--cache-type-v";

void check_cache_type(const std::string& s, const char* flag) {
    if (s != "f32" && s != "f16" && s != "bf16")
        throw Error(std::string(flag) + " must be f32, f16 or bf16, got '" + s + "'");
}

void rewrite_llama_style_flags(std::vector<std::string>& args) {
    static const std::pair<const char*, const char*> aliases[] = {
        {"-ctk", "--cache-type-k"}, {"-ctv", "--cache-type-v"},
        {"-npp", "--npp"}, {"-ntg", "--ntg"}, {"-npl", "--npl"},  // llama-batched-bench
        {"-np", "--parallel"}};                                     // llama-server
    for (std::string& a : args)
        for (const auto& [shrt, lng] : aliases) {
            const size_t n = std::char_traits<char>::length(shrt);
            if (a.compare(0, n, shrt) == 0 && (a.size() == n || a[n] == '=')) a = lng + a.substr(n);
        }
}

}  // namespace alloy::cli
