// Q4_K, Q5_K, Q6_K and IQ4_XS matrices repacked at load for the CPU kernels
// (Qwen35Model::repack_for_cpu, WeightLayout::KqRows16): the model computes the same logits bit
// for bit as on the stored layout, at prefill, decode and verification-sized steps, with a tied
// Q4_K table (the embedding gather unpacks its rows), in a Q4_K_M file (Q4_K and Q6_K matrices,
// a tied Q6_K table), a Q5_K_M file (Q5_K and Q6_K), an IQ4_XS file and a Q8_0 file (every matrix and
// the tied table Q8_0: WeightLayout::Q8Rows16); a mapped file is not written. A MoE file's expert
// tensors (ffn_*_exps, one matrix per expert) are repacked whole where every expert's slice is
// whole groups, with the same logits.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "format/gguf.h"
#include "model/qwen35.h"
#include "model/quantize.h"
#include "model/graph.h"
#include "model/synth.h"
#include "runtime/model_runner.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;

// repack_for_cpu's filter is a plain function: the one type a test repacks first.
GgmlType g_only = GgmlType::F32;
bool only(GgmlType t) { return t == g_only; }

class Repack : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = fs::temp_directory_path() / ("alloy_repack_" + std::to_string(::getpid()));
        fs::create_directories(dir_);
        SynthOptions so;  // tiny: D 256, tied embeddings
        so.dtype = GgmlType::F32;
        so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
        so.out_path = (dir_ / "tiny.gguf").string();
        synth_qwen35(so);
        const auto quantize = [&](FileType type, bool pure, const char* name) {
            QuantizeOptions q;
            q.type = type;
            q.pure = pure;  // pure: every matrix of the type, the tied table too
            for (const auto& t : quantize_file(so.out_path, (dir_ / name).string(), q).tensors) types_[name][t.name] = t.to;
        };
        quantize(FileType::Q4_K_M, false, "q4km.gguf");
        quantize(FileType::Q4_K_M, true, "q4k.gguf");
        quantize(FileType::Q5_K_M, false, "q5km.gguf");
        quantize(FileType::IQ4_XS, false, "iq4xs.gguf");
        quantize(FileType::Q8_0, true, "q8.gguf");
        // moe-tiny: D 256, 8 experts of width 128 (ffn_down_exps rows of 128: no K-quant there).
        SynthOptions mo = so;
        mo.preset = "moe-tiny";
        mo.out_path = (dir_ / "moe.gguf").string();
        synth_qwen35(mo);
        const auto quantize_moe = [&](FileType type, const char* name) {
            QuantizeOptions q;
            q.type = type;
            for (const auto& t : quantize_file(mo.out_path, (dir_ / name).string(), q).tensors) types_[name][t.name] = t.to;
        };
        quantize_moe(FileType::Q4_K_M, "moe_q4km.gguf");
        quantize_moe(FileType::Q8_0, "moe_q8.gguf");
    }
    static void TearDownTestSuite() { fs::remove_all(dir_); }

    // Logits of a 40-token prompt (every row), then 3 decode steps, then a 5-token step.
    static std::vector<float> run(const Qwen35Model& m) {
        ModelRunner runner(m);
        ModelState st = runner.new_state(128);
        const int V = int(m.hparams().n_vocab);
        std::mt19937 rng(3);
        std::vector<int32_t> ids(52);
        for (auto& t : ids) t = int32_t(rng() % uint32_t(V));
        ForwardOptions all;
        all.all_logits = true;
        std::vector<float> out(size_t(40) * V), step(size_t(5) * V);
        runner.forward(st, ids.data(), 40, all, out.data());
        for (int i = 0; i < 3; ++i) {
            runner.forward(st, ids.data() + 40 + i, 1, all, step.data());
            out.insert(out.end(), step.begin(), step.begin() + V);
        }
        runner.forward(st, ids.data() + 43, 5, all, step.data());
        out.insert(out.end(), step.begin(), step.end());
        return out;
    }
    static inline fs::path dir_;
    static inline std::map<std::string, std::map<std::string, GgmlType>> types_;  // file -> tensor -> type
};

