// Qwen3.5 text model, dense (GGUF arch `qwen35`) or MoE (`qwen35moe`: every FFN a routed
// mixture of experts with a shared expert, the rest identical), written once as a list of ops.
// Three parts, as llama.cpp's src/models/*.cpp: hyperparameters from metadata, weights bound
// by name with their expected shapes, and the forward pass. Math: spec/MODEL.md.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "runtime/plan.h"
#include "runtime/zero_pages.h"
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

// Element types of the KV cache (llama.cpp's -ctk / -ctv): F32, F16 or BF16, f16 by default as in
// llama.cpp. K and V are computed in fp32 and rounded to the cache type when stored
// (kernels/ref/kv_store.h); attention reads the rounded values.
struct KvCacheTypes {
    GgmlType k = GgmlType::F16, v = GgmlType::F16;
};

// The mutable state of n_slots sequences (runtime/slot_cache.h adds copy / snapshot / restore /
// truncate): per attention layer a KV cache per slot, per GDN layer the conv and recurrent
// states of every slot in one array, so the GDN op of a batch updates its sequences' slots in
// place (kernels' seq_slots). Sized once for n_ctx positions per slot; the KV pages past the
// rows written so far are never touched (runtime/zero_pages.h), so they cost no resident memory.
struct ModelState {
    int n_slots = 0;
    int n_ctx = 0;                               // positions per slot
    KvCacheTypes kv_types;
    std::vector<int> n_past;                     // [n_slots] tokens each slot holds
    std::vector<std::vector<ZeroPages>> k_cache, v_cache;  // [layer][slot] (empty for GDN layers):
                                                 // [n_ctx, n_head_kv*head_dim] of kv_types.k / .v
    std::vector<std::vector<float>> conv_state;  // per layer: [n_slots, conv_dim, K-1]
    std::vector<std::vector<float>> ssm_state;   // per layer: [n_slots, H_v, d_v, d_k]
    size_t conv_elems = 0, ssm_elems = 0;        // per slot: conv_dim*(K-1), H_v*d_v*d_k

    float* conv(int layer, int slot) { return conv_state[size_t(layer)].data() + size_t(slot) * conv_elems; }
    float* ssm(int layer, int slot) { return ssm_state[size_t(layer)].data() + size_t(slot) * ssm_elems; }
    const float* conv(int layer, int slot) const { return conv_state[size_t(layer)].data() + size_t(slot) * conv_elems; }
    const float* ssm(int layer, int slot) const { return ssm_state[size_t(layer)].data() + size_t(slot) * ssm_elems; }
    void check_slot(int slot) const;  // throws naming the slot and the range
    void reset(int slot);  // back to an empty sequence (cache rows are overwritten before they are read)
    void reset();          // every slot
};

// Which logits a sequence of a batch returns.
enum class BatchLogits { None, Last, All };

// One forward step over one or more sequences (the scheduler's unit): each sequence is a run of
// consecutive tokens continuing its slot, at positions n_past[slot], n_past[slot] + 1, ...
// (a slot's tokens are always appended: the state operations rewind a slot, not the batch).
struct BatchSeq {
    int slot = 0;
    int n_tokens = 0;
    BatchLogits logits = BatchLogits::Last;
    // Run this sequence's GDN layers with the serial kernel (decode and speculative
    // verification: the same bits for any split of its tokens); else ForwardOptions::gdn_mode.
    bool serial = false;
};

struct Batch {
    std::vector<int32_t> ids;   // [T] the sequences' tokens, concatenated in `seqs` order
    std::vector<BatchSeq> seqs;
    void add(int slot, const int32_t* tokens, int n, BatchLogits logits, bool serial) {
        ids.insert(ids.end(), tokens, tokens + n);
        seqs.push_back({slot, n, logits, serial});
    }
    // Rows of logits the forward writes: one per Last sequence, n_tokens per All one, in order.
    int64_t logit_rows() const;
};

struct ForwardOptions {
    ref::GdnMode gdn_mode = ref::GdnMode::Chunked;
    int gdn_chunk = 64;
    bool all_logits = false;  // logits of every token, else only of the last
    // Longest piece one plan runs: longer prompts are processed in consecutive pieces (the
    // states carry over), which bounds the plan's buffers as llama.cpp's ubatch does.
    // A multiple of gdn_chunk.
    int max_batch = 512;
};

class Qwen35Model {
public:
    // Binds every tensor by name and checks its shape and type; throws alloy::Error naming the
    // file and the tensor. Keeps `file` alive (weights point into its mapping).
    static std::unique_ptr<Qwen35Model> load(std::shared_ptr<gguf::File> file);

    const Qwen35HParams& hparams() const { return hp_; }
    // Fresh states of n_slots sequences of up to n_ctx tokens each; throws for n_ctx <= 0,
    // n_slots <= 0 or a cache type other than F32/F16/BF16.
    ModelState new_state(int n_ctx, KvCacheTypes kv_types = {}, int n_slots = 1) const;
    // Runs n tokens of one sequence (slot) at positions n_past[slot].. and advances it, by
    // replaying the recorded plan of the bucket n falls in (built on first use).
    // logits: [n, n_vocab] if opts.all_logits else [n_vocab] (the last token's).
    // prof: if given, every kernel launch is timed into it.
    void forward(ModelState& state, const int32_t* ids, int n, const ForwardOptions& opts,
                 float* logits, Profiler* prof = nullptr, int slot = 0) const;
    // One step over a batch of sequences (distinct slots): the matmuls see every token of the
    // batch as one [T, D] input, the GDN op its sequences ragged on their slots, attention each
    // sequence against its own cache. logits: [batch.logit_rows(), n_vocab]. opts.all_logits is
    // ignored (each sequence says what it returns). A batch of one sequence runs exactly as
    // the call above (pieces of opts.max_batch); a batch of several runs as one piece (the
    // caller bounds its size). Throws naming the sequence for a bad slot, an empty sequence or
    // one that would overflow its slot's context.
    void forward(ModelState& state, const Batch& batch, const ForwardOptions& opts, float* logits,
                 Profiler* prof = nullptr) const;
    // The bucket a call of n tokens runs in: 1 for decode, else n rounded up to the GDN chunk.
    static int bucket_for(int n, const ForwardOptions& opts);
    // Records the launches of one forward pass over up to `bucket` tokens.
    // logits: 0 none (a piece that is not the last), 1 the last token's, 2 every token's.
    std::unique_ptr<Plan> build_plan(int bucket, const ForwardOptions& opts, int logits) const;
    // Frees every recorded plan and its scratch (the next call of each bucket records anew).
    void drop_plans() const;
    const gguf::File& file() const { return *file_; }

private:
    std::shared_ptr<gguf::File> file_;
    Qwen35HParams hp_;
    WeightView tok_embd;          // [n_vocab, D]
    const float* output_norm = nullptr;  // [D]
    WeightView output;            // [n_vocab, D] (token_embd when tied)
    std::vector<Qwen35Layer> layers_;
    std::vector<std::vector<float>> owned_;  // small tensors converted to fp32
    // Plans by (bucket, logits mode, gdn mode, chunk); built lazily, reused across calls.
    mutable std::map<std::tuple<int, int, int, int>, std::unique_ptr<Plan>> plans_;
    mutable std::shared_ptr<PlanArena> plan_arena_ = std::make_shared<PlanArena>();  // shared by plans_
    void run_plan(const StepContext& ctx, int bucket, const ForwardOptions& opts, int logits_mode, Profiler* prof) const;
};

}  // namespace alloy
