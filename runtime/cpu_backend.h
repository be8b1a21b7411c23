// The CPU backend: a graph becomes a plan of closures over kernels/cpu (runtime ISA dispatch),
// one per node, with every tensor in one scratch region whose offsets come from the tensors'
// lifetimes (tensors never live at once share memory: a GDN block's, an attention block's and
// the MLP's buffers overlap). The plans of one backend share that region (runtime/plan.h
// PlanArena). Weights are read where the model bound them; the state is host memory.
#pragma once
#include "runtime/backend.h"
#include "runtime/collective.h"

namespace alloy {

class CpuBackend final : public Backend {
public:
    CpuBackend() = default;
    // A rank of a tensor-parallel model: its graphs' AllReduce ops sum over `collective`.
    explicit CpuBackend(std::shared_ptr<Collective> collective) : collective_(std::move(collective)) {}
    std::string name() const override { return "cpu"; }
    // prune_rows is the runner's; here: residual add + norm, SwiGLU in the GEMM epilogue,
    // matmuls sharing an input.
    void optimize(graph::Graph& g) const override;
    std::unique_ptr<Plan> compile(const graph::Graph& g, int bucket, const CompileOptions& opt) override;
    ModelState new_state(const Qwen35HParams& hp, int n_ctx, KvCacheTypes kv_types, int n_slots) override;
    void drop_scratch() override { arena_ = std::make_shared<PlanArena>(); }
    // cpu::gdn_fused (serial) on the logged rows, the slot's states in st (host memory).
    bool replay_gdn(ModelState& st, const GdnReplayLog& log, int seq, int kept) override;

private:
    std::shared_ptr<Collective> collective_;
    std::shared_ptr<PlanArena> arena_ = std::make_shared<PlanArena>();
};

}  // namespace alloy
