// Options and small helpers shared by several subcommands (include/alloy only; the benchmarks
// turn engine_options() into the forward's own with runtime/engine_options.h).
#pragma once
#include <string>
#include <vector>

#include "alloy/engine.h"
#include "cli/commands.h"

namespace alloy::cli {

// Options every model-running command takes.
struct ModelOptions {
    std::string model;       // empty: the embedded default model
    std::string gdn = "chunked";
    int chunk = 64;
    int ctx = 4096;
    int threads = 0;         // 0: all cores
    int batch = 0;           // longest prefill piece (llama.cpp's ubatch); 0: the backend's default (batch_or_default)
    // 512 on the CPU (llama.cpp's), 4096 on cuda, where a 512-token piece re-reads every weight
    // per piece and leaves the GPU half idle (bench/RESULTS.md: pp4096 2.3x faster).
    int batch_or_default() const { return batch > 0 ? batch : backend == "cuda" ? 4096 : 512; }
    std::string cache_type_k = "f16", cache_type_v = "f16";  // -ctk / -ctv, llama.cpp's defaults
    bool mmap = false;       // use the file mapping instead of reading the weights into memory
    std::string backend = "cpu";  // cpu | cuda
    int tp = 1;              // --tp: ranks the model is split over (runtime/tensor_parallel_backend.h)
    int ep = 0;              // --ep: the same with a MoE model's experts placed whole (0: off)
    int ranks() const { return ep > 0 ? ep : tp; }
    void add_to(CLI::App* cmd, bool model_required);
    // Throws naming the flag (--gdn, --chunk, -b, -c, -t, -ctk/-ctv) whose value is wrong.
    void validate() const;
    std::string model_path() const;          // resolves the default model
    // The same options for include/alloy's Engine, n_parallel sequences at once (validated).
    alloy::EngineOptions engine_options(int n_parallel) const;
};

// Speculative decoding for the commands that generate (run, serve): EngineOptions::spec, spec_k.
struct SpecOptions {
    std::string mode = "off";  // --spec: off | ngram | mtp | draft
    int k = 1;                 // --spec-k: drafts per step, 1..3
    std::string draft_model;   // --draft-model: with --spec draft
    void add_to(CLI::App* cmd);
    // Throws naming the flag (--spec, --spec-k) whose value is wrong.
    void validate() const;
    void apply(alloy::EngineOptions& e) const;  // validated
};

// -m as a path or a model name. A path: an existing file, or a value with a '/' or ending in
// ".gguf" / ".json" (a missing one is the loader's error, naming it). Else a name, found in the
// models folder ($ALLOY_MODELS, default ~/.cache/alloy/models) as NAME.gguf or NAME; an unknown
// name throws, listing the names the folder holds. Empty: empty (the caller's default).
std::string resolve_model(const std::string& m);
// The models folder resolve_model looks in.
std::string models_dir();

// "1,2,3" -> integers >= min_value; throws naming the flag and the bad entry.
std::vector<int> parse_int_list(const std::string& s, const char* flag, int min_value);
// "1 2 3" or "1,2,3" -> ids; throws naming the bad entry.
std::vector<int32_t> parse_ids(const std::string& text);
// A KV cache type name of flag `flag` (e.g. "-ctk/--cache-type-k"): f32 | f16 | bf16; throws
// naming both.
void check_cache_type(const std::string& s, const char* flag);
extern const char* const kCacheTypeKFlag;  // "-ctk/--cache-type-k"
extern const char* const kCacheTypeVFlag;  // "-ctv/--cache-type-v"

// llama.cpp spells some options with one dash and several letters (-ctk, -ctv), which CLI11
// cannot declare; main() rewrites them to their long names before parsing.
void rewrite_llama_style_flags(std::vector<std::string>& args);

}  // namespace alloy::cli
