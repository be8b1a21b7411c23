// The forward pass as data: a list of ops over named tensors. The model builds it
// (model/qwen35.cpp, in spec/MODEL.md's names), a backend runs it (runtime/backend.h: the CPU
// backend records one closure per node, the CUDA backend will capture a graph), and the
// rewrites between the two (runtime/graph_passes.h: which rows each node needs, residual add +
// next norm, SwiGLU in the GEMM epilogue, matmuls sharing an input) change the list, not the
// model. No backend types here: nodes name weights by their WeightView and state by layer.
//
// Shapes: every tensor is [T, cols] fp32, T the step's tokens (at most the plan's bucket),
// row t = token t of the step, sequences concatenated. A tensor whose `rows` is Last holds
// only row T-1 (still at index T-1), Listed ones hold the rows the step lists (compact, row i =
// the i-th listed token: the batch's logits rows), None ones nothing (the node is dropped).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/ref/attention.h"
#include "kernels/ref/gdn.h"
#include "kernels/ref/moe.h"
#include "kernels/ref/weight.h"

namespace alloy::graph {

enum class Op : uint8_t {
    Embed,           // out [T, D]: rows of `weights[0]` (the token table) for the step's ids
    RmsNorm,         // in a [T, n] -> out [T, n] = rms(a) * norm
    Add,             // in a, b [T, n] -> out = a + b, in place on a
    AddRmsNorm,      // fusion of Add and the RmsNorm of its sum: out s = a + b (in place on a), n = rms(s) * norm
    Matmul,          // in x [T, n_in] -> out [T, n_out] = x W^T, W = weights[0]
    MatmulMulti,     // fusion of Matmuls on one input: out[i] = x weights[i]^T
    Swiglu,          // in g, u [T, n] -> out = silu(g) * u
    MatmulSwiglu,    // fusion of two Matmuls and their Swiglu: out act = silu(x Wg^T) * (x Wu^T), scratch u
    RmsNormRope,     // in x: heads (t, h) at x + (t heads + h) head_stride -> out [T, heads*head_dim]
                     // per-head rms(x) * norm, then partial RoPE (n_rot, rope_base) at the token's position
    KvStore,         // in k, v [T, n_kv*hd] -> the layer's K/V cache rows at the sequences' positions
    Attention,       // in q [T, n_h*hd] -> out [T, n_h*hd]: causal GQA over the layer's cache
    SigmoidGateMul,  // in x [T, heads*head_dim], g (head (t, h) at g + (t heads + h) head_stride) ->
                     // out = x * sigmoid(g), in place on x
    GdnFused,        // in mixed_qkv, z, b, a -> out y [T, value_dim]; the layer's conv and recurrent
                     // states updated in place (kernels/ref/gdn.h gdn_fused)
    MoeFfn,          // in y [T, D] -> out [T, D]: router, experts, shared expert (kernels/ref/moe.h)
    Input,           // out [T, cols]: rows the step is given (StepContext::hidden): the MTP head's
                     // hidden states when it runs alone
    AllReduce,       // in x [T, n] -> out = the sum of x over the tensor-parallel ranks, in place on x
                     // (a sharded model's partial block outputs: model/qwen35_shard.cpp)
};
const char* op_name(Op op);

enum class Rows : uint8_t { All, Last, Listed, None };
const char* rows_name(Rows r);
// Whether `name` is one of `patterns`: exact names, or prefixes ending in '*' (the dump list).
bool name_matches(const std::vector<std::string>& patterns, const std::string& name);

struct Tensor {
    std::string name;        // e.g. "blk.3.attn.q", "h0", "logits"
    int64_t cols = 0;
    Rows rows = Rows::All;   // the rows it holds (runtime/graph_passes.h prune_rows narrows it)
    bool logits = false;     // the step's result: stored compact in the caller's logits array
};

struct Node {
    Op op;
    std::string label;                    // layer and role, e.g. "blk.3.attn_q" (profiles)
    std::vector<int> in, out;             // tensor ids
    std::vector<const WeightView*> weights;  // Matmul (one per output for MatmulMulti), MatmulSwiglu
                                          // (gate, up), Embed (the table)
    Rows rows = Rows::All;                // the rows this node computes
    int layer = -1;                       // KvStore, Attention, GdnFused: whose state
    int inplace = -1;                     // out[0] is stored over in[inplace] (that input is dead after)
    // Attributes, by op.
    const float* norm = nullptr;          // RmsNorm, AddRmsNorm, RmsNormRope: [n] or [head_dim]
    float eps = 0;
    int heads = 0, head_dim = 0;          // RmsNormRope, SigmoidGateMul
    int64_t head_stride = 0;
    int64_t in_offset = 0;                // SigmoidGateMul: where the gate's first head starts in in[1]'s row
    int n_rot = 0;                        // RmsNormRope
    float rope_base = 0;
    ref::AttentionShape attn{};           // Attention (cache types come from the state)
    ref::GdnParams gdn{};                 // GdnFused (mode: the plan's; a serial sequence overrides)
    ref::GdnWeights gdn_w{};
    const ref::MoeWeights* moe = nullptr; // MoeFfn
    bool next_token = false;              // Embed: row t takes its sequence's token t + 1 (the
                                          // sequence's last row its own), for the MTP head
};

// Which rows of the last layer's result become logits: none (an inner piece of a long prompt),
// the last token's, every token's, or the rows a batch lists (runtime/plan.h StepContext::out_rows).
struct GraphSpec {
    Rows logits = Rows::Last;
    ref::GdnMode gdn_mode = ref::GdnMode::Chunked;
    int gdn_chunk = 64;
    // The logits are the MTP head's (spec/MODEL.md section 8): row t predicts token t + 2 from
    // the trunk's pre-norm h_t and token t + 1, its attention layer at position t over the
    // MTP cache (ModelState layer n_layer). The trunk runs as usual before it.
    bool mtp = false;
    // The MTP head alone (a drafter's step): its h_t are given rows (Op::Input, [T, D]) and the
    // step's ids are the next tokens t + 1, at the step's positions; no trunk.
    bool mtp_alone = false;
    // Tensors computed on every row whatever the logits need (graph names: a drafter reads the
    // trunk's last-layer rows of every position, also of a prompt piece without logits).
    std::vector<std::string> keep_rows;
};

struct Graph {
    GraphSpec spec;
    std::vector<Tensor> tensors;
    std::vector<Node> nodes;

    int add_tensor(std::string name, int64_t cols);
    Node& add(Op op, std::string label, std::vector<int> in, std::vector<int> out);
    int find(const std::string& name) const;  // -1 if absent
    // Readers of each tensor: [tensor] -> node indices (recomputed on each call).
    std::vector<std::vector<int>> readers() const;
    // One line per node: "blk.0.attn_norm  rms_norm  h0 -> blk.0.x [T, 1024]" (alloy logits --dump list).
    std::string describe() const;
};

}  // namespace alloy::graph
