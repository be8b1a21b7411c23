// Mixture-of-experts FFN of a Qwen3.5 MoE layer (GGUF arch `qwen35moe`), reference
// (spec/MODEL.md section 7; HF Qwen3_5MoeSparseMoeBlock):
//   p = softmax(router y) over all E experts (fp32); the k largest, weights w_i = p_i / sum of
//   those k (always renormalised); FFN(y) = sum_i w_i E_i(y) + sigmoid(g . y) S(y), where every
//   expert E_e and the shared expert S is a SwiGLU MLP down(silu(gate y) * up y).
// One op for the whole block, as the GDN layer is one op: the CPU version (kernels/cpu/moe.h)
// groups the tokens by expert so each expert's weights are read once per call.
#pragma once
#include <cstdint>

#include "kernels/ref/weight.h"

namespace alloy::ref {

// One matrix per expert, all experts in one GGUF tensor: expert e's rows are
// [e * stride + offset, e * stride + offset + rows) of `all` (ffn_gate_exps ne = {D, I, E}:
// stride = rows = I, offset 0; a fused ffn_gate_up_exps ne = {D, 2I, E}: stride 2I, the gate
// at offset 0 and the up at offset I).
struct ExpertMatrix {
    WeightView all;
    int64_t stride = 0, offset = 0, rows = 0;
    WeightView at(int e) const {
        WeightView w = all;
        w.n_out = rows;
        w.data = all.row(int64_t(e) * stride + offset);
        return w;
    }
};

struct MoeWeights {
    int n_expert = 0, n_used = 0;    // E, k
    // Expert parallelism (model/qwen35_shard.cpp): this rank holds experts [expert_begin,
    // expert_end()) only: gate, up and down hold just those (local index e - expert_begin), the
    // router still scores all E, and a token's chosen experts held elsewhere add nothing here
    // (another rank adds them: the graph's AllReduce). expert_count 0: every expert.
    int expert_begin = 0, expert_count = 0;
    int expert_end() const { return expert_count > 0 ? expert_begin + expert_count : n_expert; }
    int n_local() const { return expert_end() - expert_begin; }
    WeightView router;               // [E, D]      ffn_gate_inp
    ExpertMatrix gate, up;           // [I, D] each ffn_gate_exps, ffn_up_exps (or the fused one)
    ExpertMatrix down;               // [D, I] each ffn_down_exps
    // The shared expert and its scalar gate; absent when shexp_down.n_out == 0.
    WeightView shexp_gate, shexp_up;  // [I_s, D]  ffn_gate_shexp, ffn_up_shexp
    WeightView shexp_down;            // [D, I_s]  ffn_down_shexp
    WeightView shexp_router;          // [1, D]    ffn_gate_inp_shexp
    int64_t n_embd() const { return router.n_in; }
    bool has_shared() const { return shexp_down.n_out > 0; }
};

// Throws alloy::Error naming `op` and the first inconsistent field (types, shapes, k <= E).
void check_moe_weights(const MoeWeights& w, const char* op);

// Router probabilities of T tokens to the chosen experts: logits [T, E] -> ids [T, k] (by
// decreasing probability; ties to the lower expert id) and weights [T, k] (renormalised to
// sum to 1). Shared by every backend: routing is a few hundred flops per token.
void moe_route(const float* logits, int64_t T, int E, int k, int32_t* ids, float* weights);

// x: [T, D]; y: [T, D] (must not alias x).
void moe_ffn(const MoeWeights& w, const float* x, float* y, int64_t T);

}  // namespace alloy::ref
