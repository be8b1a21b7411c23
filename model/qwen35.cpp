#include "model/qwen35.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "alloy/error.h"
#include "format/quant.h"
#include "kernels/cpu/add.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gate.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/kv_store.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "kernels/ref/activations.h"
#include "kernels/ref/kv_store.h"
#include "kernels/ref/rms_norm.h"
#include "kernels/ref/rope.h"

namespace alloy {

// ---------------------------------------------------------------- hyperparameters
Qwen35HParams Qwen35HParams::from_gguf(const gguf::File& f) {
    const std::string arch = f.get_string("general.architecture");
    if (arch != "qwen35" && arch != "qwen35moe")
        throw Error(f.path() + ": general.architecture is '" + arch +
                    "', expected 'qwen35' or 'qwen35moe' (Qwen3.5 / Qwen3.6 text models)");
    auto key = [&](const char* k) { return arch + "." + std::string(k); };
    Qwen35HParams hp;
    if (arch == "qwen35moe") {
        hp.n_expert = int(f.get_u32(key("expert_count")));
        hp.n_expert_used = int(f.get_u32(key("expert_used_count")));
        hp.n_ff_exp = int(f.get_u32(key("expert_feed_forward_length")));
        hp.n_ff_shexp = int(f.get_u32_or(key("expert_shared_feed_forward_length"), 0));
        if (hp.n_expert <= 0 || hp.n_expert > 65536) throw Error(f.path() + ": " + key("expert_count") + " out of range");
        if (hp.n_expert_used <= 0 || hp.n_expert_used > hp.n_expert)
            throw Error(f.path() + ": " + key("expert_used_count") + " must be in [1, expert_count]");
        if (hp.n_ff_exp <= 0 || hp.n_ff_exp > (1 << 20) || hp.n_ff_shexp < 0 || hp.n_ff_shexp > (1 << 20))
            throw Error(f.path() + ": " + key("expert_feed_forward_length") + " / expert_shared_feed_forward_length out of range");
    }
    hp.n_embd = int(f.get_u32(key("embedding_length")));
    const int blocks = int(f.get_u32(key("block_count")));
    hp.n_layer_mtp = int(f.get_u32_or(key("nextn_predict_layers"), 0));
    hp.n_layer = blocks - hp.n_layer_mtp;
    hp.n_ff = hp.moe() ? int(f.get_u32_or(key("feed_forward_length"), 0)) : int(f.get_u32(key("feed_forward_length")));
    hp.n_head = int(f.get_u32(key("attention.head_count")));
    hp.n_head_kv = int(f.get_u32(key("attention.head_count_kv")));
    hp.head_dim = int(f.get_u32_or(key("attention.key_length"), hp.n_head ? hp.n_embd / hp.n_head : 0));
    const int v_len = int(f.get_u32_or(key("attention.value_length"), hp.head_dim));
    hp.n_rot = int(f.get_u32_or(key("rope.dimension_count"), hp.head_dim));
    hp.rope_base = f.get_f32_or(key("rope.freq_base"), 10000.0f);
    hp.eps = f.get_f32(key("attention.layer_norm_rms_epsilon"));
    hp.full_attn_interval = int(f.get_u32_or(key("full_attention_interval"), 4));
    hp.n_ctx_train = int(f.get_u32_or(key("context_length"), 0));
    hp.conv_kernel = int(f.get_u32(key("ssm.conv_kernel")));
    hp.ssm_d_k = int(f.get_u32(key("ssm.state_size")));
    hp.ssm_H_k = int(f.get_u32(key("ssm.group_count")));
    hp.ssm_H_v = int(f.get_u32(key("ssm.time_step_rank")));
    const int inner = int(f.get_u32(key("ssm.inner_size")));
    hp.ssm_d_v = hp.ssm_H_v ? inner / hp.ssm_H_v : 0;

    auto bad = [&](const std::string& what) { throw Error(f.path() + ": " + what); };
    if (hp.n_embd <= 0 || hp.n_embd > (1 << 20)) bad(key("embedding_length") + " out of range");
    if (hp.n_layer <= 0 || hp.n_layer > 4096 || hp.n_layer_mtp < 0)
        bad(key("block_count") + " / nextn_predict_layers out of range");
    if (hp.n_head <= 0 || hp.n_head_kv <= 0 || hp.n_head % hp.n_head_kv)
        bad(key("attention.head_count") + " must be a positive multiple of head_count_kv");
    if (hp.head_dim <= 0 || v_len != hp.head_dim) bad(key("attention.key_length/value_length") + " invalid");
    if (hp.n_rot <= 0 || hp.n_rot > hp.head_dim || hp.n_rot % 2)
        bad(key("rope.dimension_count") + " must be even and <= key_length");
    if (hp.full_attn_interval <= 0) bad(key("full_attention_interval") + " must be positive");
    if (hp.conv_kernel < 1 || hp.conv_kernel > 64) bad(key("ssm.conv_kernel") + " out of range");
    if (hp.ssm_H_k <= 0 || hp.ssm_H_v <= 0 || hp.ssm_H_v % hp.ssm_H_k)
        bad(key("ssm.time_step_rank") + " must be a positive multiple of ssm.group_count");
    if (hp.ssm_d_k <= 0 || inner != hp.ssm_H_v * hp.ssm_d_k)
        bad(key("ssm.inner_size") + " must equal time_step_rank * state_size (d_k == d_v)");
    if (!(hp.eps > 0 && hp.eps < 1)) bad(key("attention.layer_norm_rms_epsilon") + " out of range");
    // Vocabulary size is the embedding's row count (checked when binding).
    return hp;
}

namespace {

struct Binder {
    const gguf::File& f;
    std::vector<std::vector<float>>& owned;