TEST_F(Repack, LogitsAreTheStoredLayoutsBitForBit) {
    // What the files hold: a tied table (no output.weight) of Q6_K / Q4_K, Q4_K and Q6_K layers;
    // Q5_K and IQ4_XS layers.
    auto& km = types_["q4km.gguf"];
    EXPECT_EQ(km.count("output.weight"), 0u);
    EXPECT_EQ(km["token_embd.weight"], GgmlType::Q6_K);
    EXPECT_EQ(types_["q4k.gguf"]["token_embd.weight"], GgmlType::Q4_K);
    EXPECT_EQ(km["blk.0.ffn_gate.weight"], GgmlType::Q4_K);
    EXPECT_EQ(types_["q5km.gguf"]["blk.0.ffn_gate.weight"], GgmlType::Q5_K);
    EXPECT_EQ(types_["iq4xs.gguf"]["blk.0.ffn_gate.weight"], GgmlType::IQ4_XS);
    EXPECT_EQ(types_["q8.gguf"]["token_embd.weight"], GgmlType::Q8_0);  // a tied Q8_0 table (Q8Rows16)
    const std::pair<const char*, GgmlType> files[] = {
        {"q4k.gguf", GgmlType::Q4_K}, {"q4km.gguf", GgmlType::Q4_K}, {"q5km.gguf", GgmlType::Q5_K}, {"iq4xs.gguf", GgmlType::IQ4_XS},
        {"q8.gguf", GgmlType::Q8_0}};
    for (const auto& [name, type] : files) {
        const std::string path = (dir_ / name).string();
        auto plain = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(path, gguf::TensorData::Resident)));
        auto packed = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(path, gguf::TensorData::Resident)));
        ASSERT_TRUE(packed->file().resident()) << name;
        g_only = type;  // the file's own type is repacked (not only its Q6_K matrices), then the rest
        EXPECT_GT(packed->repack_for_cpu(only), 0) << name;
        packed->repack_for_cpu();
        EXPECT_EQ(packed->repack_for_cpu(), 0) << name << ": repacked twice";
        const std::vector<float> a = run(*plain), b = run(*packed);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << name;
    }
}

// Every MoE layer's expert tensors in a model's graph (the MoeFfn nodes' weights): gate, up, down.
std::vector<WeightView> expert_tensors(const Qwen35Model& m) {
    std::vector<WeightView> out;
    const graph::Graph g = m.build_graph({graph::Rows::Last});
    for (const auto& n : g.nodes)
        if (n.moe) out.insert(out.end(), {n.moe->gate.all, n.moe->up.all, n.moe->down.all});
    return out;
}

TEST_F(Repack, MoeExpertsAreRepackedWithTheSameLogits) {
    EXPECT_EQ(types_["moe_q4km.gguf"]["blk.0.ffn_gate_exps.weight"], GgmlType::Q4_K);
    EXPECT_EQ(types_["moe_q8.gguf"]["blk.0.ffn_down_exps.weight"], GgmlType::Q8_0);
    for (const char* name : {"moe_q4km.gguf", "moe_q8.gguf"}) {
        const std::string path = (dir_ / name).string();
        auto plain = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(path, gguf::TensorData::Resident)));
        auto packed = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(path, gguf::TensorData::Resident)));
        EXPECT_GT(packed->repack_for_cpu(), 0) << name;
        const std::vector<WeightView> before = expert_tensors(*plain), after = expert_tensors(*packed);
        ASSERT_EQ(before.size(), 12u) << name;  // 4 MoE layers x gate, up, down
        int n_packed = 0;
        for (size_t i = 0; i < after.size(); ++i) {
            EXPECT_EQ(before[i].layout, WeightLayout::Gguf) << name << " " << i;
            // Every type that has a repacked layout gets it (repack_for_cpu without a filter).
            const GgmlType t = after[i].type;
            const WeightLayout want = t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K || t == GgmlType::IQ4_XS
                                          ? WeightLayout::KqRows16
                                      : t == GgmlType::Q8_0 ? WeightLayout::Q8Rows16
                                                            : WeightLayout::Gguf;
            EXPECT_EQ(after[i].layout, want) << name << " " << i << " " << type_traits(t).name;
            n_packed += after[i].layout != WeightLayout::Gguf;
        }
        if (std::string(name) == "moe_q4km.gguf") EXPECT_GE(n_packed, 8) << name;  // gate and up (Q4_K) at least
        const std::vector<float> a = run(*plain), b = run(*packed);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << name;
    }
}

TEST_F(Repack, AMappedFileIsNotWritten) {
    const std::string path = (dir_ / "q4k.gguf").string();
    auto mapped = Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(path, gguf::TensorData::Mapped)));
    EXPECT_EQ(mapped->repack_for_cpu(), 0);
}

}  // namespace
}  // namespace alloy
