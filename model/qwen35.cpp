#include "model/qwen35.h"

#include <algorithm>
#include <cmath>
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

void ModelState::check_slot(int slot) const {
    if (slot < 0 || slot >= n_slots)
        throw Error("state slot " + std::to_string(slot) + " out of range (0.." + std::to_string(n_slots - 1) + ")");
}

void ModelState::reset(int slot) {
    check_slot(slot);
    n_past[size_t(slot)] = 0;
    for (size_t l = 0; l < conv_state.size(); ++l) {
        if (conv_state[l].empty()) continue;
        std::fill_n(conv(int(l), slot), conv_elems, 0.0f);
        std::fill_n(ssm(int(l), slot), ssm_elems, 0.0f);
    }
}

void ModelState::reset() {
    for (int s = 0; s < n_slots; ++s) reset(s);
}

int64_t Batch::logit_rows() const {
    int64_t r = 0;
    for (const BatchSeq& q : seqs) r += q.logits == BatchLogits::All ? q.n_tokens : q.logits == BatchLogits::Last ? 1 : 0;
    return r;
}

// ---------------------------------------------------------------- weight binding
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
    m->layers_.resize(size_t(hp.n_layer));
    for (int l = 0; l < hp.n_layer; ++l) {
        Qwen35Layer& L = m->layers_[size_t(l)];
        const std::string p = "blk." + std::to_string(l) + ".";
        L.attn_norm = b.floats(p + "attn_norm.weight", {D});
        L.post_attn_norm = b.floats(p + "post_attention_norm.weight", {D});
        if (hp.moe()) {
            bind_moe(b, f, hp, p, L.moe);
        } else {
            L.ffn_gate = b.matrix(p + "ffn_gate.weight", D, hp.n_ff);
            L.ffn_up = b.matrix(p + "ffn_up.weight", D, hp.n_ff);
            L.ffn_down = b.matrix(p + "ffn_down.weight", hp.n_ff, D);
        }
        if (hp.is_recurrent(l)) {
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
    }
    return m;
}

ModelState Qwen35Model::new_state(int n_ctx, KvCacheTypes kv_types, int n_slots) const {
    if (n_ctx <= 0) throw Error("context size must be positive, got " + std::to_string(n_ctx));
    if (n_slots <= 0 || n_slots > 4096)
        throw Error("the number of sequence slots must be in [1, 4096], got " + std::to_string(n_slots));
    for (GgmlType t : {kv_types.k, kv_types.v})
        if (!ref::kv_type_supported(t))
            throw Error(std::string("KV cache type must be f32, f16 or bf16, got ") + type_traits(t).name);
    ModelState s;
    s.n_slots = n_slots;
    s.n_ctx = n_ctx;
    s.kv_types = kv_types;
    s.n_past.assign(size_t(n_slots), 0);
    s.conv_elems = size_t(hp_.conv_dim()) * size_t(hp_.conv_kernel - 1);
    s.ssm_elems = size_t(hp_.ssm_H_v) * hp_.ssm_d_v * hp_.ssm_d_k;
    const size_t L = size_t(hp_.n_layer);
    s.k_cache.resize(L);
    s.v_cache.resize(L);
    s.conv_state.resize(L);
    s.ssm_state.resize(L);
    const size_t kv = size_t(n_ctx) * size_t(hp_.n_head_kv) * size_t(hp_.head_dim);
    for (int l = 0; l < hp_.n_layer; ++l) {
        if (hp_.is_recurrent(l)) {
            s.conv_state[size_t(l)].assign(s.conv_elems * size_t(n_slots), 0.0f);
            s.ssm_state[size_t(l)].assign(s.ssm_elems * size_t(n_slots), 0.0f);
        } else {
            for (int slot = 0; slot < n_slots; ++slot) {
                s.k_cache[size_t(l)].emplace_back(kv * ref::kv_elem_bytes(kv_types.k));
                s.v_cache[size_t(l)].emplace_back(kv * ref::kv_elem_bytes(kv_types.v));
            }
        }
    }
    return s;
}

// ---------------------------------------------------------------- forward
namespace {
std::string matmul_kernel(const WeightView& w) { return std::string("matmul_") + type_traits(w.type).name; }
}  // namespace

void Qwen35Model::drop_plans() const {
    plans_.clear();
    plan_arena_ = std::make_shared<PlanArena>();
}

int Qwen35Model::bucket_for(int n, const ForwardOptions& opts) {
    if (n == 1) return 1;  // decode has its own plan
    const int c = std::max(1, opts.gdn_chunk);
    return (n + c - 1) / c * c;
}