    const gguf::TensorInfo& get(const std::string& name) const { return f.tensor(name); }

    std::string shape_str(const std::vector<int64_t>& ne) const {
        std::string s = "{";
        for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
        return s + "}";
    }

    void expect(const gguf::TensorInfo& t, std::vector<int64_t> want) const {
        std::vector<int64_t> have = t.ne;
        while (have.size() > want.size() && have.back() == 1) have.pop_back();
        if (have != want)
            throw Error(f.path() + ": tensor '" + t.name + "' has shape " + shape_str(t.ne) +
                        ", expected " + shape_str(want));
    }

    WeightView matrix(const std::string& name, int64_t n_in, int64_t n_out) const {
        const auto& t = get(name);
        expect(t, {n_in, n_out});
        return view(t, n_in, n_out);
    }

    // All experts' matrices in one tensor of ne {n_in, rows, n_expert}: expert e's rows are
    // [e * rows, (e + 1) * rows) of it.
    ref::ExpertMatrix experts(const std::string& name, int64_t n_in, int64_t rows, int64_t n_expert) const {
        const auto& t = get(name);
        expect(t, {n_in, rows, n_expert});
        return {view(t, n_in, rows * n_expert), rows, 0, rows};
    }

    // A [1, n_in] weight that GGUF may store as ne {n_in} (ffn_gate_inp_shexp).
    WeightView row_vector(const std::string& name, int64_t n_in) const {
        const auto& t = get(name);
        expect(t, {n_in});
        return view(t, n_in, 1);
    }

    WeightView view(const gguf::TensorInfo& t, int64_t n_in, int64_t n_out) const {
        WeightView w;
        w.type = t.type;
        w.n_in = n_in;
        w.n_out = n_out;
        w.data = t.data;
        w.row_bytes = row_bytes(t.type, n_in);
        return w;
    }

