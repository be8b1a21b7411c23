// Tensor parallelism: one rank's part of a Qwen3.5 model (Qwen35Model::shard, model/qwen35.h).
//
// Megatron's split, per block: the input projections are split by output rows (column
// parallel: each rank computes its heads / hidden units from the whole x), the output
// projection by input columns (row parallel: each rank's product is a partial sum of the
// block's output, summed over the ranks by the graph's AllReduce). What splits where:
//   GDN layer   key heads [r hk, (r+1) hk), hk = H_k / N, and the value heads that read them:
//               value head v reads key head v % H_k (GGUF's tiled order), so rank r's value
//               heads are j H_k + r hk + [0, hk) for j < H_v / H_k, and locally value head i
//               reads key head i % hk: the tiled rule again, so the op runs unchanged on the
//               local shapes. attn_qkv's rows and the conv taps: the Q, K and V channels of
//               those heads; attn_gate (z), ssm_beta / ssm_alpha / ssm_a / ssm_dt: the value
//               heads'; ssm_out: their columns. ssm_norm (per d_v) is whole.
//   attention   query heads [r nh, (r+1) nh) (each head's [q | gate] rows), KV heads
//               [r nkv, (r+1) nkv): GQA's head h -> KV head h / (n_head / n_head_kv) holds
//               inside each range; attn_output: the query heads' columns. With more ranks
//               than KV heads, each rank holds the one KV head its query heads read (replicated).
//   MLP         ffn_gate / ffn_up rows and ffn_down columns [r f, (r+1) f), f = n_ff / N;
//               every routed expert the same way (ExpertMatrix rows by offset, no copy; the
//               down matrices' columns copied), the shared expert too; the router and the
//               shared expert's gate are whole (the routing is the same on every rank).
//   experts     or, with experts_by_id (expert parallelism), E / N whole experts a rank (rows
//               of the expert tensors, no copy): every rank routes every token over all E, runs
//               the chosen experts it holds, and the AllReduce adds the other ranks' (the
//               tokens are on every rank already, so no all-to-all is needed to dispatch them).
// A single row range is a view into the file's bytes; anything else is copied into the shard.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "model/qwen35.h"

namespace alloy {

namespace {

struct Range {
    int64_t begin = 0, count = 0;
};

// Adjacent ranges merged (one view instead of a copy where the pieces touch).
std::vector<Range> merged(std::vector<Range> rs) {
    std::vector<Range> out;
    for (const Range& r : rs) {
        if (!out.empty() && out.back().begin + out.back().count == r.begin)
            out.back().count += r.count;
        else
            out.push_back(r);
    }
    return out;
}

int64_t total(const std::vector<Range>& rs) {
    int64_t n = 0;
    for (const Range& r : rs) n += r.count;
    return n;
}

class Slicer {
public:
    Slicer(std::vector<std::vector<uint8_t>>& bytes, std::vector<std::vector<float>>& floats, std::string where)
        : bytes_(bytes), floats_(floats), where_(std::move(where)) {}

    // The rows `rs` of w, in order.
    WeightView rows(const WeightView& w, const std::vector<Range>& rs_in, const std::string& name) {
        check_layout(w, name);
        const std::vector<Range> rs = merged(rs_in);
        WeightView out = w;
        out.n_out = total(rs);
        for (const Range& r : rs)
            if (r.begin < 0 || r.begin + r.count > w.n_out)
                throw Error(where_ + ": tensor '" + name + "': rows [" + std::to_string(r.begin) + ", " +
                            std::to_string(r.begin + r.count) + ") outside its " + std::to_string(w.n_out));
        if (rs.size() == 1) {
            out.data = w.row(rs[0].begin);
            return out;
        }
        std::vector<uint8_t>& b = bytes_.emplace_back(size_t(out.n_out) * w.row_bytes);
        size_t at = 0;
        for (const Range& r : rs) {
            std::memcpy(b.data() + at, w.row(r.begin), size_t(r.count) * w.row_bytes);
            at += size_t(r.count) * w.row_bytes;
        }
        out.data = b.data();
        return out;
    }

    // The columns `cs` of every row of w, in order (copied); each range must start and end on
    // the type's block boundaries.
    WeightView cols(const WeightView& w, const std::vector<Range>& cs_in, const std::string& name) {
        check_layout(w, name);
        const std::vector<Range> cs = merged(cs_in);
        const int64_t blk = type_traits(w.type).block_elems;
        for (const Range& c : cs)
            if (c.begin % blk || c.count % blk || c.begin < 0 || c.begin + c.count > w.n_in)
                throw Error(where_ + ": tensor '" + name + "' (" + type_traits(w.type).name + ", rows of " +
                            std::to_string(w.n_in) + "): columns [" + std::to_string(c.begin) + ", " +
                            std::to_string(c.begin + c.count) + ") do not fall on its " + std::to_string(blk) +
                            "-element blocks; use fewer ranks or another quantization");
        WeightView out = w;
        out.n_in = total(cs);
        out.row_bytes = row_bytes(w.type, out.n_in);
        std::vector<uint8_t>& b = bytes_.emplace_back(size_t(w.n_out) * out.row_bytes);
        const size_t elem_bytes_per_block = type_traits(w.type).block_bytes;
        for (int64_t r = 0; r < w.n_out; ++r) {
            uint8_t* dst = b.data() + size_t(r) * out.row_bytes;
            for (const Range& c : cs) {
                const size_t n = size_t(c.count / blk) * elem_bytes_per_block;
                std::memcpy(dst, w.row(r) + size_t(c.begin / blk) * elem_bytes_per_block, n);
                dst += n;
            }
        }
        out.data = b.data();
        return out;
    }

