#include "model/convert_qwen35.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>

#include "alloy/convert.h"
#include "alloy/error.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/synth.h"
#include "tokenizer/tokenizer.h"

namespace alloy {
namespace {

using json = nlohmann::json;

struct TextConfig {
    int vocab = 0, D = 0, n_ff = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
    int H_k = 0, H_v = 0, d_k = 0, d_v = 0, conv_kernel = 4, interval = 4, n_ctx = 0, n_mtp = 0;
    float eps = 1e-6f, rope_theta = 1e7f, partial_rotary = 0.25f;
    std::vector<int32_t> mrope_section{11, 11, 10, 0};
    bool tied = false;
    // MoE (Qwen3_5Moe*: `num_experts` in the config): experts, experts per token, the widths of
    // an expert and of the shared expert (0 when dense).
    int n_expert = 0, n_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
    bool moe() const { return n_expert > 0; }
};

template <class T>
T field(const json& j, const std::string& key, const std::string& file) {
    if (!j.contains(key)) throw Error(file + ": missing field '" + key + "'");
    try {
        return j.at(key).get<T>();
    } catch (const json::exception& e) {
        throw Error(file + ": field '" + key + "' has the wrong type (" + e.what() + ")");
    }
}

TextConfig read_config(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot open (is this a Hugging Face checkpoint directory?)");
    json root;
    try {
        root = json::parse(in);
    } catch (const json::exception& e) {
        throw Error(path + ": invalid JSON: " + e.what());
    }
    const bool wrapped = root.contains("text_config");
    const json& tc = wrapped ? root["text_config"] : root;
    TextConfig c;
    c.vocab = field<int>(tc, "vocab_size", path);
    c.D = field<int>(tc, "hidden_size", path);
    c.n_expert = tc.value("num_experts", 0);
    if (c.moe()) {
        c.n_used = field<int>(tc, "num_experts_per_tok", path);
        c.n_ff_exp = field<int>(tc, "moe_intermediate_size", path);
        c.n_ff_shexp = tc.value("shared_expert_intermediate_size", 0);
        if (c.n_used <= 0 || c.n_used > c.n_expert || c.n_ff_exp <= 0 || c.n_ff_shexp < 0)
            throw Error(path + ": num_experts_per_tok / moe_intermediate_size / shared_expert_intermediate_size out of range");
        c.n_ff = tc.value("intermediate_size", 0);  // unused by an all-MoE model
    } else {
        c.n_ff = field<int>(tc, "intermediate_size", path);
    }
    c.n_layer = field<int>(tc, "num_hidden_layers", path);
    c.n_head = field<int>(tc, "num_attention_heads", path);
    c.n_head_kv = field<int>(tc, "num_key_value_heads", path);
    c.head_dim = tc.contains("head_dim") ? field<int>(tc, "head_dim", path) : c.D / c.n_head;
    c.H_k = field<int>(tc, "linear_num_key_heads", path);
    c.H_v = field<int>(tc, "linear_num_value_heads", path);
    c.d_k = field<int>(tc, "linear_key_head_dim", path);
    c.d_v = field<int>(tc, "linear_value_head_dim", path);
    c.conv_kernel = tc.value("linear_conv_kernel_dim", 4);
    c.eps = tc.value("rms_norm_eps", 1e-6f);
    c.n_ctx = tc.value("max_position_embeddings", 262144);
    c.n_mtp = tc.value("mtp_num_hidden_layers", root.value("mtp_num_hidden_layers", 0));
    // The published VLM configs carry tie_word_embeddings at the top level.
    c.tied = wrapped ? root.value("tie_word_embeddings", tc.value("tie_word_embeddings", false))
                     : tc.value("tie_word_embeddings", false);
    const json* rope = tc.contains("rope_parameters") && tc["rope_parameters"].is_object() ? &tc["rope_parameters"]
                     : tc.contains("rope_scaling") && tc["rope_scaling"].is_object()  ? &tc["rope_scaling"]
                                                                                       : nullptr;
    c.rope_theta = rope && rope->contains("rope_theta") ? (*rope)["rope_theta"].get<float>()
                                                        : tc.value("rope_theta", 1e7f);
    c.partial_rotary = rope && rope->contains("partial_rotary_factor")
                           ? (*rope)["partial_rotary_factor"].get<float>()
                           : tc.value("partial_rotary_factor", 0.25f);
    if (rope && rope->contains("mrope_section")) {
        auto ms = (*rope)["mrope_section"].get<std::vector<int32_t>>();
        ms.resize(4, 0);
        c.mrope_section = ms;
    }
    if (c.d_k != c.d_v)
        throw Error(path + ": linear_key_head_dim != linear_value_head_dim is not representable in "
                    "GGUF (ssm.state_size serves as both)");
    if (c.H_k <= 0 || c.H_v % c.H_k)
        throw Error(path + ": linear_num_value_heads must be a multiple of linear_num_key_heads");
    // Layer pattern: must be the periodic one GGUF can express with full_attention_interval.
    if (tc.contains("layer_types")) {
        auto types = field<std::vector<std::string>>(tc, "layer_types", path);
        if (int(types.size()) != c.n_layer) throw Error(path + ": layer_types has the wrong length");
        int interval = 0;
        for (int l = 0; l < c.n_layer && !interval; ++l)
            if (types[size_t(l)] == "full_attention") interval = l + 1;
        c.interval = interval ? interval : c.n_layer + 1;
        for (int l = 0; l < c.n_layer; ++l) {
            const bool full = (l + 1) % c.interval == 0;
            if (types[size_t(l)] != (full ? "full_attention" : "linear_attention"))
                throw Error(path + ": layer_types[" + std::to_string(l) + "] = '" + types[size_t(l)] +
                            "' does not follow a fixed full-attention interval");
        }
    } else {
        c.interval = tc.value("full_attention_interval", 4);
    }
    return c;
}

// Grouped (HF: j = kh*r + s) -> tiled (llama.cpp: j' = s*H_k + kh) value-head order.
// `x` holds n_heads blocks along one axis; each block is `block` contiguous floats repeated
// `outer` times with stride `stride` (covers rows of a matrix and columns of out_proj).
std::vector<int> tiled_order(int H_k, int H_v) {
    const int r = H_v / H_k;
    std::vector<int> src_of(static_cast<size_t>(H_v));  // new index -> old index
    for (int kh = 0; kh < H_k; ++kh)
        for (int s = 0; s < r; ++s) src_of[size_t(s * H_k + kh)] = kh * r + s;
    return src_of;
}

// Permutes head blocks along the row axis of a [rows, cols] matrix: rows [row0, row0+H_v*rows_per_head).
void permute_rows(std::vector<float>& m, int64_t cols, int64_t row0, int64_t rows_per_head,
                  const std::vector<int>& src_of) {
    std::vector<float> copy(m);
    for (size_t nh = 0; nh < src_of.size(); ++nh)
        for (int64_t r = 0; r < rows_per_head; ++r) {
            const int64_t dst = row0 + int64_t(nh) * rows_per_head + r;
            const int64_t src = row0 + int64_t(src_of[nh]) * rows_per_head + r;
            std::copy(copy.begin() + src * cols, copy.begin() + (src + 1) * cols, m.begin() + dst * cols);
        }
}

// Permutes head blocks along the column axis of a [rows, cols] matrix.
void permute_cols(std::vector<float>& m, int64_t rows, int64_t cols, int64_t cols_per_head,
                  const std::vector<int>& src_of) {
    std::vector<float> copy(m);
    for (int64_t r = 0; r < rows; ++r)
        for (size_t nh = 0; nh < src_of.size(); ++nh)
            for (int64_t c = 0; c < cols_per_head; ++c)
                m[size_t(r * cols + int64_t(nh) * cols_per_head + c)] =
                    copy[size_t(r * cols + int64_t(src_of[nh]) * cols_per_head + c)];
}

}  // namespace

std::string convert_hf_qwen35(const ConvertOptions& opt) {
    namespace fs = std::filesystem;
    const std::string cfg_path = (fs::path(opt.hf_dir) / "config.json").string();
    TextConfig c = read_config(cfg_path);
    auto st = SafetensorsDir::open(opt.hf_dir);

    // Where the text model's weights live.
    std::string prefix;
    for (const char* p : {"model.language_model.", "model.", "language_model.model."})
        if (st->find(std::string(p) + "embed_tokens.weight")) { prefix = p; break; }
    if (prefix.empty())
        throw Error(opt.hf_dir + ": no embed_tokens.weight under model.language_model. or model.: "
                    "not a Qwen3.5 text checkpoint");
    const bool has_mtp = opt.keep_mtp && st->find("mtp.fc.weight");
    const int n_mtp = has_mtp ? std::max(1, c.n_mtp) : 0;

    gguf::Writer w;
    const std::string arch = c.moe() ? "qwen35moe" : "qwen35";
    const std::string A = arch + ".";
    w.set("general.architecture", gguf::Value::str(arch));
    w.set("general.name", gguf::Value::str(fs::path(opt.hf_dir).filename().string()));
    uint32_t ftype = 0;  // llama_ftype of the dominant matrix type
    switch (opt.dtype) {
        case GgmlType::F32: ftype = 0; break;
        case GgmlType::F16: ftype = 1; break;
        case GgmlType::Q8_0: ftype = 7; break;
        case GgmlType::BF16: ftype = 32; break;
        default: throw Error("convert: --dtype must be f32, f16, bf16 or q8_0");
    }
    w.set("general.file_type", gguf::Value::u32(ftype));
    w.set(A + "context_length", gguf::Value::u32(uint32_t(c.n_ctx)));
    w.set(A + "embedding_length", gguf::Value::u32(uint32_t(c.D)));
    w.set(A + "block_count", gguf::Value::u32(uint32_t(c.n_layer + n_mtp)));
    if (c.n_ff > 0) w.set(A + "feed_forward_length", gguf::Value::u32(uint32_t(c.n_ff)));
    if (c.moe()) {
        w.set(A + "expert_count", gguf::Value::u32(uint32_t(c.n_expert)));
        w.set(A + "expert_used_count", gguf::Value::u32(uint32_t(c.n_used)));
        w.set(A + "expert_feed_forward_length", gguf::Value::u32(uint32_t(c.n_ff_exp)));
        if (c.n_ff_shexp > 0)
            w.set(A + "expert_shared_feed_forward_length", gguf::Value::u32(uint32_t(c.n_ff_shexp)));
    }
    w.set(A + "attention.head_count", gguf::Value::u32(uint32_t(c.n_head)));
    w.set(A + "attention.head_count_kv", gguf::Value::u32(uint32_t(c.n_head_kv)));
    w.set(A + "attention.key_length", gguf::Value::u32(uint32_t(c.head_dim)));
    w.set(A + "attention.value_length", gguf::Value::u32(uint32_t(c.head_dim)));
    w.set(A + "attention.layer_norm_rms_epsilon", gguf::Value::f32(c.eps));
    w.set(A + "rope.freq_base", gguf::Value::f32(c.rope_theta));
    w.set(A + "rope.dimension_count", gguf::Value::u32(uint32_t(float(c.head_dim) * c.partial_rotary)));
    w.set(A + "rope.dimension_sections", gguf::Value::i32_array(c.mrope_section));
    w.set(A + "full_attention_interval", gguf::Value::u32(uint32_t(c.interval)));
    w.set(A + "ssm.conv_kernel", gguf::Value::u32(uint32_t(c.conv_kernel)));
    w.set(A + "ssm.state_size", gguf::Value::u32(uint32_t(c.d_k)));
    w.set(A + "ssm.group_count", gguf::Value::u32(uint32_t(c.H_k)));
    w.set(A + "ssm.time_step_rank", gguf::Value::u32(uint32_t(c.H_v)));
    w.set(A + "ssm.inner_size", gguf::Value::u32(uint32_t(c.H_v * c.d_v)));
    if (n_mtp) w.set(A + "nextn_predict_layers", gguf::Value::u32(uint32_t(n_mtp)));

    std::string tok = opt.tokenizer_json;
    if (tok.empty() && fs::exists(fs::path(opt.hf_dir) / "tokenizer.json"))
        tok = (fs::path(opt.hf_dir) / "tokenizer.json").string();
    if (!tok.empty()) {
        Vocab v = Tokenizer::from_hf_json(tok).vocab();
        pad_vocab(v, size_t(c.vocab), tok + " against vocab_size of " + opt.hf_dir + "/config.json");
        add_vocab_to_gguf(v, w);
    }

    const std::vector<int> src_of = tiled_order(c.H_k, c.H_v);
    const int64_t key_dim = int64_t(c.H_k) * c.d_k, vd = int64_t(c.H_v) * c.d_v;
    int n_tensors = 0;

    // Loads an HF tensor as fp32, checks its shape, applies `fix`, writes it under `name`.
    auto emit = [&](const SafetensorsDir::Tensor& t, const std::string& name, std::vector<int64_t> hf_shape,
                    bool matrix, const std::function<void(std::vector<float>&)>& fix) {
        std::vector<int64_t> shape = t.shape;
        if (name.find("ssm_conv1d") != std::string::npos && shape.size() == 3 && shape[1] == 1)
            shape = {shape[0], shape[2]};  // [C, 1, K] -> [C, K]
        if (shape != hf_shape) {
            std::string want, have;
            for (auto v : hf_shape) want += std::to_string(v) + " ";
            for (auto v : t.shape) have += std::to_string(v) + " ";
            throw Error(opt.hf_dir + ": tensor '" + t.name + "' has shape [ " + have + "], expected [ " + want + "]");
        }
        std::vector<float> v = SafetensorsDir::to_f32(t);
        if (fix) fix(v);
        std::vector<int64_t> ne(shape.rbegin(), shape.rend());  // ggml order: fastest first
        GgmlType type = GgmlType::F32;
        if (matrix) {
            type = opt.dtype;
            if (type == GgmlType::Q8_0 && ne[0] % 32) type = GgmlType::F16;  // as llama.cpp falls back
        }
        w.add_tensor_f32(name, type, ne, v.data());
        ++n_tensors;
    };
    auto plus_one = [](std::vector<float>& v) { for (auto& x : v) x += 1.0f; };
    auto need = [&](const std::string& name) -> const SafetensorsDir::Tensor& {
        const auto* t = st->find(name);
        if (!t) throw Error(opt.hf_dir + ": missing tensor '" + name + "'");
        return *t;
    };

    const int64_t D = c.D;
    emit(need(prefix + "embed_tokens.weight"), "token_embd.weight", {c.vocab, D}, true, nullptr);
    emit(need(prefix + "norm.weight"), "output_norm.weight", {D}, false, plus_one);
    if (!c.tied) {
        const auto* lm = st->find("lm_head.weight");
        if (!lm) throw Error(opt.hf_dir + ": tie_word_embeddings is false but lm_head.weight is missing");
        emit(*lm, "output.weight", {c.vocab, D}, true, nullptr);
    }

    // Attention + FFN tensors shared by trunk attention layers and the MTP block.
    auto emit_attention = [&](const std::string& hf, const std::string& gg) {
        const int64_t q_out = int64_t(c.n_head) * c.head_dim, kv_out = int64_t(c.n_head_kv) * c.head_dim;
        emit(need(hf + "self_attn.q_proj.weight"), gg + "attn_q.weight", {2 * q_out, D}, true, nullptr);
        emit(need(hf + "self_attn.k_proj.weight"), gg + "attn_k.weight", {kv_out, D}, true, nullptr);
        emit(need(hf + "self_attn.v_proj.weight"), gg + "attn_v.weight", {kv_out, D}, true, nullptr);
        emit(need(hf + "self_attn.o_proj.weight"), gg + "attn_output.weight", {D, q_out}, true, nullptr);
        emit(need(hf + "self_attn.q_norm.weight"), gg + "attn_q_norm.weight", {c.head_dim}, false, plus_one);
        emit(need(hf + "self_attn.k_norm.weight"), gg + "attn_k_norm.weight", {c.head_dim}, false, plus_one);
    };
    // The MoE block as llama.cpp's converter writes it: router and shared-expert gate kept in
    // F32 (as it keeps ffn_gate_inp*), the experts stacked into 3D tensors ffn_gate_exps,
    // ffn_up_exps (ggml ne {D, I, E}) and ffn_down_exps ({I, D, E}). Checkpoints hold the
    // experts one tensor each (experts.<e>.gate_proj.weight ...: the published layout, and
    // what transformers' save_pretrained writes) or fused (experts.gate_up_proj [E, 2I, D],
    // experts.down_proj [E, D, I]: transformers' in-memory layout); both are read.
    auto emit_moe = [&](const std::string& mlp, const std::string& gg) {
        const int64_t E = c.n_expert, I = c.n_ff_exp, Is = c.n_ff_shexp;
        emit(need(mlp + "gate.weight"), gg + "ffn_gate_inp.weight", {E, D}, false, nullptr);
        auto check = [&](const SafetensorsDir::Tensor& t, std::vector<int64_t> shape) {
            if (t.shape != shape)
                throw Error(opt.hf_dir + ": tensor '" + t.name + "' does not have the shape num_experts / " +
                            "moe_intermediate_size / hidden_size give it");
        };
        // rows [r0, r0 + n) of each expert's [rows_all, cols] matrix, experts stacked.
        std::vector<float> stacked;
        auto stack = [&](const std::string& which, int64_t rows, int64_t cols, int64_t r0, int64_t n) {
            stacked.assign(size_t(E * n * cols), 0.0f);
            const auto* fused = st->find(mlp + "experts." + which);
            if (fused) {
                check(*fused, {E, rows, cols});
                const std::vector<float> all = SafetensorsDir::to_f32(*fused);
                for (int64_t e = 0; e < E; ++e)
                    std::copy(all.begin() + (e * rows + r0) * cols, all.begin() + (e * rows + r0 + n) * cols,
                              stacked.begin() + e * n * cols);
                return;
            }
            for (int64_t e = 0; e < E; ++e) {
                const std::string name = which == "gate_up_proj" ? (r0 == 0 ? "gate_proj" : "up_proj") : which;
                const auto& t = need(mlp + "experts." + std::to_string(e) + "." + name + ".weight");
                check(t, {n, cols});
                const std::vector<float> v = SafetensorsDir::to_f32(t);
                std::copy(v.begin(), v.end(), stacked.begin() + e * n * cols);
            }
        };
        auto write = [&](const std::string& name, int64_t n_in, int64_t rows) {
            const GgmlType type = opt.dtype == GgmlType::Q8_0 && n_in % 32 ? GgmlType::F16 : opt.dtype;
            w.add_tensor_f32(gg + name, type, {n_in, rows, E}, stacked.data());
            ++n_tensors;
        };
        stack("gate_up_proj", 2 * I, D, 0, I);
        write("ffn_gate_exps.weight", D, I);
        stack("gate_up_proj", 2 * I, D, I, I);
        write("ffn_up_exps.weight", D, I);
        stack("down_proj", D, I, 0, D);
        write("ffn_down_exps.weight", I, D);
        if (Is == 0) return;
        emit(need(mlp + "shared_expert.gate_proj.weight"), gg + "ffn_gate_shexp.weight", {Is, D}, true, nullptr);
        emit(need(mlp + "shared_expert.up_proj.weight"), gg + "ffn_up_shexp.weight", {Is, D}, true, nullptr);
        emit(need(mlp + "shared_expert.down_proj.weight"), gg + "ffn_down_shexp.weight", {D, Is}, true, nullptr);
        emit(need(mlp + "shared_expert_gate.weight"), gg + "ffn_gate_inp_shexp.weight", {1, D}, false, nullptr);
    };
    auto emit_common = [&](const std::string& hf, const std::string& gg) {
        emit(need(hf + "input_layernorm.weight"), gg + "attn_norm.weight", {D}, false, plus_one);
        emit(need(hf + "post_attention_layernorm.weight"), gg + "post_attention_norm.weight", {D}, false, plus_one);
        if (c.moe()) return emit_moe(hf + "mlp.", gg);
        emit(need(hf + "mlp.gate_proj.weight"), gg + "ffn_gate.weight", {c.n_ff, D}, true, nullptr);
        emit(need(hf + "mlp.up_proj.weight"), gg + "ffn_up.weight", {c.n_ff, D}, true, nullptr);
        emit(need(hf + "mlp.down_proj.weight"), gg + "ffn_down.weight", {D, c.n_ff}, true, nullptr);
    };

    for (int l = 0; l < c.n_layer; ++l) {
        const std::string hf = prefix + "layers." + std::to_string(l) + ".";
        const std::string gg = "blk." + std::to_string(l) + ".";
        emit_common(hf, gg);
        if ((l + 1) % c.interval == 0) {
            emit_attention(hf, gg);
            continue;
        }
        const std::string la = hf + "linear_attn.";
        const int64_t conv_dim = 2 * key_dim + vd;
        auto rows_v = [&](int64_t row0, int64_t per_head, int64_t cols) {
            return [=, &src_of](std::vector<float>& v) { permute_rows(v, cols, row0, per_head, src_of); };
        };
        emit(need(la + "in_proj_qkv.weight"), gg + "attn_qkv.weight", {conv_dim, D}, true,
             rows_v(2 * key_dim, c.d_v, D));
        emit(need(la + "in_proj_z.weight"), gg + "attn_gate.weight", {vd, D}, true, rows_v(0, c.d_v, D));
        emit(need(la + "in_proj_b.weight"), gg + "ssm_beta.weight", {c.H_v, D}, true, rows_v(0, 1, D));
        emit(need(la + "in_proj_a.weight"), gg + "ssm_alpha.weight", {c.H_v, D}, true, rows_v(0, 1, D));
        emit(need(la + "conv1d.weight"), gg + "ssm_conv1d.weight", {conv_dim, c.conv_kernel}, false,
             rows_v(2 * key_dim, c.d_v, c.conv_kernel));
        emit(need(la + "dt_bias"), gg + "ssm_dt.bias", {c.H_v}, false, rows_v(0, 1, 1));
        emit(need(la + "A_log"), gg + "ssm_a", {c.H_v}, false, [&](std::vector<float>& v) {
            for (auto& x : v) x = -std::exp(x);
            permute_rows(v, 1, 0, 1, src_of);
        });
        emit(need(la + "norm.weight"), gg + "ssm_norm.weight", {c.d_v}, false, nullptr);  // plain, no +1
        emit(need(la + "out_proj.weight"), gg + "ssm_out.weight", {D, vd}, true,
             [&](std::vector<float>& v) { permute_cols(v, D, vd, c.d_v, src_of); });
    }

    if (n_mtp) {
        const std::string gg = "blk." + std::to_string(c.n_layer) + ".";
        emit(need("mtp.fc.weight"), gg + "nextn.eh_proj.weight", {D, 2 * D}, true, nullptr);
        emit(need("mtp.pre_fc_norm_embedding.weight"), gg + "nextn.enorm.weight", {D}, false, plus_one);
        emit(need("mtp.pre_fc_norm_hidden.weight"), gg + "nextn.hnorm.weight", {D}, false, plus_one);
        if (const auto* t = st->find("mtp.norm.weight"))
            emit(*t, gg + "nextn.shared_head_norm.weight", {D}, false, plus_one);
        emit_common("mtp.layers.0.", gg);
        emit_attention("mtp.layers.0.", gg);
    }

    // Anything under the text prefix that we did not map is a checkpoint we do not understand.
    static const std::regex known(
        R"((embed_tokens|norm)\.weight|layers\.\d+\.(input_layernorm|post_attention_layernorm|mlp\.(gate|up|down)_proj|mlp\.(gate|shared_expert_gate)|mlp\.shared_expert\.(gate|up|down)_proj|self_attn\.(q|k|v|o)_proj|self_attn\.(q|k)_norm|linear_attn\.(in_proj_(qkv|z|a|b)|conv1d|norm|out_proj))\.weight|layers\.\d+\.linear_attn\.(A_log|dt_bias)|layers\.\d+\.mlp\.experts\.(gate_up_proj|down_proj)|layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight)");
    for (const auto* t : st->tensors())
        if (t->name.rfind(prefix, 0) == 0 && !std::regex_match(t->name.substr(prefix.size()), known))
            throw Error(opt.hf_dir + ": unexpected tensor '" + t->name + "' (not part of a Qwen3.5 text model)");

    w.write(opt.out_path);
    return "wrote " + opt.out_path + ": " + std::to_string(n_tensors) + " tensors, " +
           std::to_string(c.n_layer) + " layers" + (n_mtp ? " + MTP block" : "");
}

std::string convert_model(const ConvertRequest& r) {
    ConvertOptions opt;
    opt.hf_dir = r.hf_dir;
    opt.out_path = r.out_path;
    opt.dtype = matrix_dtype(r.dtype, "convert: --dtype");
    opt.tokenizer_json = r.tokenizer_json;
    opt.keep_mtp = r.keep_mtp;
    return convert_hf_qwen35(opt);
}

}  // namespace alloy