    // Small tensors (norms, gates, conv taps) are used as fp32 arrays; convert if stored otherwise.
    const float* floats(const std::string& name, std::vector<int64_t> shape) const {
        const auto& t = get(name);
        expect(t, shape);
        if (t.type == GgmlType::F32) return reinterpret_cast<const float*>(t.data);
        const int64_t n0 = t.ne[0], rows = t.n_elements() / n0;
        if (n0 % type_traits(t.type).block_elems)
            throw Error(f.path() + ": tensor '" + name + "' row length not a multiple of its block size");
        owned.emplace_back(size_t(t.n_elements()));
        for (int64_t r = 0; r < rows; ++r)
            dequantize_row(t.type, t.data + size_t(r) * row_bytes(t.type, n0), owned.back().data() + r * n0, n0);
        return owned.back().data();
    }
};

// The MoE block of layer prefix p: router, experts (separate ffn_gate_exps / ffn_up_exps, or
// the fused ffn_gate_up_exps newer converters write), the shared expert and its gate.
void bind_moe(const Binder& b, const gguf::File& f, const Qwen35HParams& hp, const std::string& p, ref::MoeWeights& m) {
    const int64_t D = hp.n_embd, E = hp.n_expert, I = hp.n_ff_exp, Is = hp.n_ff_shexp;
    m.n_expert = hp.n_expert;
    m.n_used = hp.n_expert_used;
    m.router = b.matrix(p + "ffn_gate_inp.weight", D, E);
    if (f.find_tensor(p + "ffn_gate_up_exps.weight")) {
        const ref::ExpertMatrix gu = b.experts(p + "ffn_gate_up_exps.weight", D, 2 * I, E);
        m.gate = {gu.all, 2 * I, 0, I};
        m.up = {gu.all, 2 * I, I, I};
    } else {
        m.gate = b.experts(p + "ffn_gate_exps.weight", D, I, E);
        m.up = b.experts(p + "ffn_up_exps.weight", D, I, E);
    }
    m.down = b.experts(p + "ffn_down_exps.weight", I, D, E);
    if (Is > 0 || f.find_tensor(p + "ffn_down_shexp.weight")) {
        if (Is == 0)
            throw Error(f.path() + ": tensor '" + p + "ffn_down_shexp.weight' present but " + hp.arch() +
                        ".expert_shared_feed_forward_length is missing");
        m.shexp_gate = b.matrix(p + "ffn_gate_shexp.weight", D, Is);
        m.shexp_up = b.matrix(p + "ffn_up_shexp.weight", D, Is);
        m.shexp_down = b.matrix(p + "ffn_down_shexp.weight", Is, D);
        m.shexp_router = b.row_vector(p + "ffn_gate_inp_shexp.weight", D);
    }
    ref::check_moe_weights(m, (f.path() + ": " + p + "ffn (MoE)").c_str());
}

}  // namespace

std::unique_ptr<Qwen35Model> Qwen35Model::load(std::shared_ptr<gguf::File> file) {
    std::unique_ptr<Qwen35Model> m(new Qwen35Model());
    m->file_ = std::move(file);
    const gguf::File& f = *m->file_;
    Qwen35HParams& hp = m->hp_ = Qwen35HParams::from_gguf(f);
    Binder b{f, m->owned_};

    if (!f.find_tensor("blk.0.attn_norm.weight"))
        throw Error(f.path() + ": no tensor 'blk.0.attn_norm.weight': this looks like an MTP-only "
                    "file (llama.cpp --mtp), which cannot run on its own");
    const auto& emb = b.get("token_embd.weight");
    if (emb.ne.size() != 2 || emb.ne[0] != hp.n_embd)
        throw Error(f.path() + ": tensor 'token_embd.weight' must be {" + std::to_string(hp.n_embd) +
                    ", n_vocab}, has " + b.shape_str(emb.ne));
    hp.n_vocab = int(emb.ne[1]);
    const int64_t D = hp.n_embd;
    m->tok_embd = b.matrix("token_embd.weight", D, hp.n_vocab);
    m->output_norm = b.floats("output_norm.weight", {D});
    m->output = f.find_tensor("output.weight") ? b.matrix("output.weight", D, hp.n_vocab) : m->tok_embd;

    const int64_t H_v = hp.ssm_H_v, d_v = hp.ssm_d_v, conv_dim = hp.conv_dim(), vd = hp.value_dim();
    const int64_t q_out = int64_t(hp.n_head) * hp.head_dim, kv_out = int64_t(hp.n_head_kv) * hp.head_dim;
    // One decoder layer at prefix p: a GDN or a gated-attention block, then the FFN.
    auto bind_layer = [&](Qwen35Layer& L, const std::string& p, bool recurrent) {
        L.attn_norm = b.floats(p + "attn_norm.weight", {D});
        L.post_attn_norm = b.floats(p + "post_attention_norm.weight", {D});
        if (hp.moe()) {
            bind_moe(b, f, hp, p, L.moe);
        } else {
            L.ffn_gate = b.matrix(p + "ffn_gate.weight", D, hp.n_ff);
            L.ffn_up = b.matrix(p + "ffn_up.weight", D, hp.n_ff);
            L.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_ff, D);
        }
        if (recurrent) {
            L.ssm_qkv = b.matrix(p + "attn_qkv.weight", D, conv_dim);
            L.ssm_gate = b.matrix(p + "attn_gate.weight", D, vd);
            L.ssm_beta = b.matrix(p + "ssm_beta.weight", D, H_v);
            L.ssm_alpha = b.matrix(p + "ssm_alpha.weight", D, H_v);
            L.ssm_conv1d = b.floats(p + "ssm_conv1d.weight", {hp.conv_kernel, conv_dim});
            L.ssm_a = b.floats(p + "ssm_a", {H_v});
            L.ssm_dt = b.floats(p + "ssm_dt.bias", {H_v});
            L.ssm_norm = b.floats(p + "ssm_norm.weight", {d_v});
            L.ssm_out = b.matrix(p + "ssm_out.weight", vd, D);
        } else {
            if (f.find_tensor(p + "attn_qkv.weight"))
                throw Error(f.path() + ": tensor '" + p + "attn_qkv.weight' on a full-attention layer "
                            "(qwen35 attention layers use separate attn_q/attn_k/attn_v)");
            L.wq = b.matrix(p + "attn_q.weight", D, 2 * q_out);
            L.wk = b.matrix(p + "attn_k.weight", D, kv_out);
            L.wv = b.matrix(p + "attn_v.weight", D, kv_out);
            L.wo = b.matrix(p + "attn_output.weight", q_out, D);
            L.q_norm = b.floats(p + "attn_q_norm.weight", {hp.head_dim});
            L.k_norm = b.floats(p + "attn_k_norm.weight", {hp.head_dim});
        }
    };
    m->layers_.resize(size_t(hp.n_layer));
    for (int l = 0; l < hp.n_layer; ++l) bind_layer(m->layers_[size_t(l)], "blk." + std::to_string(l) + ".", hp.is_recurrent(l));

