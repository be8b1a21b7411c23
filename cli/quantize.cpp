// alloy quantize: rewrites a GGUF model in another type with llama-quantize's per-tensor mixes
// (model/quantize.h), so users need no other tool; the bytes equal llama-quantize's.
#include <chrono>
#include <cstdio>

#include "alloy/error.h"
#include "cli/common.h"
#include "format/quant.h"
#include "model/quantize.h"

namespace alloy::cli {

namespace {

// A single tensor type by its ggml name ("q6_k", "Q8_0", ...), for the override flags.
GgmlType parse_tensor_type(const std::string& s, const char* flag) {
    std::string low = s;
    for (char& c : low) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (uint32_t id = 0; id < 64; ++id) {
        if (type_supported(id) && type_name(id) == low) return static_cast<GgmlType>(id);
    }
    throw Error(std::string(flag) + ": '" + s + "' is not a tensor type alloy writes (f32, f16, bf16, q8_0, q4_0, " +
                "q4_k, q5_k, q6_k, iq4_nl, iq4_xs)");
}

}  // namespace

void add_quantize_command(CLI::App& app) {
    std::string types;
    for (const std::string& n : file_type_names()) types += (types.empty() ? "" : " | ") + n;
    auto* cmd = app.add_subcommand("quantize", "quantize a GGUF model as llama-quantize does (same mixes, same bytes)");
    static std::string in, out, type, output_type, embd_type;
    static QuantizeOptions opt;
    static bool dry_run = false;
    cmd->add_option("input", in, "input .gguf (F32 / F16 / BF16, or quantized with --allow-requantize)")->required();
    cmd->add_option("output", out, "output .gguf")->required();
    cmd->add_option("type", type, types)->required();
    cmd->add_option("-t,--threads", opt.threads, "threads (0: all)")->capture_default_str();
    cmd->add_flag("--allow-requantize", opt.allow_requantize, "accept tensors that are already quantized");
    cmd->add_flag("--pure", opt.pure, "no mixes: every quantizable tensor gets the base type");
    cmd->add_option("--output-tensor-type", output_type, "type of output.weight (e.g. q8_0)");
    cmd->add_option("--token-embedding-type", embd_type, "type of token_embd.weight");
    cmd->add_flag("--dry-run", dry_run, "print each tensor's type and the sizes, write nothing");
    cmd->callback([] {
        opt.type = parse_file_type(type);
        if (!output_type.empty()) opt.output_type = parse_tensor_type(output_type, "--output-tensor-type");
        if (!embd_type.empty()) opt.token_embd_type = parse_tensor_type(embd_type, "--token-embedding-type");
        if (in == out) throw Error("quantize: input and output are the same file '" + in + "'");
        const auto t0 = std::chrono::steady_clock::now();
        QuantizeReport rep;
        if (dry_run) {
            auto file = gguf::File::open(in);
            rep.tensors = plan_quantization(*file, opt);
            for (const auto& p : rep.tensors) {
                const gguf::TensorInfo& t = file->tensor(p.name);
                rep.bytes_in += t.nbytes;
                rep.n_elements += static_cast<uint64_t>(t.n_elements());
                rep.bytes_out += row_bytes(p.to, p.ne[0]) * static_cast<uint64_t>(t.n_elements() / p.ne[0]);
            }
        } else {
            rep = quantize_file(in, out, opt);
        }
        for (const auto& p : rep.tensors) {
            std::string shape;
            for (int64_t d : p.ne) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
            std::fprintf(stderr, "%-40s [%s] %s -> %s%s\n", p.name.c_str(), shape.c_str(),
                         type_name(static_cast<uint32_t>(p.from)).c_str(), type_name(static_cast<uint32_t>(p.to)).c_str(),
                         p.fell_back ? " (fallback: row length)" : "");
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double bpw_in = rep.n_elements ? 8.0 * double(rep.bytes_in) / double(rep.n_elements) : 0.0;
        const double bpw_out = rep.n_elements ? 8.0 * double(rep.bytes_out) / double(rep.n_elements) : 0.0;
        std::fprintf(stderr, "%s %s: %.2f MiB (%.2f BPW) -> %.2f MiB (%.2f BPW) %s, %.1f s\n",
                     dry_run ? "would write" : "wrote", out.c_str(), rep.bytes_in / 1048576.0,
                     bpw_in, rep.bytes_out / 1048576.0, bpw_out, file_type_name(opt.type), s);
    });
}

}  // namespace alloy::cli
