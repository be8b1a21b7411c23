#include "runtime/cpu_backend.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <tuple>

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
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ref/kv_store.h"
#include "runtime/gdn_replay.h"
#include "runtime/graph_passes.h"
#include "runtime/graph_storage.h"

namespace alloy {

using graph::Node;
using graph::Op;
using graph::Rows;

namespace {

std::string matmul_kernel(const WeightView& w) { return std::string("matmul_") + type_traits(w.type).name; }

// The kernels' scratch (kernels/cpu/workspace.h): one region for all the plan's nodes, since
// they run one at a time, allocated with the plan's buffers (from the shared arena) and sized
// at compile time for the largest call each node can make in this bucket (node_workspace).
// What that size cannot know grows it at replay, once, before the call: attention over a
// longer context than the bucket's own keys (decode's partial softmax states, a cell per 256
// keys: sized then for the state's whole context), a chunked GDN call over several sequences
// (a state copy each), or a pool with more threads than at compile time (per-thread slices).
class Workspace {
public:
    Workspace(void* p, size_t bytes) : p_(p), bytes_(bytes), threads_(cpu::n_threads()) {}
    size_t bytes() const { return bytes_; }
    // The region for a call needing `need` bytes.
    void* get(size_t need) {
        if (need > bytes_) {
            keep_.clear();  // an earlier growth's block (the arena's stays with the plan)
            p_ = grown_.slot(0, (need + sizeof(float) - 1) / sizeof(float), keep_);  // aligned, poisoned in tests
            bytes_ = need;
        }
        return p_;
    }
    // The same for a call whose count (need()) depends on the tokens only through the bucket,
    // which the compile-time size covers while the pool has no more threads than then.
    template <class F>
    void* get_sized(const F& need) {
        return cpu::n_threads() <= threads_ ? p_ : get(need());
    }

private:
    void* p_;
    size_t bytes_;
    int threads_;
    PlanArena grown_;
    std::vector<std::shared_ptr<float[]>> keep_;
};

// The attention workspace of each sequence's call in a plan of up to T tokens over the bucket's
// own keys (a longer context grows it), for either block size (16-bit K caches take larger
// prefill blocks; the state says which).
size_t attention_bucket_workspace(const ref::AttentionShape& as, int64_t T) {
    size_t b = 0;
    for (GgmlType k : {GgmlType::F32, GgmlType::F16}) {
        ref::AttentionShape s = as;
        s.type_k = s.type_v = k;
        for (int64_t t = 1; t <= T; ++t) b = std::max(b, cpu::attention_workspace_bytes(s, t, T - t));
    }
    return b;
}

// The largest workspace a node's calls take in a plan of `bucket` tokens, before any growth.
size_t node_workspace(const Node& n, const graph::GraphSpec& spec, int bucket) {
    const int64_t T = n.rows == Rows::Last ? 1 : bucket;
    switch (n.op) {
        case Op::Matmul: return cpu::matmul_workspace_bytes(*n.weights[0], T);
        case Op::MatmulMulti: {
            std::vector<cpu::MatmulOut> mo;
            for (const WeightView* w : n.weights) mo.push_back({w, nullptr});
            return cpu::matmul_multi_workspace_bytes(mo.data(), int(mo.size()), T);
        }
        case Op::MatmulSwiglu: return cpu::matmul_swiglu_workspace_bytes(*n.weights[0], *n.weights[1], T);
        case Op::MoeFfn: return cpu::moe_ffn_workspace_bytes(*n.moe, T);
        case Op::Attention: return 0;  // compile: attention_bucket_workspace, once per shape
        case Op::GdnFused: {
            // One sequence of the bucket's tokens in the plan's mode, or any in serial mode (a
            // decoding sequence's override), which takes no per-sequence scratch.
            ref::GdnParams serial = n.gdn, chunked = n.gdn;
            serial.mode = ref::GdnMode::Serial;
            chunked.mode = spec.gdn_mode;
            chunked.chunk_size = spec.gdn_chunk;
            return std::max(cpu::gdn_fused_workspace_bytes(serial, bucket, bucket),
                            cpu::gdn_fused_workspace_bytes(chunked, 1, bucket));
        }
        default: return 0;
    }
}

// The attention workspace of any call in a plan of `bucket` tokens on a state of n_ctx
// positions (each sequence's keys at most n_ctx).
size_t attention_context_workspace(const ref::AttentionShape& s, int bucket, int n_ctx) {
    size_t b = 0;
    for (int64_t t = 1; t <= std::min(bucket, n_ctx); ++t)
        b = std::max(b, cpu::attention_workspace_bytes(s, t, n_ctx - t));
    return b;
}

}  // namespace

void CpuBackend::optimize(graph::Graph& g) const {
    graph::fuse_add_norm(g);
    graph::fuse_matmul_swiglu(g);
    graph::group_matmuls(g);
}

bool CpuBackend::replay_gdn(ModelState& st, const GdnReplayLog& log, int seq, int kept) {
    if (!log.valid || seq < 0 || size_t(seq) + 1 >= log.offsets.size() || kept < 0 ||
        kept > log.offsets[size_t(seq) + 1] - log.offsets[size_t(seq)])
        throw Error("cpu backend: replay_gdn: sequence " + std::to_string(seq) + " / " + std::to_string(kept) +
                    " tokens not in the log's step");
    if (kept == 0) return true;
    const int32_t offs[2] = {log.offsets[size_t(seq)], log.offsets[size_t(seq)] + kept};
    const int32_t slot = log.slots[size_t(seq)];
    // z and y: the gated norm's, which the states do not depend on; one pair for every layer.
    size_t zy = 0;
    for (const GdnReplayLog::Layer& L : log.layers) zy = std::max(zy, size_t(offs[1]) * size_t(L.value_dim));
    std::vector<float> z(zy, 0.0f), y(zy);
    for (const GdnReplayLog::Layer& L : log.layers) {
        ref::GdnParams p = L.params;
        p.mode = ref::GdnMode::Serial;
        cpu::gdn_fused(cpu::active_isa(), p, L.weights, 1, offs, L.qkv.data(), z.data(), L.a.data(), L.b.data(),
                       st.conv_state[size_t(L.layer)].data(), st.ssm_state[size_t(L.layer)].data(), y.data(), &slot);
    }
    return true;
}

ModelState CpuBackend::new_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) {
    return new_model_state(hp, n_ctx, kv_types, n_slots);
}