    // The MTP block (the first of nextn_predict_layers; llama.cpp's converter writes one): a
    // gated-attention layer whatever its index, and nextn.eh_proj [2D -> D] kept as its two
    // input halves (e's columns first), so that W (e | hh) = W_e e + W_h hh needs no concat.
    if (hp.n_layer_mtp > 0) {
        Qwen35Mtp mtp;
        const std::string p = "blk." + std::to_string(hp.n_layer) + ".";
        bind_layer(mtp.layer, p, /*recurrent=*/false);
        const WeightView eh = b.matrix(p + "nextn.eh_proj.weight", 2 * D, D);
        // Where the type's blocks straddle the halves (a 256-value block with D = 128: a small
        // model quantized to a K-quant or IQ4_XS), the halves are the rows' exact values in F32.
        const bool whole_blocks = D % type_traits(eh.type).block_elems == 0;
        const GgmlType half_type = whole_blocks ? eh.type : GgmlType::F32;
        const size_t half = row_bytes(half_type, D);
        std::vector<uint8_t> bytes[2] = {std::vector<uint8_t>(half * size_t(D)), std::vector<uint8_t>(half * size_t(D))};
        std::vector<float> values(whole_blocks ? 0 : size_t(2 * D));
        for (int64_t r = 0; r < D; ++r) {
            const uint8_t* src = eh.row(r);  // [e half | h half], as GGUF bytes or as their values
            if (!whole_blocks) {
                dequantize_row(eh.type, eh.row(r), values.data(), 2 * D);
                src = reinterpret_cast<const uint8_t*>(values.data());
            }
            for (int side = 0; side < 2; ++side) std::memcpy(&bytes[side][size_t(r) * half], src + side * half, half);
        }
        for (int side = 0; side < 2; ++side) {
            m->owned_bytes_.push_back(std::move(bytes[side]));
            WeightView& w = side == 0 ? mtp.eh_e : mtp.eh_h;
            w = eh;
            w.type = half_type;
            w.n_in = D;
            w.data = m->owned_bytes_.back().data();
            w.row_bytes = half;
        }
        mtp.enorm = b.floats(p + "nextn.enorm.weight", {D});
        mtp.hnorm = b.floats(p + "nextn.hnorm.weight", {D});
        mtp.head_norm = f.find_tensor(p + "nextn.shared_head_norm.weight") ? b.floats(p + "nextn.shared_head_norm.weight", {D})
                                                                           : m->output_norm;
        m->mtp_ = mtp;
    }
    return m;
}


