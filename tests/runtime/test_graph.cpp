// The op graph the model builds and the rewrites between it and a backend (runtime/graph_passes.h):
// which rows each node keeps, the fusions, and the checks a malformed graph meets.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "alloy/error.h"
#include "format/gguf.h"
#include "model/graph.h"
#include "model/qwen35.h"
#include "model/synth.h"
#include "runtime/graph_passes.h"
#include "runtime/model_runner.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;
using graph::Op;
using graph::Rows;

class GraphPasses : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        const fs::path dir = fs::temp_directory_path() / ("alloy_graph_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        SynthOptions so;  // tiny: 4 layers, the last one full attention
        so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
        so.out_path = (dir / "tiny.gguf").string();
        synth_qwen35(so);
        model_ = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(so.out_path)));
        fs::remove_all(dir);
    }
    static void TearDownTestSuite() { model_.reset(); }
    static const graph::Node* node(const graph::Graph& g, const std::string& label) {
        for (const graph::Node& n : g.nodes)
            if (n.label == label) return &n;
        return nullptr;
    }
    static inline std::unique_ptr<Qwen35Model> model_;
};

TEST_F(GraphPasses, TheModelWritesEveryOpOnEveryRow) {
    const graph::Graph g = model_->build_graph({Rows::Last});
    const int L = model_->hparams().n_layer;
    ASSERT_FALSE(model_->hparams().is_recurrent(L - 1));
    for (const graph::Node& n : g.nodes) EXPECT_EQ(n.rows, Rows::All) << n.label;
    EXPECT_GE(g.find("blk.0.gdn.mixed_qkv"), 0);
    EXPECT_GE(g.find("blk." + std::to_string(L - 1) + ".attn.q_rope"), 0);
    EXPECT_TRUE(g.tensors[size_t(g.find("logits"))].logits);
    EXPECT_NO_THROW(graph::check(g));
}

TEST_F(GraphPasses, LastTokenLogitsPruneTheLastLayerAfterItsState) {
    graph::Graph g = model_->build_graph({Rows::Last});
    graph::prune_rows(g);
    const std::string p = "blk." + std::to_string(model_->hparams().n_layer - 1) + ".";
    // Every row: what writes the cache (k, v, their norm/rope, the store) and the layers before.
    for (const char* l : {"attn_k", "attn_v", "attn_k_norm+rope_k", "kv_store"}) {
        ASSERT_NE(node(g, p + l), nullptr) << l;
        EXPECT_EQ(node(g, p + l)->rows, Rows::All) << l;
    }
    EXPECT_EQ(node(g, "blk.0.ssm_out")->rows, Rows::All);
    // The last row: the query, attention, output projection, MLP, final norm and LM head.
    for (const char* l : {"attn_q", "attn_q_norm+rope_q", "attention", "attn_gate", "attn_output", "ffn_down"}) {
        ASSERT_NE(node(g, p + l), nullptr) << l;
        EXPECT_EQ(node(g, p + l)->rows, Rows::Last) << l;
    }
    EXPECT_EQ(node(g, "output")->rows, Rows::Last);
    EXPECT_EQ(g.tensors[size_t(g.find(p + "attn.k"))].rows, Rows::All);
    EXPECT_EQ(g.tensors[size_t(g.find(p + "attn.qg"))].rows, Rows::Last);
}

TEST_F(GraphPasses, AnInnerPieceStopsAtTheLastState) {
    graph::Graph g = model_->build_graph({Rows::None});
    graph::prune_rows(g);
    const std::string p = "blk." + std::to_string(model_->hparams().n_layer - 1) + ".";
    EXPECT_NE(node(g, p + "kv_store"), nullptr);
    for (const char* l : {"attn_q", "attention", "attn_output", "post_attention_norm", "ffn_gate"})
        EXPECT_EQ(node(g, p + l), nullptr) << l;
    EXPECT_EQ(node(g, "output"), nullptr);
    EXPECT_NE(node(g, "blk.0.gdn"), nullptr);
}

TEST_F(GraphPasses, ListedRowsAreGatheredByTheOutputNorm) {
    graph::Graph g = model_->build_graph({Rows::Listed});
    graph::prune_rows(g);
    EXPECT_EQ(node(g, "output_norm")->rows, Rows::Listed);
    EXPECT_EQ(node(g, "output")->rows, Rows::Listed);
    EXPECT_EQ(g.tensors[size_t(g.find("hf"))].rows, Rows::Listed);
    // The norm reads every row of the last layer's output (it gathers), which keeps every row.
    const std::string p = "blk." + std::to_string(model_->hparams().n_layer - 1) + ".";
    EXPECT_EQ(g.tensors[size_t(g.find(p + "h"))].rows, Rows::All);
    EXPECT_EQ(node(g, p + "attention")->rows, Rows::All);
    EXPECT_NO_THROW(graph::check(g));
}

TEST_F(GraphPasses, FusionsReplaceTheirParts) {
    graph::Graph g = model_->build_graph({Rows::All});
    graph::prune_rows(g);
    const size_t before = g.nodes.size();
    graph::fuse_add_norm(g);
    graph::fuse_matmul_swiglu(g);
    graph::group_matmuls(g);
    EXPECT_LT(g.nodes.size(), before);
    const graph::Node* an = node(g, "blk.0.residual+post_attention_norm");
    ASSERT_NE(an, nullptr);
    EXPECT_EQ(an->op, Op::AddRmsNorm);
    EXPECT_EQ(g.tensors[size_t(an->out[1])].name, "blk.0.y");
    EXPECT_NE(node(g, "blk.0.residual+blk.1.attn_norm"), nullptr);
    const graph::Node* sw = node(g, "blk.0.ffn_gate+ffn_up+swiglu");
    ASSERT_NE(sw, nullptr);
    EXPECT_EQ(sw->op, Op::MatmulSwiglu);
    const graph::Node* mm = node(g, "blk.0.attn_qkv+attn_gate+ssm_beta+ssm_alpha");
    ASSERT_NE(mm, nullptr);
    EXPECT_EQ(mm->op, Op::MatmulMulti);
    EXPECT_EQ(mm->weights.size(), 4u);
    for (const graph::Node& n : g.nodes) EXPECT_NE(n.op, Op::Swiglu) << n.label;
    EXPECT_NO_THROW(graph::check(g));
}

TEST_F(GraphPasses, MalformedGraphsAreRefusedByName) {
    graph::Graph g;
    const int a = g.add_tensor("a", 4);
    EXPECT_THROW(g.add_tensor("a", 4), Error);
    EXPECT_THROW(g.add_tensor("b", 0), Error);
    const int b = g.add_tensor("b", 4);
    EXPECT_THROW(g.add(Op::Add, "bad", {a, 7}, {b}), Error);
    g.add(Op::Add, "early", {a, b}, {b});  // reads a and b, which nothing wrote
    try {
        graph::check(g);
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'early' reads 'a'"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace alloy