std::unique_ptr<Plan> CpuBackend::compile(const graph::Graph& g, int bucket, const CompileOptions& opt) {
    graph::check(g);
    auto plan = std::make_unique<Plan>(bucket, arena_);
    const GraphLayout layout = plan_storage(g, bucket);
    float* scratch = plan->buffer(size_t(std::max<int64_t>(layout.total, 1)));
    int32_t* pos = reinterpret_cast<int32_t*>(plan->buffer(size_t(bucket)));  // [bucket] absolute positions
    size_t ws_bytes = 0;
    std::map<std::tuple<int, int, int, int64_t>, size_t> attn_ws;  // the layers share a shape
    for (const Node& n : g.nodes) {
        ws_bytes = std::max(ws_bytes, node_workspace(n, g.spec, bucket));
        if (n.op != Op::Attention) continue;
        const int64_t T = n.rows == Rows::Last ? 1 : bucket;
        const auto key = std::make_tuple(n.attn.n_head, n.attn.n_head_kv, n.attn.head_dim, T);
        if (!attn_ws.count(key)) attn_ws[key] = attention_bucket_workspace(n.attn, T);
        ws_bytes = std::max(ws_bytes, attn_ws[key]);
    }
    const auto work = std::make_shared<Workspace>(plan->buffer((ws_bytes + sizeof(float) - 1) / sizeof(float) + 1), ws_bytes);
    std::vector<TensorRef> refs(g.tensors.size());
    for (size_t t = 0; t < g.tensors.size(); ++t) {
        const graph::Tensor& x = g.tensors[t];
        refs[t] = {layout.offset[t] >= 0 ? scratch + layout.offset[t] : nullptr, x.cols, x.rows == Rows::Listed || x.logits,
                   x.logits};
    }
    auto in = [&](const Node& n, size_t i) { return refs[size_t(n.in[i])]; };
    auto out = [&](const Node& n, size_t i) { return refs[size_t(n.out[i])]; };

    // cos/sin of every (position, frequency) of a step, built once and shared by all layers;
    // the last row's own table serves a pruned last layer's single query (not in decode, where
    // that row is the step).
    auto rope = std::make_shared<cpu::RopeTable>();
    auto rope_last = std::make_shared<cpu::RopeTable>();
    const Node* any_rope = nullptr;
    bool last_rope = false;
    for (const Node& n : g.nodes)
        if (n.op == Op::RmsNormRope) {
            any_rope = &n;
            last_rope = last_rope || (n.rows == Rows::Last && bucket > 1);
        }

    for (const Node& n : g.nodes) {
        const Rows r = n.rows;
        switch (n.op) {
            case Op::Input: {  // the given rows (StepContext::hidden)
                const TensorRef o = out(n, 0);
                plan->add("input", n.label, [o](const StepContext& c) {
                    if (!c.hidden) throw Error("forward: the MTP head alone needs its hidden rows (ForwardOptions::mtp_hidden)");
                    std::memcpy(o.base, c.hidden, size_t(c.n) * size_t(o.cols) * sizeof(float));
                });
                break;
            }
            case Op::Embed: {
                const WeightView* tab = n.weights[0];
                const TensorRef o = out(n, 0);
                if (n.next_token) {  // the MTP head's input: each row its sequence's next token (positions are the first Embed's)
                    plan->add("embed", n.label, [tab, o](const StepContext& c) {
                        for (int s = 0; s < c.n_seqs; ++s)
                            for (int t = c.offsets[s]; t < c.offsets[s + 1]; ++t) {
                                const int32_t id = c.ids[std::min(t + 1, c.offsets[s + 1] - 1)];
                                thread_local std::vector<uint8_t> row;  // a repacked table's row (cpu::weight_row)
                                if (tab->layout != WeightLayout::Gguf) row.resize(tab->row_bytes);
                                dequantize_row(tab->type, cpu::weight_row(*tab, id, row.data()), o.base + int64_t(t) * o.cols,
                                               o.cols);
                            }
                    });
                    break;
                }
                plan->add("embed", n.label, [tab, o, pos](const StepContext& c) {
                    for (int t = 0; t < c.n; ++t) {
                        if (c.ids[t] < 0 || c.ids[t] >= tab->n_out)
                            throw Error("token id " + std::to_string(c.ids[t]) + " at position " + std::to_string(t) +
                                        " is outside the vocabulary [0, " + std::to_string(tab->n_out) + ")");
                        thread_local std::vector<uint8_t> row;  // a repacked table's row (cpu::weight_row)
                        if (tab->layout != WeightLayout::Gguf) row.resize(tab->row_bytes);
                        dequantize_row(tab->type, cpu::weight_row(*tab, c.ids[t], row.data()), o.base + int64_t(t) * o.cols,
                                       o.cols);
                    }
                    for (int s = 0; s < c.n_seqs; ++s)  // each sequence continues its slot
                        for (int t = c.offsets[s]; t < c.offsets[s + 1]; ++t) pos[t] = c.n_past[s] + t - c.offsets[s];
                });
                if (any_rope) {
                    const int n_rot = any_rope->n_rot;
                    const float base = any_rope->rope_base;
                    plan->add("rope_table", "rope", [=](const StepContext& c) {
                        *rope = cpu::rope_table(pos, c.n, n_rot, base);
                        if (last_rope) *rope_last = cpu::rope_table(pos + c.n - 1, 1, n_rot, base);
                    });
                }
                break;
            }
            case Op::RmsNorm: {
                const TensorRef a = in(n, 0), o = out(n, 0);
                const float* w = n.norm;
                const float eps = n.eps;
                if (r == Rows::Listed) {  // the batch's logits rows, gathered
                    plan->add("rms_norm", n.label, [=](const StepContext& c) {
                        for (int i = 0; i < c.n_out; ++i)
                            cpu::rms_norm(a.base + int64_t(c.out_rows[i]) * a.cols, w, o.base + int64_t(i) * o.cols, 1, a.cols, eps);
                    });
                } else {
                    plan->add("rms_norm", n.label, [=](const StepContext& c) {
                        cpu::rms_norm(a.at(c, r), w, o.at(c, r), n_rows(r, c), a.cols, eps);
                    });
                }
                break;
            }
            case Op::Add: {
                const TensorRef a = in(n, 0), b = in(n, 1);
                plan->add("add", n.label, [=](const StepContext& c) { cpu::add(a.at(c, r), b.at(c, r), n_rows(r, c) * a.cols); });
                break;
            }
            case Op::AddRmsNorm: {
                const TensorRef a = in(n, 0), b = in(n, 1), o = out(n, 1);
                const float* w = n.norm;
                const float eps = n.eps;
                plan->add("add_rms_norm", n.label, [=](const StepContext& c) {
                    cpu::add_rms_norm(a.at(c, r), b.at(c, r), w, o.at(c, r), n_rows(r, c), a.cols, eps);
                });
                break;
            }
            case Op::Matmul: {
                const WeightView* w = n.weights[0];
                const TensorRef x = in(n, 0), y = out(n, 0);
                plan->add(matmul_kernel(*w), n.label, [=](const StepContext& c) {
                    const int64_t T = n_rows(r, c);
                    void* ws = work->get_sized([&] { return cpu::matmul_workspace_bytes(*w, T); });
                    cpu::matmul(*w, x.at(c, r), y.at(c, r), T, cpu::active_isa(), ws);
                });
                break;
            }
            case Op::MatmulMulti: {
                const TensorRef x = in(n, 0);
                std::vector<std::pair<const WeightView*, TensorRef>> outs;
                for (size_t i = 0; i < n.weights.size(); ++i) outs.emplace_back(n.weights[i], out(n, i));
                plan->add(matmul_kernel(*n.weights[0]), n.label, [=](const StepContext& c) {
                    cpu::MatmulOut mo[16];
                    int k = 0;
                    for (const auto& [w, y] : outs) mo[k++] = {w, y.at(c, r)};
                    const int64_t T = n_rows(r, c);
                    void* ws = work->get_sized([&] { return cpu::matmul_multi_workspace_bytes(mo, k, T); });
                    cpu::matmul_multi(mo, k, x.at(c, r), T, cpu::active_isa(), ws);
                });
                if (outs.size() > 16) throw Error("cpu backend: node '" + n.label + "' groups more than 16 matmuls");
                break;
            }
            case Op::MatmulSwiglu: {
                const WeightView *wg = n.weights[0], *wu = n.weights[1];
                const TensorRef x = in(n, 0), act = out(n, 0), up = out(n, 1);
                // The profile counts the step as a matmul (its gate and up products).
                plan->add(matmul_kernel(*wg), n.label, [=](const StepContext& c) {
                    const int64_t T = n_rows(r, c);
                    void* ws = work->get_sized([&] { return cpu::matmul_swiglu_workspace_bytes(*wg, *wu, T); });
                    cpu::matmul_swiglu(*wg, *wu, x.at(c, r), act.at(c, r), up.at(c, r), T, cpu::active_isa(), ws);
                });
                break;
            }
            case Op::Swiglu: {
                const TensorRef a = in(n, 0), b = in(n, 1), o = out(n, 0);
                plan->add("swiglu", n.label,
                          [=](const StepContext& c) { cpu::swiglu(a.at(c, r), b.at(c, r), o.at(c, r), n_rows(r, c) * o.cols); });
                break;
            }
            case Op::RmsNormRope: {
                const TensorRef x = in(n, 0), o = out(n, 0);
                const float* w = n.norm;
                const float eps = n.eps;
                const int heads = n.heads, hd = n.head_dim;
                const int64_t stride = n.head_stride;
                const bool own_table = r == Rows::Last && bucket > 1;
                plan->add("rms_norm_rope", n.label, [=](const StepContext& c) {
                    cpu::rms_norm_rope(own_table ? *rope_last : *rope, x.at(c, r), stride, w, o.at(c, r), heads, hd, eps);
                });
                break;
            }
            case Op::KvStore: {
                const TensorRef k = in(n, 0), v = in(n, 1);
                const int l = n.layer;
                plan->add("kv_store", n.label, [=](const StepContext& c) {
                    const KvCacheTypes& t = c.state->kv_types;
                    const int64_t kvw = k.cols;
                    for (int i = 0; i < c.n_seqs; ++i) {  // rows of sequence i -> its slot's rows [n_past, ...)
                        const StepSeq q = step_seq(c, i);
                        const size_t row0 = size_t(q.n_past * kvw);
                        auto* kc = static_cast<char*>(c.state->k_cache[size_t(l)][size_t(q.slot)].data()) +
                                   row0 * ref::kv_elem_bytes(t.k);
                        auto* vc = static_cast<char*>(c.state->v_cache[size_t(l)][size_t(q.slot)].data()) +
                                   row0 * ref::kv_elem_bytes(t.v);
                        cpu::kv_store(k.base + q.first * kvw, kc, t.k, q.n * kvw);
                        cpu::kv_store(v.base + q.first * kvw, vc, t.v, q.n * kvw);
                    }
                });
                break;
            }
            case Op::Attention: {
                const TensorRef q = in(n, 0), o = out(n, 0);
                const int l = n.layer;
                const ref::AttentionShape as = n.attn;
                const bool one_query = bucket == 1 || r == Rows::Last;
                const char* kernel = one_query ? "attention_decode"
                                     : g.spec.logits == Rows::Listed ? "attention"
                                                                     : "attention_prefill";
                plan->add(kernel, n.label, [=](const StepContext& c) {
                    ref::AttentionShape s = as;
                    s.type_k = c.state->kv_types.k;
                    s.type_v = c.state->kv_types.v;
                    const auto& kc = c.state->k_cache[size_t(l)];
                    const auto& vc = c.state->v_cache[size_t(l)];
                    // A call past the workspace's size sizes it for the state's whole context.
                    auto ws = [&](int64_t T, int64_t n_past) {
                        const size_t need = cpu::attention_workspace_bytes(s, T, n_past);
                        return work->get(need <= work->bytes()
                                             ? need
                                             : std::max(need, attention_context_workspace(s, bucket, c.state->n_ctx)));
                    };
                    if (r == Rows::Last) {  // the pruned last layer of a one-sequence pass: its last query
                        const int64_t n_past = c.n_past[0] + first_row(r, c);
                        cpu::attention(s, q.at(c, r), kc[size_t(c.slots[0])].data(), vc[size_t(c.slots[0])].data(),
                                       o.at(c, r), 1, n_past, cpu::active_isa(), ws(1, n_past));
                        return;
                    }
                    for (int i = 0; i < c.n_seqs; ++i) {  // each sequence against its own cache
                        const StepSeq e = step_seq(c, i);
                        cpu::attention(s, q.base + e.first * q.cols, kc[size_t(e.slot)].data(), vc[size_t(e.slot)].data(),
                                       o.base + e.first * q.cols, e.n, e.n_past, cpu::active_isa(), ws(e.n, e.n_past));
                    }
                });
                break;
            }
            case Op::SigmoidGateMul: {
                const TensorRef x = in(n, 0), gate = in(n, 1);
                const int heads = n.heads, hd = n.head_dim;
                const int64_t stride = n.head_stride, off = n.in_offset;
                plan->add("sigmoid_gate_mul", n.label, [=](const StepContext& c) {
                    cpu::sigmoid_gate_mul(x.at(c, r), gate.at(c, r) + off, n_rows(r, c) * heads, hd, stride);
                });
                break;
            }
            case Op::GdnFused: {
                const float *qkv = in(n, 0).base, *z = in(n, 1).base, *b = in(n, 2).base, *a = in(n, 3).base;
                float* y = out(n, 0).base;
                const int l = n.layer;
                const ref::GdnParams gp = n.gdn;
                const ref::GdnWeights gw = n.gdn_w;
                const char* kernel = gp.mode == ref::GdnMode::Serial ? "gdn_fused_serial" : "gdn_fused_chunked";
                const int conv_dim = 2 * gp.shape.H_k * gp.shape.d_k + gp.shape.H_v * gp.shape.d_v;
                plan->add(kernel, n.label, [=](const StepContext& c) {
                    float* conv = c.state->conv_state[size_t(l)].data();  // [slots, conv_dim, K-1]
                    float* ssm = c.state->ssm_state[size_t(l)].data();    // [slots, H_v, d_v, d_k]
                    if (c.gdn_log && c.gdn_log->valid) {  // a verification: keep the op's inputs for a rollback
                        GdnReplayLog::Layer& L = c.gdn_log->layers.emplace_back();
                        const size_t rows = size_t(c.offsets[c.n_seqs]), H_v = size_t(gp.shape.H_v);
                        L.layer = l, L.params = gp, L.weights = gw;
                        L.conv_dim = conv_dim, L.value_dim = gp.shape.H_v * gp.shape.d_v, L.H_v = gp.shape.H_v;
                        L.qkv.assign(qkv, qkv + rows * size_t(conv_dim));
                        L.a.assign(a, a + rows * H_v);
                        L.b.assign(b, b + rows * H_v);
                    }
                    // One call per run of sequences with the same kernel, each on its slots.
                    for_each_gdn_run(c, [&](int s0, int s1, bool serial) {
                        ref::GdnParams run = gp;
                        if (serial) run.mode = ref::GdnMode::Serial;
                        void* ws = work->get(cpu::gdn_fused_workspace_bytes(run, s1 - s0, c.offsets[s1] - c.offsets[s0]));
                        cpu::gdn_fused(cpu::active_isa(), run, gw, s1 - s0, c.offsets + s0, qkv, z, a, b, conv, ssm, y,
                                       c.slots + s0, ws);
                    });
                });
                break;
            }
            case Op::AllReduce: {
                if (!collective_)
                    throw Error("cpu backend: node '" + n.label + "' sums over tensor-parallel ranks, but this backend has no collective");
                const TensorRef x = in(n, 0);
                Collective* coll = collective_.get();
                plan->add("all_reduce", n.label,
                          [=](const StepContext& c) { coll->all_reduce_sum(x.at(c, r), size_t(n_rows(r, c) * x.cols), nullptr); });
                break;
            }
            case Op::MoeFfn: {
                const ref::MoeWeights* moe = n.moe;
                const TensorRef x = in(n, 0), y = out(n, 0);
                plan->add("moe_ffn", n.label, [=](const StepContext& c) {
                    const int64_t T = n_rows(r, c);
                    void* ws = work->get_sized([&] { return cpu::moe_ffn_workspace_bytes(*moe, T); });
                    cpu::moe_ffn(*moe, x.at(c, r), y.at(c, r), T, cpu::active_isa(), ws);
                });
                break;
            }
        }
        for (int t : n.out) {
            const graph::Tensor& x = g.tensors[size_t(t)];
            if (!graph::name_matches(opt.dump, x.name)) continue;
            const TensorRef ref = refs[size_t(t)];
            const std::string name = x.name;
            plan->add("dump", name, [=](const StepContext& c) {
                // Positions in the sequence for a one-sequence step; a batch's rows by step index.
                const int64_t pos0 = first_row(r, c) + (c.n_seqs == 1 ? c.n_past[0] : 0);
                if (c.dump) (*c.dump)(name, pos0, ref.at(c, r), n_rows(r, c), ref.cols);
            });
        }
    }
    return plan;
}

}  // namespace alloy