// ---------------------------------------------------------------- forward, as a graph
// Written as spec/MODEL.md section 1 reads: h the residual stream, x a block's normed input,
// a its output, y the MLP's normed input. Every node works on every row here; which rows each
// needs (the last layer's, for the last token's logits), the fusions and the buffers are the
// passes' and the backend's business (runtime/graph_passes.h, runtime/backend.h).
// Builds the graph's nodes (Qwen35Model::build_graph and its MTP head).
struct Qwen35GraphBuilder {
    const Qwen35HParams& hp;
    graph::Graph& g;
    bool sharded = false;  // a tensor-parallel shard: block outputs are partial sums (all_reduce)

    int tensor(const std::string& name, int64_t cols) { return g.add_tensor(name, cols); }
    int matmul(const WeightView& w, int in, const std::string& out, const std::string& label) {
        const int t = tensor(out, w.n_out);
        g.add(graph::Op::Matmul, label, {in}, {t}).weights = {&w};
        return t;
    }
    // A block's output projection: on a shard, this rank's partial product summed over the
    // ranks (the tensor keeps the spec's name; the partial one is NAME.partial).
    int out_proj(const WeightView& w, int in, const std::string& out, const std::string& label) {
        if (!sharded) return matmul(w, in, out, label);
        return all_reduce(matmul(w, in, out + ".partial", label), out, label + ".all_reduce");
    }
    int all_reduce(int in, const std::string& out, const std::string& label) {
        const int t = tensor(out, g.tensors[size_t(in)].cols);
        g.add(graph::Op::AllReduce, label, {in}, {t}).inplace = 0;
        return t;
    }
    int rms_norm(int in, const float* w, const std::string& out, const std::string& label) {
        const int t = tensor(out, g.tensors[size_t(in)].cols);
        graph::Node& n = g.add(graph::Op::RmsNorm, label, {in}, {t});
        n.norm = w;
        n.eps = hp.eps;
        return t;
    }
    int add(int a, int b, const std::string& out, const std::string& label) {  // a + b, over a
        const int t = tensor(out, g.tensors[size_t(a)].cols);
        g.add(graph::Op::Add, label, {a, b}, {t}).inplace = 0;
        return t;
    }
    // Per-head RMSNorm + partial RoPE of `heads` heads of head_dim read at `stride` floats apart.
    int norm_rope(int in, const float* w, int heads, int64_t stride, const std::string& out, const std::string& label,
                  bool in_place) {
        const int t = tensor(out, int64_t(heads) * hp.head_dim);
        graph::Node& n = g.add(graph::Op::RmsNormRope, label, {in}, {t});
        n.norm = w;
        n.eps = hp.eps;
        n.heads = heads;
        n.head_dim = hp.head_dim;
        n.head_stride = stride;
        n.n_rot = hp.n_rot;
        n.rope_base = hp.rope_base;
        if (in_place) n.inplace = 0;
        return t;
    }

    // Gated DeltaNet (spec 3): projections, the fused op (conv, q/k norms, gates, delta rule,
    // gated RMSNorm; the layer's states updated in place), the output projection.
    int gdn_block(int l, const Qwen35Layer& L, int x) {
        const std::string p = "blk." + std::to_string(l) + ".", q = p + "gdn.";
        const int qkv = matmul(L.ssm_qkv, x, q + "mixed_qkv", p + "attn_qkv");
        const int z = matmul(L.ssm_gate, x, q + "z", p + "attn_gate");
        const int b = matmul(L.ssm_beta, x, q + "b", p + "ssm_beta");
        const int a = matmul(L.ssm_alpha, x, q + "a", p + "ssm_alpha");
        const int y = tensor(q + "y", hp.value_dim());
        graph::Node& n = g.add(graph::Op::GdnFused, p + "gdn", {qkv, z, b, a}, {y});
        n.layer = l;
        n.gdn.shape = {hp.ssm_H_k, hp.ssm_H_v, hp.ssm_d_k, hp.ssm_d_v, /*tiled=*/true};
        n.gdn.conv_kernel = hp.conv_kernel;
        n.gdn.eps = hp.eps;
        n.gdn.mode = g.spec.gdn_mode;
        n.gdn.chunk_size = g.spec.gdn_chunk;
        n.gdn_w = {L.ssm_conv1d, L.ssm_a, L.ssm_dt, L.ssm_norm};
        return out_proj(L.ssm_out, y, p + "a", p + "ssm_out");
    }

