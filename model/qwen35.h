// Qwen3.5 text model, dense (GGUF arch `qwen35`) or MoE (`qwen35moe`: every FFN a routed
// mixture of experts with a shared expert, the rest identical), written once as a list of ops.
// Three parts, as llama.cpp's src/models/*.cpp: hyperparameters from metadata, weights bound
// by name with their expected shapes, and the forward pass as a graph of ops (runtime/ runs
// it: runtime/model_runner.h). Math: spec/MODEL.md.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/graph.h"
#include "kernels/ref/gdn.h"
#include "kernels/ref/moe.h"
#include "kernels/ref/weight.h"

namespace alloy {

struct Qwen35HParams {
    int n_vocab = 0;
    int n_embd = 0;          // D
    int n_layer = 0;         // trunk layers (block_count minus MTP layers)
    int n_layer_mtp = 0;     // nextn_predict_layers (blocks kept in the file, never run here)
    int n_ff = 0;            // dense FFN width (0 in an all-MoE model)
    // MoE (arch `qwen35moe`): experts, experts per token, expert and shared-expert widths.
    int n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
    bool moe() const { return n_expert > 0; }
    int n_head = 0, n_head_kv = 0, head_dim = 0;  // full attention
    int n_rot = 0;           // rotary dims per head (partial RoPE)
    float rope_base = 1e7f;
    float eps = 1e-6f;
    int full_attn_interval = 4;
    int n_ctx_train = 0;
    int conv_kernel = 4;     // K
    int ssm_H_k = 0, ssm_H_v = 0, ssm_d_k = 0, ssm_d_v = 0;
    int conv_dim() const { return 2 * ssm_H_k * ssm_d_k + ssm_H_v * ssm_d_v; }
    int value_dim() const { return ssm_H_v * ssm_d_v; }
    bool is_recurrent(int l) const { return (l + 1) % full_attn_interval != 0; }
    static Qwen35HParams from_gguf(const gguf::File& f);  // throws naming the key
    std::string arch() const { return moe() ? "qwen35moe" : "qwen35"; }
};

struct Qwen35Layer {
    // Both kinds.
    const float* attn_norm = nullptr;       // [D]
    const float* post_attn_norm = nullptr;  // [D]
    WeightView ffn_gate, ffn_up;            // [n_ff, D]
    WeightView ffn_down;                    // [D, n_ff]
    ref::MoeWeights moe;                    // instead of the three above in a qwen35moe layer
    // Gated DeltaNet layer.
    WeightView ssm_qkv;                     // [conv_dim, D]   rows [Q | K | V]
    WeightView ssm_gate;                    // [value_dim, D]  z
    WeightView ssm_beta, ssm_alpha;         // [H_v, D]
    const float* ssm_conv1d = nullptr;      // [conv_dim, K]
    const float* ssm_a = nullptr;           // [H_v]   -exp(A_log)
    const float* ssm_dt = nullptr;          // [H_v]
    const float* ssm_norm = nullptr;        // [d_v]
    WeightView ssm_out;                     // [D, value_dim]
    // Gated full-attention layer.
    WeightView wq;                          // [n_head * 2 * head_dim, D]  per head [q | gate]
    WeightView wk, wv;                      // [n_head_kv * head_dim, D]
    WeightView wo;                          // [D, n_head * head_dim]
    const float* q_norm = nullptr;          // [head_dim]
    const float* k_norm = nullptr;          // [head_dim]
};

struct Qwen35GraphBuilder;

// The MTP block (blk.{n_layer}: nextn.* and one gated-attention decoder layer).
struct Qwen35Mtp {
    Qwen35Layer layer;                      // attention kind (wq, wk, wv, wo, norms, FFN)
    WeightView eh_e, eh_h;                  // nextn.eh_proj's two input halves, [D, D] each
    const float* enorm = nullptr;           // [D] on the next token's embedding
    const float* hnorm = nullptr;           // [D] on the trunk's pre-norm hidden state
    const float* head_norm = nullptr;       // [D] shared_head_norm, else output_norm
};

class Qwen35Model {
public:
    // Binds every tensor by name and checks its shape and type; throws alloy::Error naming the
    // file and the tensor. Keeps `file` alive (weights point into its mapping).
    static std::unique_ptr<Qwen35Model> load(std::shared_ptr<gguf::File> file);

    const Qwen35HParams& hparams() const { return hp_; }
    // The forward pass of one step as a graph of named ops (model/graph.h), every node on every
    // row; runtime/graph_passes.h narrows rows and fuses, a backend runs it. Nodes point at
    // this model's weights, so the graph is valid as long as the model is.
    graph::Graph build_graph(const graph::GraphSpec& spec) const;
    const gguf::File& file() const { return *file_; }
    // The MTP block, bound when the file has one (nextn_predict_layers > 0), else nullptr.
    const Qwen35Mtp* mtp() const { return mtp_ ? &*mtp_ : nullptr; }
    // Repacks the Q4_K, Q5_K, Q6_K, IQ4_XS and Q8_0 matrices of the dense layers, the MoE experts
    // (each expert tensor whole, where every expert is whole 16-row groups) and the LM head in
    // place for the CPU kernels (cpu::repack_weight; `allow`: the types to repack, nullptr: all). A tied table
    // keeps one copy (the embedding gather unpacks its rows). Only for a file whose tensor bytes
    // are resident (writable) and a model run on the CPU backend only: other readers (the CUDA
    // upload, kernels/ref) read the GGUF layout. Returns the matrices repacked.
    int repack_for_cpu(bool (*allow)(GgmlType) = nullptr);

    // Tensor parallelism (model/qwen35_shard.cpp): rank `rank` of `n_ranks`' part of this model.
    // GDN layers split by key heads (each rank's value heads are those that read its key heads,
    // so the recurrent state splits with no communication inside the op), attention by query
    // and KV heads, the MLP and every expert (and the shared expert) by their hidden width; the
    // embedding, the norms, the router and the LM head are whole on every rank. Its graphs
    // end each block's output projection with an AllReduce (the partial sums of the ranks).
    // Throws naming the hyperparameter or tensor that does not split (a head count that
    // n_ranks does not divide, a quantized block straddling two ranks' columns). The shard
    // points into this model's file (kept alive) and owns its sliced copies; n_ranks 1 gives
    // the whole model with the AllReduce nodes (one rank's collective: a test of that path).
    // experts_by_id (expert parallelism, qwen35moe): each rank holds E / n_ranks whole routed
    // experts instead of a slice of every one (ref::MoeWeights::expert_begin); the rest as above.
    std::unique_ptr<Qwen35Model> shard(int rank, int n_ranks, bool experts_by_id = false) const;
    int tp_rank() const { return tp_rank_; }
    int tp_size() const { return tp_size_; }  // 0: not a shard

private:
    std::shared_ptr<gguf::File> file_;
    Qwen35HParams hp_;
    WeightView tok_embd;          // [n_vocab, D]
    const float* output_norm = nullptr;  // [D]
    WeightView output;            // [n_vocab, D] (token_embd when tied)
    std::vector<Qwen35Layer> layers_;
    std::vector<std::vector<float>> owned_;  // small tensors converted to fp32
    std::vector<std::vector<uint8_t>> owned_bytes_;  // eh_proj's halves, in the file's type
    std::optional<Qwen35Mtp> mtp_;
    int tp_rank_ = 0, tp_size_ = 0;  // shard(): which part of the whole model this is
    void mtp_head(Qwen35GraphBuilder& b, int h, int en) const;  // build_graph's MTP nodes
};

}  // namespace alloy