std::unique_ptr<Plan> Qwen35Model::build_plan(int bucket, const ForwardOptions& opts, int logits_mode) const {
    const Qwen35HParams& hp = hp_;
    auto plan = std::make_unique<Plan>(bucket, plan_arena_);
    const int64_t B = bucket, D = hp.n_embd;
    const float eps = hp.eps;
    // Buffers for the largest call of this bucket; every step uses only the first ctx.n rows.
    float* x = plan->buffer(size_t(B * D));   // [B, D] residual stream, fp32
    float* h = plan->buffer(size_t(B * D));   // [B, D] normed block input
    float* o = plan->buffer(size_t(B * D));   // [B, D] block output
    const int64_t cd = hp.conv_dim(), vd = hp.value_dim(), H_v = hp.ssm_H_v;
    const int nh = hp.n_head, nkv = hp.n_head_kv, hd = hp.head_dim;
    // The buffers of a GDN block, of an attention block and of the MLP are never live at the
    // same time (a layer is one block type, and the MLP starts after the block's output is in
    // o), so the three sets share one region: the plan's scratch is the largest set, not
    // their sum (-35 MB at the 0.8B shapes and a 512 bucket).
    struct Carve {
        float* p;
        float* take(int64_t n) { return std::exchange(p, p + n); }
    };
    const int64_t gdn_set = B * (cd + 2 * vd + 2 * H_v);
    const int64_t attn_set = B * (int64_t(nh) * hd * 5 + int64_t(nkv) * hd * 2);
    const int64_t mlp_set = hp.moe() ? 0 : B * 2 * hp.n_ff;  // moe_ffn keeps its own scratch
    float* shared = plan->buffer(size_t(std::max({gdn_set, attn_set, mlp_set})));
    Carve g{shared}, at{shared}, mlp{shared};
    float* qkv = g.take(B * cd);                      // [B, conv_dim]
    float* z = g.take(B * vd);                        // [B, value_dim]
    float* a = g.take(B * H_v);                       // [B, H_v]
    float* b = g.take(B * H_v);                       // [B, H_v]
    float* y = g.take(B * vd);                        // [B, value_dim]
    float* qg = at.take(B * nh * 2 * hd);             // [B, n_head, 2, hd]
    float* q = at.take(B * nh * hd);                  // [B, n_head, hd] normed, rotated
    float* att = at.take(B * nh * hd);                // [B, n_head, hd]
    float* kx = at.take(B * nkv * hd);                // [B, n_head_kv, hd] K before the cache
    float* vx = at.take(B * nkv * hd);                // [B, n_head_kv, hd] V before the cache
    float* ffg = mlp.take(B * hp.n_ff);               // [B, n_ff]
    float* ffu = mlp.take(B * hp.n_ff);               // [B, n_ff]
    int32_t* pos = reinterpret_cast<int32_t*>(plan->buffer(size_t(B)));  // [B] absolute positions
    // cos/sin of every (position, frequency) of this call, built once and shared by all layers.
    auto rope = std::make_shared<cpu::RopeTable>();

    ref::GdnParams gp;
    gp.shape = {hp.ssm_H_k, hp.ssm_H_v, hp.ssm_d_k, hp.ssm_d_v, /*tiled=*/true};
    gp.conv_kernel = hp.conv_kernel;
    gp.eps = eps;
    gp.mode = opts.gdn_mode;
    gp.chunk_size = opts.gdn_chunk;
    const std::string gdn_kernel = opts.gdn_mode == ref::GdnMode::Serial ? "gdn_fused_serial" : "gdn_fused_chunked";

    // Rows a step works on. Every layer works on all rows, except the last one of a pass that
    // returns only the last token's logits (Rows::Last) or none (Rows::None: an inner piece of a
    // long prompt): past the part that writes state (K/V rows into the cache, the GDN states),
    // only the last row feeds the output norm, so that layer's q, attention, output projection
    // and MLP run on that row alone, or not at all, as llama.cpp does with its output ids. At
    // the 0.8B shapes that is 3.5% of the weight products and 1/6 of the attention.
    // Such a step writes row 0 of its scratch output; it reads row n - 1 of an input that still
    // has every row (h, y: `from_last`) and of the residual stream x, whose row n - 1 is the
    // one the output norm reads.
    enum class Rows { All, Last, None };
    auto n_rows = [](Rows r, const StepContext& c) -> int64_t { return r == Rows::All ? c.n : r == Rows::Last ? 1 : 0; };
    auto row0 = [](Rows r, const StepContext& c) -> int64_t { return r == Rows::Last ? c.n - 1 : 0; };

    auto mm = [&](const WeightView& w, const float* in, float* out, const std::string& label, Rows r = Rows::All,
                  bool from_last = false) {
        plan->add(matmul_kernel(w), label, [&w, in, out, r, from_last, n_rows, row0](const StepContext& c) {
            cpu::matmul(w, from_last ? in + row0(r, c) * w.n_in : in, out, n_rows(r, c));
        });
    };
    // Weights that read the same input run as one call (activations prepared once, one pool
    // region); the profile shows such a step under the first weight's label.
    auto mm_multi = [&](std::vector<cpu::MatmulOut> outs, const float* in, const std::string& label, Rows r = Rows::All) {
        const std::string kernel = matmul_kernel(*outs[0].W);  // before outs is moved from
        plan->add(kernel, label, [outs = std::move(outs), in, r, n_rows](const StepContext& c) {
            cpu::matmul_multi(outs.data(), int(outs.size()), in, n_rows(r, c));
        });
    };
    // Rows [row0, row0 + n) of `in` (the residual stream x) -> rows [0, n) of `out` (h).
    auto norm = [&](const float* in, const float* w, float* out, const std::string& label, Rows r = Rows::All) {
        plan->add("rms_norm", label, [=](const StepContext& c) {
            cpu::rms_norm(in + row0(r, c) * D, w, out, n_rows(r, c), D, eps);
        });
    };
    auto add_residual = [&](const std::string& label, Rows r = Rows::All) {
        plan->add("add", label, [=](const StepContext& c) { cpu::add(x + row0(r, c) * D, o, n_rows(r, c) * D); });
    };
    // The residual add and the norm that follows it, in one pass: x += o, h = rms_norm(x) w.
    auto add_norm = [&](const float* w, const std::string& label, Rows r = Rows::All) {
        plan->add("add_rms_norm", label, [=](const StepContext& c) {
            cpu::add_rms_norm(x + row0(r, c) * D, o, w, h, n_rows(r, c), D, eps);
        });
    };

    plan->add("embed", "token_embd", [this, x, pos, D](const StepContext& c) {
        for (int t = 0; t < c.n; ++t) {
            if (c.ids[t] < 0 || c.ids[t] >= hp_.n_vocab)
                throw Error("token id " + std::to_string(c.ids[t]) + " at position " + std::to_string(t) +
                            " is outside the vocabulary [0, " + std::to_string(hp_.n_vocab) + ")");
            dequantize_row(tok_embd.type, tok_embd.row(c.ids[t]), x + int64_t(t) * D, D);
        }
        for (int s = 0; s < c.n_seqs; ++s)  // each sequence continues its slot
            for (int t = c.offsets[s]; t < c.offsets[s + 1]; ++t) pos[t] = c.n_past[s] + t - c.offsets[s];
    });
    // The last row's own table serves the pruned last layer's single query; built only by
    // plans that have one (not decode, where the last layer runs its one row as it is).
    const bool last_query_only = logits_mode == 1 && bucket > 1 && !hp.is_recurrent(hp.n_layer - 1);
    auto rope_last = std::make_shared<cpu::RopeTable>();
    plan->add("rope_table", "rope", [=, this](const StepContext& c) {
        *rope = cpu::rope_table(pos, c.n, hp_.n_rot, hp_.rope_base);
        if (last_query_only) *rope_last = cpu::rope_table(pos + c.n - 1, 1, hp_.n_rot, hp_.rope_base);
    });

    for (int l = 0; l < hp.n_layer; ++l) {
        const Qwen35Layer& L = layers_[size_t(l)];
        const std::string p = "blk." + std::to_string(l) + ".";
        // decode: one row anyway; a batch of several sequences (mode 3) keeps every row.
        const bool every_row = l + 1 < hp.n_layer || logits_mode >= 2 || bucket == 1;
        const Rows out = every_row ? Rows::All : logits_mode == 1 ? Rows::Last : Rows::None;
        if (l == 0) norm(x, L.attn_norm, h, p + "attn_norm");  // later layers': fused into the residual add before
        if (hp.is_recurrent(l)) {
            // Gated DeltaNet: projections, the fused op (conv, norms, gates, delta rule, gated
            // RMSNorm; states updated in place), the output projection.
            mm_multi({{&L.ssm_qkv, qkv}, {&L.ssm_gate, z}, {&L.ssm_beta, b}, {&L.ssm_alpha, a}}, h,
                     p + "attn_qkv+attn_gate+ssm_beta+ssm_alpha");
            plan->add(gdn_kernel, p + "gdn", [=, &L](const StepContext& c) {
                ref::GdnWeights gw{L.ssm_conv1d, L.ssm_a, L.ssm_dt, L.ssm_norm};
                float* conv = c.state->conv_state[size_t(l)].data();  // [slots, conv_dim, K-1]
                float* ssm = c.state->ssm_state[size_t(l)].data();    // [slots, H_v, d_v, d_k]
                // One call per run of sequences with the same kernel (a mixed step: decoding
                // sequences serial, prefilling ones chunked), each on its slots.
                for (int s0 = 0; s0 < c.n_seqs;) {
                    int s1 = s0 + 1;
                    while (s1 < c.n_seqs && c.serial[s1] == c.serial[s0]) ++s1;
                    ref::GdnParams run = gp;
                    if (c.serial[s0]) run.mode = ref::GdnMode::Serial;
                    cpu::gdn_fused(run, gw, s1 - s0, c.offsets + s0, qkv, z, a, b, conv, ssm, y, c.slots + s0);
                    s0 = s1;
                }
            });
            if (out == Rows::None) continue;
            mm(L.ssm_out, y, o, p + "ssm_out", out, /*from_last=*/true);
        } else {
            // Gated attention: q/gate interleaved per head, q/k RMSNorm, partial RoPE, GQA.
            // K and V of this call in fp32 (projection, k_norm, RoPE), then stored into the
            // cache rows [n_past, n_past + n) in the cache's type.
            const int64_t kvw = int64_t(nkv) * hd;
            if (out == Rows::All) {
                mm_multi({{&L.wq, qg}, {&L.wk, kx}, {&L.wv, vx}}, h, p + "attn_q+attn_k+attn_v");
            } else {
                mm_multi({{&L.wk, kx}, {&L.wv, vx}}, h, p + "attn_k+attn_v");
                if (out == Rows::Last) mm(L.wq, h, qg, p + "attn_q", Rows::Last, /*from_last=*/true);
            }
            plan->add("rms_norm_rope", p + "attn_k_norm+rope_k", [=, &L](const StepContext& c) {
                cpu::rms_norm_rope(*rope, kx, hd, L.k_norm, kx, nkv, hd, eps);
            });
            plan->add("kv_store", p + "kv_store", [=](const StepContext& c) {
                const KvCacheTypes& t = c.state->kv_types;
                for (int s = 0; s < c.n_seqs; ++s) {  // rows of sequence s -> its slot's rows [n_past, ...)
                    const size_t row0 = size_t(c.n_past[s]) * size_t(kvw), first = size_t(c.offsets[s]) * size_t(kvw);
                    const int64_t n = int64_t(c.offsets[s + 1] - c.offsets[s]) * kvw;
                    auto* kc = static_cast<char*>(c.state->k_cache[size_t(l)][size_t(c.slots[s])].data()) + row0 * ref::kv_elem_bytes(t.k);
                    auto* vc = static_cast<char*>(c.state->v_cache[size_t(l)][size_t(c.slots[s])].data()) + row0 * ref::kv_elem_bytes(t.v);
                    cpu::kv_store(kx + first, kc, t.k, n);
                    cpu::kv_store(vx + first, vc, t.v, n);
                }
            });
            if (out == Rows::None) continue;
            // The queries: all rows, or the last one alone (at position n_past + n - 1), read
            // in place from the interleaved [query | gate] heads of the projection.
            plan->add("rms_norm_rope", p + "attn_q_norm+rope_q", [=, &L](const StepContext& c) {
                cpu::rms_norm_rope(out == Rows::All ? *rope : *rope_last, qg, 2 * hd, L.q_norm, q, nh, hd, eps);
            });
            const ref::AttentionShape as{nh, nkv, hd, 1.0f / std::sqrt(float(hd))};
            const bool one_query = bucket == 1 || out == Rows::Last;
            const char* attn_kernel = one_query ? "attention_decode" : logits_mode == 3 ? "attention" : "attention_prefill";
            plan->add(attn_kernel, p + "attention", [=](const StepContext& c) {
                ref::AttentionShape s = as;
                s.type_k = c.state->kv_types.k;
                s.type_v = c.state->kv_types.v;
                const auto& kc = c.state->k_cache[size_t(l)];
                const auto& vc = c.state->v_cache[size_t(l)];
                if (out != Rows::All) {  // the pruned last layer of a one-sequence pass
                    cpu::attention(s, q, kc[size_t(c.slots[0])].data(), vc[size_t(c.slots[0])].data(), att, n_rows(out, c),
                                   c.n_past[0] + row0(out, c));
                    return;
                }
                for (int i = 0; i < c.n_seqs; ++i) {  // each sequence against its own cache
                    const int64_t first = int64_t(c.offsets[i]) * nh * hd;
                    cpu::attention(s, q + first, kc[size_t(c.slots[i])].data(), vc[size_t(c.slots[i])].data(), att + first,
                                   c.offsets[i + 1] - c.offsets[i], c.n_past[i]);
                }
            });
            plan->add("sigmoid_gate_mul", p + "attn_gate", [=](const StepContext& c) {
                cpu::sigmoid_gate_mul(att, qg + hd, n_rows(out, c) * nh, hd, 2 * hd);
            });
            mm(L.wo, att, o, p + "attn_output", out);
        }
        // SwiGLU MLP, or the MoE block (one op: router, experts, shared expert).
        add_norm(L.post_attn_norm, p + "residual+post_attention_norm", out);
        if (hp.moe()) {
            plan->add("moe_ffn", p + "ffn_moe", [=, &L](const StepContext& c) {
                cpu::moe_ffn(L.moe, h, o, n_rows(out, c));
            });
        } else {
            // gate and up products and their SwiGLU in one step (the profile counts it as a matmul).
            plan->add(matmul_kernel(L.ffn_gate), p + "ffn_gate+ffn_up+swiglu", [=, &L](const StepContext& c) {
                cpu::matmul_swiglu(L.ffn_gate, L.ffn_up, h, ffg, ffu, n_rows(out, c));
            });
            mm(L.ffn_down, ffg, o, p + "ffn_down", out);
        }
        if (l + 1 < hp.n_layer)  // every row: only the last layer has fewer
            add_norm(layers_[size_t(l) + 1].attn_norm, p + "residual+blk." + std::to_string(l + 1) + ".attn_norm");
        else
            add_residual(p + "residual", out);
    }

    // Final norm and LM head, for every token or only the last (or none for an inner piece),
    // or (mode 3, a batch) the rows the context lists.
    if (logits_mode == 0) return plan;
    if (logits_mode == 3) {
        plan->add("rms_norm", "output_norm", [=, this](const StepContext& c) {
            for (int i = 0; i < c.n_out; ++i) cpu::rms_norm(x + int64_t(c.out_rows[i]) * D, output_norm, h + int64_t(i) * D, 1, D, eps);
        });
        plan->add(matmul_kernel(output), "output", [=, this](const StepContext& c) {
            cpu::matmul(output, h, c.logits, c.n_out);
        });
        return plan;
    }
    const bool all = logits_mode == 2;
    plan->add("rms_norm", "output_norm", [=, this](const StepContext& c) {
        const int64_t first = all ? 0 : c.n - 1;
        cpu::rms_norm(x + first * D, output_norm, h, c.n - first, D, eps);
    });
    plan->add(matmul_kernel(output), "output", [=, this](const StepContext& c) {
        cpu::matmul(output, h, c.logits, all ? c.n : 1);
    });
    return plan;
}