    // Gated attention (spec 4): q and its gate interleaved per head, q/k RMSNorm + partial RoPE,
    // K/V stored into the layer's cache in its type, causal GQA, the sigmoid gate, the output
    // projection.
    int attn_block(int l, const Qwen35Layer& L, int x) {
        const std::string p = "blk." + std::to_string(l) + ".", q = p + "attn.";
        const int nh = hp.n_head, nkv = hp.n_head_kv, hd = hp.head_dim;
        const int qg = matmul(L.wq, x, q + "qg", p + "attn_q");  // [T, n_h, 2, hd]: per head [q | gate]
        const int k = matmul(L.wk, x, q + "k", p + "attn_k");
        const int v = matmul(L.wv, x, q + "v", p + "attn_v");
        const int kr = norm_rope(k, L.k_norm, nkv, hd, q + "k_rope", p + "attn_k_norm+rope_k", /*in_place=*/true);
        g.add(graph::Op::KvStore, p + "kv_store", {kr, v}, {}).layer = l;
        const int qr = norm_rope(qg, L.q_norm, nh, 2 * int64_t(hd), q + "q_rope", p + "attn_q_norm+rope_q", false);
        const int o = tensor(q + "o", int64_t(nh) * hd);
        graph::Node& n = g.add(graph::Op::Attention, p + "attention", {qr}, {o});
        n.layer = l;
        n.attn = {nh, nkv, hd, 1.0f / std::sqrt(float(hd))};
        const int gated = tensor(q + "gated", int64_t(nh) * hd);
        graph::Node& gm = g.add(graph::Op::SigmoidGateMul, p + "attn_gate", {o, qg}, {gated});
        gm.inplace = 0;
        gm.heads = nh;
        gm.head_dim = hd;
        gm.head_stride = 2 * int64_t(hd);  // the gate halves of qg, read in place
        gm.in_offset = hd;
        return out_proj(L.wo, gated, p + "a", p + "attn_output");
    }

    // SwiGLU MLP (spec 6) or the MoE block (spec 7, one op: router, experts, shared expert).
    int ffn(int l, const Qwen35Layer& L, int y) {
        const std::string p = "blk." + std::to_string(l) + ".", q = p + "ffn.";
        if (hp.moe()) {
            const int f = tensor(p + (sharded ? "ffn_out.partial" : "ffn_out"), hp.n_embd);
            g.add(graph::Op::MoeFfn, p + "ffn_moe", {y}, {f}).moe = &L.moe;
            return sharded ? all_reduce(f, p + "ffn_out", p + "ffn_moe.all_reduce") : f;
        }
        const int gate = matmul(L.ffn_gate, y, q + "gate", p + "ffn_gate");
        const int up = matmul(L.ffn_up, y, q + "up", p + "ffn_up");
        const int act = tensor(q + "act", hp.n_ff);
        g.add(graph::Op::Swiglu, p + "swiglu", {gate, up}, {act});
        return out_proj(L.ffn_down, act, p + "ffn_out", p + "ffn_down");
    }
};

graph::Graph Qwen35Model::build_graph(const graph::GraphSpec& spec) const {
    graph::Graph g;
    g.spec = spec;
    Qwen35GraphBuilder b{hp_, g, tp_size_ > 0};
    if (spec.mtp_alone) {
        const int h = b.tensor("mtp.h_in", hp_.n_embd);
        g.add(graph::Op::Input, "mtp.hidden", {}, {h});
        const int en = b.tensor("mtp.e_next", hp_.n_embd);
        g.add(graph::Op::Embed, "mtp.token_embd", {}, {en}).weights = {&tok_embd};
        mtp_head(b, h, en);
        return g;
    }
    int h = b.tensor("h0", hp_.n_embd);
    g.add(graph::Op::Embed, "token_embd", {}, {h}).weights = {&tok_embd};
    for (int l = 0; l < hp_.n_layer; ++l) {
        const Qwen35Layer& L = layers_[size_t(l)];
        const std::string p = "blk." + std::to_string(l) + ".";
        const int x = b.rms_norm(h, L.attn_norm, p + "x", p + "attn_norm");
        const int a = hp_.is_recurrent(l) ? b.gdn_block(l, L, x) : b.attn_block(l, L, x);
        h = b.add(h, a, p + "h_mid", p + "residual");
        const int y = b.rms_norm(h, L.post_attn_norm, p + "y", p + "post_attention_norm");
        h = b.add(h, b.ffn(l, L, y), p + "h", p + "residual");
    }
    if (spec.mtp) {
        const int en = b.tensor("mtp.e_next", hp_.n_embd);
        graph::Node& emb = g.add(graph::Op::Embed, "mtp.token_embd", {}, {en});
        emb.weights = {&tok_embd};
        emb.next_token = true;
        mtp_head(b, h, en);
        return g;
    }
    if (spec.logits == graph::Rows::None) return g;  // an inner piece of a long prompt: states only
    const int hf = b.rms_norm(h, output_norm, "hf", "output_norm");
    const int logits = b.matmul(output, hf, "logits", "output");
    g.tensors[size_t(logits)].logits = true;
    return g;
}

