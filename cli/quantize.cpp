// alloy quantize: rewrites a GGUF model in another type with llama-quantize's per-tensor mixes
// (alloy/quantize.h), so users need no other tool; the bytes equal llama-quantize's.
#include <chrono>
#include <cstdio>

#include "alloy/quantize.h"
#include "cli/commands.h"
#include "cli/common.h"

namespace alloy::cli {

void add_quantize_command(CLI::App& app) {
    std::string types;
    for (const std::string& n : quantize_type_names()) types += (types.empty() ? "" : " | ") + n;
    auto* cmd = app.add_subcommand("quantize", "quantize a GGUF model as llama-quantize does (same mixes, same bytes)");
    static QuantizeRequest req;
    cmd->add_option("input", req.input, "input .gguf (F32 / F16 / BF16, or quantized with --allow-requantize; or a model name, as -m)")->required();
    cmd->add_option("output", req.output, "output .gguf")->required();
    cmd->add_option("type", req.type, types)->required();
    cmd->add_option("-t,--threads", req.threads, "threads (0: all)")->capture_default_str();
    cmd->add_flag("--allow-requantize", req.allow_requantize, "accept tensors that are already quantized");
    cmd->add_flag("--pure", req.pure, "no mixes: every quantizable tensor gets the base type");
    cmd->add_option("--output-tensor-type", req.output_tensor_type, "type of output.weight (e.g. q8_0)");
    cmd->add_option("--token-embedding-type", req.token_embedding_type, "type of token_embd.weight");
    cmd->add_flag("--dry-run", req.dry_run, "print each tensor's type and the sizes, write nothing");
    cmd->callback([] {
        const auto t0 = std::chrono::steady_clock::now();
        req.input = resolve_model(req.input);  // a file, or a name in the models folder as -m takes
        const QuantizeResult rep = quantize_model(req);
        for (const auto& p : rep.tensors) {
            std::string shape;
            for (int64_t d : p.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
            std::fprintf(stderr, "%-40s [%s] %s -> %s%s\n", p.name.c_str(), shape.c_str(), p.from.c_str(), p.to.c_str(),
                         p.fell_back ? " (fallback: row length)" : "");
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double n = rep.n_elements ? double(rep.n_elements) : 1.0;
        std::fprintf(stderr, "%s %s: %.2f MiB (%.2f BPW) -> %.2f MiB (%.2f BPW) %s, %.1f s\n",
                     req.dry_run ? "would write" : "wrote", req.output.c_str(), rep.bytes_in / 1048576.0,
                     8.0 * double(rep.bytes_in) / n, rep.bytes_out / 1048576.0, 8.0 * double(rep.bytes_out) / n,
                     req.type.c_str(), s);
    });
}

}  // namespace alloy::cli