void Qwen35Model::forward(ModelState& st, const int32_t* ids, int n, const ForwardOptions& opts, float* logits,
                          Profiler* prof, int slot) const {
    if (n <= 0) throw Error("forward: no tokens to process");
    Batch b;
    b.add(slot, ids, n, opts.all_logits ? BatchLogits::All : BatchLogits::Last, opts.gdn_mode == ref::GdnMode::Serial);
    forward(st, b, opts, logits, prof);
}

void Qwen35Model::forward(ModelState& st, const Batch& batch, const ForwardOptions& opts, float* logits,
                          Profiler* prof) const {
    const int n_seqs = int(batch.seqs.size());
    if (n_seqs == 0) throw Error("forward: the batch has no sequences");
    int64_t total = 0;
    std::vector<uint8_t> used(size_t(st.n_slots), 0);
    for (int i = 0; i < n_seqs; ++i) {
        const BatchSeq& q = batch.seqs[size_t(i)];
        const std::string who = "forward: batch sequence " + std::to_string(i) + " (slot " + std::to_string(q.slot) + ")";
        if (q.slot < 0 || q.slot >= st.n_slots)
            throw Error(who + ": slot out of range (0.." + std::to_string(st.n_slots - 1) + ")");
        if (used[size_t(q.slot)]++) throw Error(who + ": the slot appears twice in one batch");
        if (q.n_tokens <= 0) throw Error(who + ": no tokens to process");
        if (int64_t(st.n_past[size_t(q.slot)]) + q.n_tokens > st.n_ctx)
            throw Error(who + ": sequence of " + std::to_string(int64_t(st.n_past[size_t(q.slot)]) + q.n_tokens) +
                        " tokens exceeds the context size of " + std::to_string(st.n_ctx) + " (raise --ctx)");
        total += q.n_tokens;
    }
    if (total != int64_t(batch.ids.size()))
        throw Error("forward: the batch has " + std::to_string(batch.ids.size()) + " token ids but its sequences count " +
                    std::to_string(total));
    const size_t V = size_t(hp_.n_vocab);
    StepContext ctx;
    ctx.state = &st;
    if (n_seqs == 1) {
        // One sequence: consecutive pieces of at most max_batch tokens (the states carry over).
        const BatchSeq& q = batch.seqs[0];
        const int c = std::max(1, opts.gdn_chunk);
        const int piece = std::max(c, opts.max_batch / c * c);
        const int32_t slot = q.slot;
        const uint8_t serial = q.serial;
        for (int done = 0; done < q.n_tokens;) {
            const int len = std::min(piece, q.n_tokens - done);
            const bool last = done + len == q.n_tokens;
            const int mode = q.logits == BatchLogits::All ? 2 : q.logits == BatchLogits::Last && last ? 1 : 0;
            const int32_t offsets[2] = {0, len}, n_past = st.n_past[size_t(slot)];
            ctx.ids = batch.ids.data() + done;
            ctx.n = len;
            ctx.n_seqs = 1;
            ctx.offsets = offsets;
            ctx.slots = &slot;
            ctx.n_past = &n_past;
            ctx.serial = &serial;
            ctx.logits = q.logits == BatchLogits::All ? logits + size_t(done) * V : logits;
            run_plan(ctx, bucket_for(len, opts), opts, mode, prof);
            st.n_past[size_t(slot)] += len;
            done += len;
        }
        return;
    }
    // Several sequences: one step over all their tokens.
    const size_t ns = size_t(n_seqs);
    std::vector<int32_t> offsets(ns + 1, 0), slots(ns, 0), n_past(ns, 0), out_rows;
    std::vector<uint8_t> serial(ns, 0);
    for (int i = 0; i < n_seqs; ++i) {
        const BatchSeq& q = batch.seqs[size_t(i)];
        offsets[size_t(i) + 1] = offsets[size_t(i)] + q.n_tokens;
        slots[size_t(i)] = q.slot;
        n_past[size_t(i)] = st.n_past[size_t(q.slot)];
        serial[size_t(i)] = q.serial;
        if (q.logits == BatchLogits::Last) out_rows.push_back(offsets[size_t(i) + 1] - 1);
        if (q.logits == BatchLogits::All)
            for (int t = offsets[size_t(i)]; t < offsets[size_t(i) + 1]; ++t) out_rows.push_back(t);
    }
    ctx.ids = batch.ids.data();
    ctx.n = int(total);
    ctx.n_seqs = n_seqs;
    ctx.offsets = offsets.data();
    ctx.slots = slots.data();
    ctx.n_past = n_past.data();
    ctx.serial = serial.data();
    ctx.out_rows = out_rows.data();
    ctx.n_out = int(out_rows.size());
    ctx.logits = logits;
    run_plan(ctx, bucket_for(int(total), opts), opts, out_rows.empty() ? 0 : 3, prof);
    for (const BatchSeq& q : batch.seqs) st.n_past[size_t(q.slot)] += q.n_tokens;
}

void Qwen35Model::run_plan(const StepContext& ctx, int bucket, const ForwardOptions& opts, int logits_mode,
                           Profiler* prof) const {
    auto key = std::make_tuple(bucket, logits_mode, int(opts.gdn_mode), opts.gdn_chunk);
    auto it = plans_.find(key);
    if (it == plans_.end()) {
        if (plans_.size() >= 6) plans_.clear();  // bound the memory held by old buckets
        it = plans_.emplace(key, build_plan(bucket, opts, logits_mode)).first;
    }
    it->second->replay(ctx, prof);
}

}  // namespace alloy