// spec/MODEL.md section 8 on h (the trunk's pre-norm hidden rows) and en (the next tokens'
// embeddings): c = W_eh (enorm(en) | hnorm(h)), one gated-attention decoder layer (its own
// cache: layer n_layer) at the rows' positions, shared_head_norm, the LM head.
void Qwen35Model::mtp_head(Qwen35GraphBuilder& b, int h, int en) const {
    if (!mtp_) throw Error(file_->path() + ": the model has no MTP block (nextn_predict_layers is 0)");
    const Qwen35Mtp& M = *mtp_;
    graph::Graph& g = b.g;
    const int l = hp_.n_layer;
    const std::string p = "mtp.", q = "blk." + std::to_string(l) + ".";
    const int e = b.rms_norm(en, M.enorm, p + "e", "mtp.enorm");
    const int hh = b.rms_norm(h, M.hnorm, p + "hh", "mtp.hnorm");
    int c = b.matmul(M.eh_e, e, p + "c", "mtp.eh_proj_e");
    c = b.add(c, b.matmul(M.eh_h, hh, p + "c_h", "mtp.eh_proj_h"), p + "c_sum", "mtp.eh_proj");
    const int x = b.rms_norm(c, M.layer.attn_norm, q + "x", q + "attn_norm");
    int hm = b.add(c, b.attn_block(l, M.layer, x), q + "h_mid", q + "residual");
    const int y = b.rms_norm(hm, M.layer.post_attn_norm, q + "y", q + "post_attention_norm");
    hm = b.add(hm, b.ffn(l, M.layer, y), q + "h", q + "residual");  // h': the next chained step's hidden row
    const int hf = b.rms_norm(hm, M.head_norm, "mtp.hf", "mtp.shared_head_norm");
    const int logits = b.matmul(output, hf, "logits", "output");
    g.tensors[size_t(logits)].logits = true;
}

}  // namespace alloy

namespace alloy {

int Qwen35Model::repack_for_cpu(bool (*allow)(GgmlType)) {
    // The resident copy is this process's own anonymous memory (gguf::File, ResidentBytes),
    // read-only only through the views' type; a mapped file's pages are not written.
    if (!file_->resident()) return 0;
    int n = 0;
    const auto one = [&](WeightView& w) {
        if (!allow || allow(w.type)) n += cpu::repack_weight(w, const_cast<uint8_t*>(w.data));
    };
    // An expert tensor as one matrix of E x stride rows, where every expert's slice (ExpertMatrix::at)
    // is then whole groups: stride, offset and rows multiples of the group.
    const auto whole_groups = [](const ref::ExpertMatrix& m) {
        constexpr int64_t G = cpu::kRepackGroupRows;
        return m.stride % G == 0 && m.offset % G == 0 && m.rows % G == 0;
    };
    for (Qwen35Layer& L : layers_) {
        for (WeightView* w : {&L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.ssm_qkv, &L.ssm_gate, &L.ssm_beta, &L.ssm_alpha,
                              &L.ssm_out, &L.wq, &L.wk, &L.wv, &L.wo, &L.moe.shexp_gate, &L.moe.shexp_up,
                              &L.moe.shexp_down})
            one(*w);
        ref::MoeWeights& m = L.moe;
        if (m.n_expert > 0 && whole_groups(m.gate) && whole_groups(m.up)) {
            one(m.gate.all);
            if (m.up.all.data == m.gate.all.data) m.up.all.layout = m.gate.all.layout;  // a fused gate_up tensor: once
            else one(m.up.all);
        }
        if (m.n_expert > 0 && whole_groups(m.down)) one(m.down.all);
    }
    const bool tied = output.data == tok_embd.data;
    one(output);
    if (tied) tok_embd.layout = output.layout;
    return n;
}

}  // namespace alloy