    // Rows `rs` of an fp32 array of rows of `width` floats.
    const float* floats(const float* p, int64_t width, const std::vector<Range>& rs) {
        std::vector<float>& f = floats_.emplace_back();
        for (const Range& r : merged(rs)) f.insert(f.end(), p + r.begin * width, p + (r.begin + r.count) * width);
        return f.data();
    }

private:
    void check_layout(const WeightView& w, const std::string& name) const {
        if (w.layout != WeightLayout::Gguf)
            throw Error(where_ + ": tensor '" + name + "' was repacked for the CPU kernels; shard the model before repacking");
    }
    std::vector<std::vector<uint8_t>>& bytes_;
    std::vector<std::vector<float>>& floats_;
    std::string where_;
};

}  // namespace

std::unique_ptr<Qwen35Model> Qwen35Model::shard(int rank, int n_ranks, bool experts_by_id) const {
    const std::string where = file_->path() + ": tensor parallel over " + std::to_string(n_ranks) + " ranks";
    if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
        throw Error(where + ": rank " + std::to_string(rank) + " is not one of them");
    if (tp_size_ > 0) throw Error(where + ": the model is a shard already");
    const Qwen35HParams& hp = hp_;
    auto need = [&](int64_t n, const char* what) {
        if (n % n_ranks)
            throw Error(where + ": " + hp.arch() + "." + what + " = " + std::to_string(n) + " does not split into " +
                        std::to_string(n_ranks) + " equal parts");
    };
    need(hp.ssm_H_k, "ssm.group_count (GDN key heads)");
    need(hp.n_head, "attention.head_count");
    // More ranks than KV heads: each KV head is replicated on the n_ranks / n_head_kv ranks whose
    // query heads read it (as vLLM does), so n_ranks must be a multiple of n_head_kv.
    const bool kv_replicated = hp.n_head_kv % n_ranks != 0;
    if (kv_replicated && n_ranks % hp.n_head_kv)
        throw Error(where + ": " + hp.arch() + ".attention.head_count_kv = " + std::to_string(hp.n_head_kv) +
                    " neither splits into " + std::to_string(n_ranks) + " equal parts nor divides it (KV heads replicated)");
    if (experts_by_id && !hp.moe())
        throw Error(where + ": expert parallelism asked for a model without experts (" + hp.arch() + ")");
    if (experts_by_id) need(hp.n_expert, "expert_count");
    if (hp.moe() && !experts_by_id) need(hp.n_ff_exp, "expert_feed_forward_length");
    if (hp.moe()) {
        need(hp.n_ff_shexp, "expert_shared_feed_forward_length");
    }
    need(hp.n_ff, "feed_forward_length");

    std::unique_ptr<Qwen35Model> m(new Qwen35Model());
    m->file_ = file_;
    m->tp_rank_ = rank;
    m->tp_size_ = n_ranks;
    m->tok_embd = tok_embd;
    m->output_norm = output_norm;
    m->output = output;
    Qwen35HParams& lp = m->hp_ = hp;
    lp.ssm_H_k = hp.ssm_H_k / n_ranks;
    lp.ssm_H_v = hp.ssm_H_v / n_ranks;
    lp.n_head = hp.n_head / n_ranks;
    lp.n_head_kv = kv_replicated ? 1 : hp.n_head_kv / n_ranks;
    lp.n_ff = hp.n_ff / n_ranks;
    lp.n_ff_exp = experts_by_id ? hp.n_ff_exp : hp.n_ff_exp / n_ranks;
    lp.n_ff_shexp = hp.n_ff_shexp / n_ranks;
    Slicer s(m->owned_bytes_, m->owned_, where);

    // GDN: the key heads' Q and K channels, the value heads that read them (see the top).
    const int64_t H_k = hp.ssm_H_k, hk = lp.ssm_H_k, groups = hp.ssm_H_v / hp.ssm_H_k;
    const int64_t dk = hp.ssm_d_k, dv = hp.ssm_d_v;
    std::vector<Range> v_heads, v_dims, qkv_rows;
    for (int64_t j = 0; j < groups; ++j) v_heads.push_back({j * H_k + rank * hk, hk});
    for (const Range& h : v_heads) v_dims.push_back({h.begin * dv, h.count * dv});
    qkv_rows.push_back({rank * hk * dk, hk * dk});
    qkv_rows.push_back({H_k * dk + rank * hk * dk, hk * dk});
    for (const Range& d : v_dims) qkv_rows.push_back({2 * H_k * dk + d.begin, d.count});
    // Attention and MLP: one range each.
    const int64_t nh = lp.n_head, nkv = lp.n_head_kv, hd = hp.head_dim;
    // GQA: query head h reads KV head h / (n_head / n_head_kv); with KV heads replicated this
    // rank's query heads all read KV head rank / (n_ranks / n_head_kv).
    const int64_t kv_head0 = kv_replicated ? rank / (n_ranks / hp.n_head_kv) : rank * nkv;
    const std::vector<Range> q_rows = {{rank * nh * 2 * hd, nh * 2 * hd}}, kv_rows = {{kv_head0 * hd, nkv * hd}},
                             o_cols = {{rank * nh * hd, nh * hd}};
    auto ffn_part = [&](int64_t f) { return std::vector<Range>{{rank * (f / n_ranks), f / n_ranks}}; };

    auto shard_layer = [&](const Qwen35Layer& L, Qwen35Layer& O, const std::string& p) {
        O = L;
        if (hp.moe()) {
            const ref::MoeWeights& a = L.moe;
            ref::MoeWeights& b = O.moe;
            const int64_t f = lp.n_ff_exp;
            if (experts_by_id) {  // experts [r E/N, (r+1) E/N) whole: rows of each tensor, no copy
                const int per = hp.n_expert / n_ranks, e0 = rank * per;
                auto held = [&](const ref::ExpertMatrix& x, const char* name) {
                    return ref::ExpertMatrix{s.rows(x.all, {{e0 * x.stride, per * x.stride}}, p + name), x.stride, x.offset,
                                             x.rows};
                };
                b.gate = held(a.gate, "ffn_gate_exps.weight");
                b.up = held(a.up, "ffn_up_exps.weight");
                b.down = held(a.down, "ffn_down_exps.weight");
                b.expert_begin = e0;
                b.expert_count = per;
            }
            else {
                b.gate = {a.gate.all, a.gate.stride, a.gate.offset + rank * f, f};
                b.up = {a.up.all, a.up.stride, a.up.offset + rank * f, f};
                // Every expert's [D, I] down matrix is rows [e D, (e + 1) D) of one [E D, I] view.
                if (a.down.stride != a.down.rows || a.down.offset != 0)
                    throw Error(where + ": tensor '" + p + "ffn_down_exps.weight' is not one [D, I] matrix an expert");
                b.down = {s.cols(a.down.all, {{rank * f, f}}, p + "ffn_down_exps.weight"), a.down.stride, 0, a.down.rows};
            }
            if (a.has_shared()) {
                const auto part = ffn_part(hp.n_ff_shexp);
                b.shexp_gate = s.rows(a.shexp_gate, part, p + "ffn_gate_shexp.weight");
                b.shexp_up = s.rows(a.shexp_up, part, p + "ffn_up_shexp.weight");
                b.shexp_down = s.cols(a.shexp_down, part, p + "ffn_down_shexp.weight");
            }
        } else {
            const auto part = ffn_part(hp.n_ff);
            O.ffn_gate = s.rows(L.ffn_gate, part, p + "ffn_gate.weight");
            O.ffn_up = s.rows(L.ffn_up, part, p + "ffn_up.weight");
            O.ffn_down = s.cols(L.ffn_down, part, p + "ffn_down.weight");
        }
        if (L.ssm_qkv.data) {
            O.ssm_qkv = s.rows(L.ssm_qkv, qkv_rows, p + "attn_qkv.weight");
            O.ssm_gate = s.rows(L.ssm_gate, v_dims, p + "attn_gate.weight");
            O.ssm_beta = s.rows(L.ssm_beta, v_heads, p + "ssm_beta.weight");
            O.ssm_alpha = s.rows(L.ssm_alpha, v_heads, p + "ssm_alpha.weight");
            O.ssm_conv1d = s.floats(L.ssm_conv1d, hp.conv_kernel, qkv_rows);
            O.ssm_a = s.floats(L.ssm_a, 1, v_heads);
            O.ssm_dt = s.floats(L.ssm_dt, 1, v_heads);
            O.ssm_out = s.cols(L.ssm_out, v_dims, p + "ssm_out.weight");
        }
        if (L.wq.data) {
            O.wq = s.rows(L.wq, q_rows, p + "attn_q.weight");
            O.wk = s.rows(L.wk, kv_rows, p + "attn_k.weight");
            O.wv = s.rows(L.wv, kv_rows, p + "attn_v.weight");
            O.wo = s.cols(L.wo, o_cols, p + "attn_output.weight");
        }
    };
    m->layers_.resize(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) shard_layer(layers_[l], m->layers_[l], "blk." + std::to_string(l) + ".");
    if (mtp_) {
        Qwen35Mtp mtp = *mtp_;  // eh_proj's halves and the norms: whole (the head's input is replicated)
        shard_layer(mtp_->layer, mtp.layer, "blk." + std::to_string(hp.n_layer) + ".");
        m->mtp_ = mtp;
    }
    return m;
}

}  // namespace alloy
