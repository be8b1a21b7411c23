#include "runtime/loaded_model.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "alloy/error.h"
#include "kernels/cpu/matmul.h"
#include "model/synth.h"
#include "runtime/tensor_parallel_backend.h"

namespace alloy {

const Tokenizer& LoadedModel::require_tokenizer() const {
    if (!tokenizer)
        throw Error(file->path() + ": the file has no tokenizer (tokenizer.ggml.* keys); "
                    "give token ids with --ids instead");
    return *tokenizer;
}

LoadedModel load_model(const std::string& path, gguf::TensorData where, const std::string& backend, int tensor_parallel,
                       bool expert_parallel) {
    if (tensor_parallel < 1) throw Error("--tp must be at least 1, got " + std::to_string(tensor_parallel));
    LoadedModel m;
    m.file = std::shared_ptr<gguf::File>(gguf::File::open(path, where));
    const auto& ts = m.file->tensors();
    const bool has_bytes = std::any_of(ts.begin(), ts.end(), [](const gguf::TensorInfo& t) { return t.nbytes > 0; });
    if (where == gguf::TensorData::Resident && !m.file->resident() && has_bytes)
        std::fprintf(stderr, "note: %s: the weights do not fit in the memory available now; using the file "
                             "mapping instead (as --mmap)\n", path.c_str());
    m.model = Qwen35Model::load(m.file);
    // Q4_K / Q5_K / Q6_K / IQ4_XS rows repacked for the CPU kernels (in place, same bytes;
    // ALLOY_KQ_REPACK=0: as stored); Q8_0 too where AVX512-VNNI runs (ALLOY_Q8_REPACK=0: as stored).
    // (Shards slice the GGUF rows: a tensor-parallel model is not repacked.)
    if (tensor_parallel > 1 || expert_parallel) {
        m.runner = std::make_unique<ModelRunner>(
            *m.model, make_tensor_parallel_backend(*m.model, backend, tensor_parallel, expert_parallel));
    } else {
        if (backend == "cpu" || backend.empty()) m.model->repack_for_cpu(cpu::repack_enabled);
        m.runner = std::make_unique<ModelRunner>(*m.model, make_backend(backend));
    }
    if (m.file->has("tokenizer.ggml.model")) m.tokenizer.emplace(Tokenizer::from_gguf(*m.file));
    return m;
}

namespace {

// The trained default model (testdata/default-model): beside the binary (the build tree's
// share/alloy/) or in the install prefix the binary sits in (bin/../share/alloy/).
std::string trained_default_model() {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (ec) return {};
    for (const fs::path& dir : {exe.parent_path() / "share" / "alloy", exe.parent_path().parent_path() / "share" / "alloy"}) {
        const fs::path model = dir / kDefaultModelFile;
        if (fs::is_regular_file(model, ec)) return model.string();
    }
    return {};
}

}  // namespace

std::string default_model_path() {
    namespace fs = std::filesystem;
    if (std::string trained = trained_default_model(); !trained.empty()) return trained;
    fs::path dir;
    if (const char* h = std::getenv("ALLOY_HOME")) dir = h;
    else if (const char* home = std::getenv("HOME")) dir = fs::path(home) / ".cache" / "alloy";
    else dir = fs::temp_directory_path() / "alloy";
    const fs::path model = dir / "tiny-default-qwen35.gguf";  // the Qwen3.5 vocabulary (248k)
    static bool said = false;
    if (!said)
        std::fprintf(stderr, "note: no %s in share/alloy/ beside this binary or in its install prefix "
                             "(cmake --install puts it there): using %s, a model with random weights\n",
                     kDefaultModelFile, model.c_str());
    said = true;
    if (!fs::exists(model)) {
        fs::create_directories(dir);
        SynthOptions opt;
        opt.preset = "tiny";
        opt.dtype = GgmlType::F32;
        // opt.tokenizer_json empty: the vocabulary compiled into the binary, so a copied binary
        // writes its default model anywhere.
        opt.out_path = model.string();
        synth_qwen35(opt);
    }
    return model.string();
}

}  // namespace alloy
