// Batches equal single runs (issue 17, must-show 2): sequences of different lengths decoded
// together in one forward step (and mixed steps: some sequences prefilling a piece while others
// decode) give each sequence the greedy tokens of running it alone.
// Bit-identical logits for any number of rows: the F32 matmuls, and Q8_0's GEMVs and GEMM
// tiles, compute one chain per (row, token) whatever the token count (kernels/cpu/
// matmul_q8_avx512.cpp); the BF16 and K-quant matmuls up to 16 rows (their streaming GEMVs,
// cpu/matmul_kernels.h kGemvMaxTokens). The GDN op and the norms are per sequence or per row;
// attention is per sequence, with one kernel for T <= 4 queries and another for longer ones
// (the mixed-step test).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "alloy/error.h"
#include "format/gguf.h"
#include "model/qwen35.h"
#include "runtime/model_runner.h"
#include "runtime/sampler.h"
#include "kernels/ref/top_k.h"
#include "model/synth.h"
#include "runtime/gdn_replay.h"
#include "runtime/speculative.h"
#include "tests/logits_error.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Qwen35Model> make_model(const std::string& preset, GgmlType dtype, bool repack = false) {
    const fs::path dir = fs::temp_directory_path() / ("alloy_batch_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    SynthOptions so;
    so.preset = preset;
    so.dtype = dtype;
    so.tokenizer_json = std::string(ALLOY_SOURCE_DIR) + "/testdata/qwen3-tokenizer/tokenizer.json";
    so.out_path = (dir / (preset + ".gguf")).string();
    synth_qwen35(so);
    auto m = repack ? Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(so.out_path, gguf::TensorData::Resident)))
                    : Qwen35Model::load(std::shared_ptr<gguf::File>(gguf::File::open(so.out_path)));
    if (repack) EXPECT_GT(m->repack_for_cpu(), 0);  // (Q8_0: WeightLayout::Q8Rows16)
    fs::remove_all(dir);
    return m;
}

// The model's forward on the CPU backend (the runner keeps a reference: both live to the end).
// repack: the matrices repacked for the CPU kernels (Qwen35Model::repack_for_cpu).
const ModelRunner& model(const std::string& preset, GgmlType dtype, bool repack = false) {
    static std::map<std::pair<std::string, int>, std::pair<std::unique_ptr<Qwen35Model>, std::unique_ptr<ModelRunner>>> models;
    auto& m = models[{preset, int(dtype) + (repack ? 1000 : 0)}];
    if (!m.first) {
        m.first = make_model(preset, dtype, repack);
        m.second = std::make_unique<ModelRunner>(*m.first);
    }
    return *m.second;
}

std::vector<int32_t> ids(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& id : v) id = int32_t(rng() % 5000);
    return v;
}

int32_t argmax(const float* row, int V) { return int32_t(std::max_element(row, row + V) - row); }

// One sequence alone in a one-slot state: prefill `prompt`, then n_gen greedy decode steps.
// Returns the logits of the prefill's last token and of every decode step.
struct Run {
    std::vector<int32_t> tokens;  // greedy tokens
    std::vector<float> logits;    // [1 + n_gen, V]
};

Run run_alone(const ModelRunner& m, const std::vector<int32_t>& prompt, int n_gen) {
    const int V = m.hparams().n_vocab;
    ModelState st = m.new_state(1024);
    Run r;
    r.logits.resize(size_t(1 + n_gen) * V);
    ForwardOptions fo;
    m.forward(st, prompt.data(), int(prompt.size()), fo, r.logits.data());
    fo.gdn_mode = ref::GdnMode::Serial;
    for (int i = 0; i < n_gen; ++i) {
        const int32_t next = argmax(r.logits.data() + size_t(i) * V, V);
        r.tokens.push_back(next);
        m.forward(st, &next, 1, fo, r.logits.data() + size_t(i + 1) * V);
    }
    return r;
}

// S sequences (prompt lengths 3 + 7 s) prefilled one by one into slots of one state, then
// decoded together: one batch of S tokens per step. The slots are used in a shuffled order.
std::vector<Run> run_batched(const ModelRunner& m, const std::vector<std::vector<int32_t>>& prompts, int n_gen) {
    const int V = m.hparams().n_vocab, S = int(prompts.size());
    ModelState st = m.new_state(1024, {}, S + 2);
    std::vector<int> slot(static_cast<size_t>(S + 2));
    for (int s = 0; s < S + 2; ++s) slot[size_t(s)] = s;
    std::shuffle(slot.begin(), slot.end(), std::mt19937(uint32_t(S)));
    std::vector<Run> r(static_cast<size_t>(S));
    std::vector<float> last(size_t(S) * V);
    ForwardOptions fo;
    for (int s = 0; s < S; ++s) {
        r[size_t(s)].logits.resize(size_t(1 + n_gen) * V);
        m.forward(st, prompts[size_t(s)].data(), int(prompts[size_t(s)].size()), fo, r[size_t(s)].logits.data(), nullptr,
                  slot[size_t(s)]);
    }
    fo.gdn_mode = ref::GdnMode::Serial;
    for (int i = 0; i < n_gen; ++i) {
        Batch b;
        for (int s = 0; s < S; ++s) {
            const int32_t next = argmax(r[size_t(s)].logits.data() + size_t(i) * V, V);
            r[size_t(s)].tokens.push_back(next);
            b.add(slot[size_t(s)], &next, 1, BatchLogits::Last, /*serial=*/true);
        }
        m.forward(st, b, fo, last.data());
        for (int s = 0; s < S; ++s)
            std::copy_n(last.data() + size_t(s) * V, V, r[size_t(s)].logits.data() + size_t(i + 1) * V);
    }
    return r;
}

void expect_batches_equal_single_runs(const ModelRunner& m) {
    const int n_gen = 6;
    for (int S : {1, 2, 3, 4, 5, 6, 7, 8, 20}) {
        std::vector<std::vector<int32_t>> prompts;
        for (int s = 0; s < S; ++s) prompts.push_back(ids(3 + 7 * s, 100 + uint32_t(s)));
        const std::vector<Run> batched = run_batched(m, prompts, n_gen);
        for (int s = 0; s < S; ++s) {
            const Run alone = run_alone(m, prompts[size_t(s)], n_gen);
            SCOPED_TRACE("S=" + std::to_string(S) + " sequence " + std::to_string(s));
            EXPECT_EQ(batched[size_t(s)].tokens, alone.tokens);
            EXPECT_EQ(batched[size_t(s)].logits, alone.logits);
        }
    }
}

TEST(Batch, DecodeStepsOfOneTo8And20SequencesEqualSingleRunsF32) {
    expect_batches_equal_single_runs(model("tiny", GgmlType::F32));
}

// Q8_0's GEMVs and GEMM tiles compute one chain per output (kernels/cpu/matmul_q8_avx512.cpp):
// 20 sequences (a GEMM step) give each sequence its alone bits too.
TEST(Batch, DecodeStepsOfOneTo8And20SequencesEqualSingleRunsQ8_0) {
    expect_batches_equal_single_runs(model("tiny", GgmlType::Q8_0));
}

// Q8_0 repacked (WeightLayout::Q8Rows16 where AVX512-VNNI runs: the zmm GEMV for up to 16
// sequences, the tiles reading the layout past that): every batch size gives each sequence its
// alone bits, and those are the stored layout's bits.
TEST(Batch, DecodeStepsEqualSingleRunsQ8_0Repacked) {
    const ModelRunner& packed = model("tiny", GgmlType::Q8_0, true);
    expect_batches_equal_single_runs(packed);
    const ModelRunner& plain = model("tiny", GgmlType::Q8_0);
    std::vector<std::vector<int32_t>> prompts;
    for (int s = 0; s < 9; ++s) prompts.push_back(ids(3 + 7 * s, 300 + uint32_t(s)));
    const auto a = run_batched(packed, prompts, 4), b = run_batched(plain, prompts, 4);
    for (int s = 0; s < 9; ++s) EXPECT_EQ(a[size_t(s)].logits, b[size_t(s)].logits) << "sequence " << s;
}

TEST(Batch, DecodeStepsEqualSingleRunsMoE) {
    expect_batches_equal_single_runs(model("moe-tiny", GgmlType::Q8_0));
}

// A mixed step: sequence A decodes one token while sequence B prefills a 40-token piece and C a
// 9-token one (all logits of C), in one forward; each equals its own run.
TEST(Batch, MixedPrefillAndDecodeStepEqualsSingleRuns) {
    for (GgmlType t : {GgmlType::F32, GgmlType::Q8_0}) {
        const ModelRunner& m = model("tiny", t);
        const size_t V = size_t(m.hparams().n_vocab);
        const std::vector<int32_t> a = ids(21, 1), b = ids(40, 2), c = ids(9, 3);
        ForwardOptions fo;
        // Alone.
        std::vector<float> a_want(V), b_want(V), c_want(9 * V), scratch(V);
        {
            ModelState st = m.new_state(256);
            m.forward(st, a.data(), 20, fo, scratch.data());
            ForwardOptions dec = fo;
            dec.gdn_mode = ref::GdnMode::Serial;
            m.forward(st, a.data() + 20, 1, dec, a_want.data());
        }
        {
            ModelState st = m.new_state(256);
            m.forward(st, b.data(), 40, fo, b_want.data());
        }
        {
            ModelState st = m.new_state(256);
            ForwardOptions all = fo;
            all.all_logits = true;
            m.forward(st, c.data(), 9, all, c_want.data());
        }
        // Together: A has its first 20 tokens in slot 2 already.
        ModelState st = m.new_state(256, {}, 3);
        m.forward(st, a.data(), 20, fo, scratch.data(), nullptr, 2);
        Batch batch;
        batch.add(2, a.data() + 20, 1, BatchLogits::Last, /*serial=*/true);
        batch.add(0, b.data(), 40, BatchLogits::Last, false);
        batch.add(1, c.data(), 9, BatchLogits::All, false);
        ASSERT_EQ(batch.logit_rows(), 11);
        std::vector<float> got(size_t(batch.logit_rows()) * V);
        m.forward(st, batch, fo, got.data());
        EXPECT_EQ(st.n_past, (std::vector<int>{40, 9, 21}));
        auto rows = [&](size_t first, size_t n) { return std::vector<float>(got.begin() + first * V, got.begin() + (first + n) * V); };
        SCOPED_TRACE(type_traits(t).name);
        EXPECT_LT(test::max_row_rel_error(rows(0, 1), a_want, V), 1e-5);
        EXPECT_LT(test::max_row_rel_error(rows(1, 1), b_want, V), 1e-5);
        EXPECT_LT(test::max_row_rel_error(rows(2, 9), c_want, V), 1e-5);
        EXPECT_EQ(argmax(rows(0, 1).data(), int(V)), argmax(a_want.data(), int(V)));
        EXPECT_EQ(argmax(rows(1, 1).data(), int(V)), argmax(b_want.data(), int(V)));
        // At F32 every kernel but one is batch-invariant: B alone prunes its last layer to the
        // last row, whose query then takes attention's decode kernel (T = 1); in the batch the
        // last layer keeps every row and B's 40 queries take the prefill kernel, which sums in
        // another order. A (decode in both) and C (all logits: no pruning) are bit-identical.
        if (t == GgmlType::F32) {
            EXPECT_EQ(rows(0, 1), a_want);
            EXPECT_EQ(rows(2, 9), c_want);
        }
    }
}

// greedy_token's rule (the device argmax's too): the largest logit, the lowest id on ties (-0
// equals +0), any NaN above +inf and the first NaN winning.
TEST(Batch, GreedyTokenRule) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    EXPECT_EQ(greedy_token(std::vector<float>{1, 3, 3, 2}.data(), 4), 1);
    EXPECT_EQ(greedy_token(std::vector<float>{-1, -0.0f, 0.0f, -2}.data(), 4), 1);
    EXPECT_EQ(greedy_token(std::vector<float>{1, inf, -nan, nan, inf}.data(), 5), 2);
    EXPECT_EQ(greedy_token(std::vector<float>{nan, 5, nan}.data(), 3), 0);
    EXPECT_EQ(greedy_token(std::vector<float>{-inf, -inf}.data(), 2), 0);
}

// On a backend without device sampling the runner picks the greedy tokens from the logits
// rows: the same tokens with or without a logits array of the caller's, and the same state.
TEST(Batch, GreedyTokensOfABatchAreThoseOfItsLogits) {
    const ModelRunner& m = model("tiny", GgmlType::Q8_0);
    const size_t V = size_t(m.hparams().n_vocab);
    ModelState a = m.new_state(64, {}, 2), b = m.new_state(64, {}, 2);
    const auto p0 = ids(9, 1), p1 = ids(4, 2);
    Batch batch;
    batch.add(0, p0.data(), int(p0.size()), BatchLogits::Last, true);
    batch.add(1, p1.data(), int(p1.size()), BatchLogits::All, true);
    ForwardOptions fo;
    std::vector<float> rows(size_t(batch.logit_rows()) * V);
    std::vector<int32_t> got(size_t(batch.logit_rows()), -1), with_rows(got);
    m.forward(a, batch, fo, rows.data(), nullptr, with_rows.data());
    m.forward(b, batch, fo, nullptr, nullptr, got.data());
    for (size_t r = 0; r < got.size(); ++r) {
        EXPECT_EQ(got[r], greedy_token(rows.data() + r * V, int(V))) << "row " << r;
        EXPECT_EQ(with_rows[r], got[r]) << "row " << r;
    }
    Batch next;
    next.add(0, &got[0], 1, BatchLogits::Last, true);
    std::vector<float> ra(V), rb(V);
    m.forward(a, next, fo, ra.data());
    m.forward(b, next, fo, rb.data());
    EXPECT_EQ(ra, rb);
}

// A backend that does not pick top-k pairs itself (the CPU) gets them from the runner: the
// pairs are ref::top_k's of the step's logits, with and without the rows asked for too, for a
// batch with an all-rows sequence and in one-sequence pieces.
TEST(Batch, TopKPairsOfABatchAreThoseOfItsLogits) {
    const ModelRunner& m = model("tiny", GgmlType::Q8_0);
    EXPECT_EQ(m.max_top_k_on_device(), 0);
    const size_t V = size_t(m.hparams().n_vocab);
    const auto p0 = ids(9, 3), p1 = ids(4, 4);
    for (int n_seqs : {1, 2}) {
        ModelState a = m.new_state(64, {}, 2), b = m.new_state(64, {}, 2), c = m.new_state(64, {}, 2);
        Batch batch;
        batch.add(0, p0.data(), int(p0.size()), n_seqs == 1 ? BatchLogits::All : BatchLogits::Last, true);
        if (n_seqs == 2) batch.add(1, p1.data(), int(p1.size()), BatchLogits::All, true);
        ForwardOptions fo;
        fo.gdn_chunk = 2;  // one sequence: pieces of 4 tokens (the rows of each land at their offset)
        fo.max_batch = 4;
        const size_t rows_n = size_t(batch.logit_rows());
        const int k = 33;
        std::vector<float> rows(rows_n * V), rows_c(rows_n * V), v(rows_n * k), vc(rows_n * k), want_v(rows_n * k);
        std::vector<int32_t> id(rows_n * k, -1), idc(rows_n * k, -1), want_i(rows_n * k);
        m.forward(a, batch, fo, rows.data());
        const TopKRows top{k, v.data(), id.data()}, top_c{k, vc.data(), idc.data()};
        m.forward(b, batch, fo, nullptr, nullptr, nullptr, &top);
        m.forward(c, batch, fo, rows_c.data(), nullptr, nullptr, &top_c);
        ref::top_k(rows.data(), int64_t(rows_n), int64_t(V), k, want_v.data(), want_i.data());
        EXPECT_EQ(id, want_i) << n_seqs << " sequences";
        EXPECT_EQ(v, want_v) << n_seqs << " sequences";
        EXPECT_EQ(idc, want_i) << n_seqs << " sequences";
        EXPECT_EQ(rows_c, rows) << n_seqs << " sequences";
    }
    ModelState a = m.new_state(64, {}, 2);
    Batch one;
    one.add(0, p0.data(), 2, BatchLogits::Last, true);
    std::vector<float> v(size_t(V) + 1);
    std::vector<int32_t> id(v.size());
    const TopKRows too_many{int(V) + 1, v.data(), id.data()};
    EXPECT_THROW(m.forward(a, one, ForwardOptions{}, nullptr, nullptr, nullptr, &too_many), Error);
}

TEST(Batch, BadBatchesNameTheSequence) {
    const ModelRunner& m = model("tiny", GgmlType::Q8_0);
    ModelState st = m.new_state(16, {}, 2);
    std::vector<float> logits(size_t(4) * m.hparams().n_vocab);
    const std::vector<int32_t> t = ids(20, 4);
    auto expect_error = [&](const Batch& b, const std::vector<std::string>& parts) {
        try {
            m.forward(st, b, ForwardOptions{}, logits.data());
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
        }
    };
    Batch b;
    expect_error(b, {"no sequences"});
    b.add(0, t.data(), 2, BatchLogits::Last, false);
    b.add(0, t.data(), 2, BatchLogits::Last, false);
    expect_error(b, {"sequence 1", "slot 0", "twice"});
    Batch c;
    c.add(0, t.data(), 2, BatchLogits::Last, false);
    c.add(2, t.data(), 2, BatchLogits::Last, false);
    expect_error(c, {"sequence 1", "slot 2", "out of range"});
    Batch d;
    d.add(1, t.data(), 17, BatchLogits::Last, false);
    expect_error(d, {"sequence 0", "17 tokens", "context size of 16"});
    EXPECT_EQ(st.n_past, (std::vector<int>{0, 0}));  // nothing ran
}


// Speculative decoding (issue 21) on the CPU: drafts verified by verify_greedy give plain
// greedy decode's tokens and the logits of every emitted token bit for bit, with 1 to 3 drafts
// a step, right and wrong ones (so rollbacks in between), on F32, Q8_0 and MoE models.
TEST(Speculative, VerifiedDraftsGivePlainDecodeBitForBit) {
    const std::pair<const char*, GgmlType> models[] = {
        {"tiny", GgmlType::F32}, {"tiny", GgmlType::Q8_0}, {"moe-tiny", GgmlType::Q8_0}};
    for (const auto& [preset, type] : models) {
        const ModelRunner& m = model(preset, type);
        const int V = m.hparams().n_vocab;
        for (int p = 0; p < 3; ++p) {
            SCOPED_TRACE(std::string(preset) + " " + std::to_string(int(type)) + " prompt " + std::to_string(p));
            const std::vector<int32_t> prompt = ids(5 + 9 * p, 300 + uint32_t(p));
            const int n_gen = 20;
            const auto plain = run_alone(m, prompt, n_gen + kMaxVerifyTokens);
            SlotStateCache cache(m, 1, 1024);
            ForwardOptions fo;
            std::vector<float> first(static_cast<size_t>(V));
            m.forward(cache.state(), prompt.data(), int(prompt.size()), fo, first.data());
            std::vector<int32_t> got = {argmax(first.data(), V)};
            int accepted = 0, rejected = 0;
            for (int step = 0; int(got.size()) < n_gen; ++step) {
                const size_t at = got.size();  // plain.tokens[at] is the greedy token after got.back()
                const int k = 1 + step % 3;
                std::vector<int32_t> drafts(plain.tokens.begin() + long(at), plain.tokens.begin() + long(at) + k);
                if (step % 2 == 1) drafts[size_t(step % k)] = (drafts[size_t(step % k)] + 1) % V;  // a wrong one
                const VerifyResult r = verify_greedy(m, cache, 0, got.back(), drafts, fo);
                accepted += r.accepted;
                rejected += r.accepted < k;
                ASSERT_EQ(r.tokens.size(), size_t(r.accepted) + 1);
                for (size_t i = 0; i < r.tokens.size(); ++i) {
                    ASSERT_EQ(r.tokens[i], plain.tokens[at + i]) << "step " << step << " row " << i;
                    ASSERT_EQ(0, std::memcmp(r.logits.data() + i * size_t(V), plain.logits.data() + (at + i) * size_t(V),
                                             size_t(V) * 4))
                        << "step " << step << " row " << i;
                    got.push_back(r.tokens[i]);
                }
                EXPECT_EQ(cache.n_past(0), int(prompt.size() + got.size()) - 1);
            }
            EXPECT_GT(accepted, 0);
            EXPECT_GT(rejected, 0);
        }
        SlotStateCache cache(m, 1, 64);
        EXPECT_THROW(verify_greedy(m, cache, 0, 1, {2, 3, 4, 5}, ForwardOptions{}), Error);
    }
}

// Issue 21's must-show 2 on the CPU, as exact state checks: drafts that always agree (the
// target's own greedy tokens: every one accepted, K + 1 tokens a step), random drafts, and
// drafts right for j tokens then wrong leave the slot exactly as 1 + accepted plain decode steps
// do: the GDN conv and recurrent states bit for bit, n_past, and (through one more step from
// both) the KV rows.
TEST(Speculative, RollbackLeavesThePlainStepsStateBitForBit) {
    for (const GgmlType type : {GgmlType::F32, GgmlType::Q8_0}) {
        const ModelRunner& m = model("tiny", type);
        const int V = m.hparams().n_vocab;
        const std::vector<int32_t> prompt = ids(11, 77);
        const auto plain = run_alone(m, prompt, 8);  // plain.tokens[i]: the greedy token after i decode steps' inputs
        ForwardOptions fo;
        std::mt19937 rng(5);
        auto prefilled = [&](SlotStateCache& c) {
            std::vector<float> row(static_cast<size_t>(V));
            m.forward(c.state(), prompt.data(), int(prompt.size()), fo, row.data());
            return argmax(row.data(), V);
        };
        for (int k = 1; k < kMaxVerifyTokens; ++k)
            for (int kind = 0; kind < 3; ++kind)
                for (int j = 0; j < (kind == 2 ? k : 1); ++j) {
                    SCOPED_TRACE("type " + std::to_string(int(type)) + " K " + std::to_string(k) + " kind " +
                                 std::to_string(kind) + " j " + std::to_string(j));
                    SlotStateCache a(m, 1, 256), b(m, 1, 256);
                    const int32_t next = prefilled(a);
                    ASSERT_EQ(prefilled(b), next);
                    // plain.tokens[0] is `next`; the drafts after it are plain.tokens[1..].
                    std::vector<int32_t> drafts(plain.tokens.begin() + 1, plain.tokens.begin() + 1 + k);
                    if (kind == 1)
                        for (auto& d : drafts) d = int32_t(rng() % uint32_t(V));
                    if (kind == 2) drafts[size_t(j)] = (drafts[size_t(j)] + 1) % V;
                    const VerifyResult r = verify_greedy(m, a, 0, next, drafts, fo);
                    if (kind == 0) EXPECT_EQ(r.accepted, k);
                    if (kind == 2) EXPECT_EQ(r.accepted, j);
                    // The same tokens as plain steps, one at a time, in b.
                    ForwardOptions serial = fo;
                    serial.gdn_mode = ref::GdnMode::Serial;
                    std::vector<int32_t> fed = {next};
                    fed.insert(fed.end(), drafts.begin(), drafts.begin() + r.accepted);
                    std::vector<float> row(static_cast<size_t>(V));
                    for (const int32_t t : fed) m.forward(b.state(), &t, 1, serial, row.data());
                    ASSERT_EQ(a.n_past(0), b.n_past(0));
                    const StateSnapshot sa = a.snapshot(0), sb = b.snapshot(0);
                    ASSERT_EQ(sa.ssm_state.size(), sb.ssm_state.size());
                    for (size_t l = 0; l < sa.ssm_state.size(); ++l) {
                        ASSERT_EQ(sa.ssm_state[l], sb.ssm_state[l]) << "layer " << l << " recurrent state";
                        ASSERT_EQ(sa.conv_state[l], sb.conv_state[l]) << "layer " << l << " conv state";
                    }
                    // One more step from both: equal logits say the KV rows agree too.
                    const int32_t t = r.tokens.back();
                    std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
                    m.forward(a.state(), &t, 1, serial, la.data());
                    m.forward(b.state(), &t, 1, serial, lb.data());
                    EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4));
                    EXPECT_EQ(r.tokens.back(), plain.tokens[size_t(r.accepted) + 1]);
                }
    }
}

// Rollback without the re-run (runtime/gdn_replay.h): a verification step of two slots logs every
// GDN op's inputs; rolling both back (one keeps only its sampled token, the other two tokens)
// replays the GDN ops alone and leaves the same states, n_past and next logits, bit for bit,
// as the re-run of the kept tokens (the log refused, through the ids check, for a third cache
// whose step it does not hold).
TEST(Speculative, RollbackReplaysTheLoggedGdnOpsAsTheRerunWould) {
    for (const GgmlType type : {GgmlType::F32, GgmlType::Q8_0}) {
        SCOPED_TRACE("type " + std::to_string(int(type)));
        const ModelRunner& m = model("tiny", type);
        const int V = m.hparams().n_vocab;
        const std::vector<int32_t> p0 = ids(9, 41), p1 = ids(14, 42);
        ForwardOptions fo;
        auto prefilled = [&](SlotStateCache& c) {
            std::vector<float> row(static_cast<size_t>(V));
            m.forward(c.state(), p0.data(), int(p0.size()), fo, row.data(), nullptr, 0);
            m.forward(c.state(), p1.data(), int(p1.size()), fo, row.data(), nullptr, 1);
        };
        SlotStateCache replayed(m, 2, 128), rerun(m, 2, 128);
        prefilled(replayed);
        prefilled(rerun);
        const std::vector<int32_t> s0 = {5, 6, 7, 8}, s1 = {9, 10, 11};  // fed: next + drafts
        ForwardOptions serial = fo;
        serial.gdn_mode = ref::GdnMode::Serial;
        GdnReplayLog log;
        std::vector<StateSnapshot> before;
        for (SlotStateCache* c : {&replayed, &rerun}) {
            before.push_back(c->snapshot(0));
            before.push_back(c->snapshot(1));
            Batch step;
            step.add(0, s0.data(), int(s0.size()), BatchLogits::All, true);
            step.add(1, s1.data(), int(s1.size()), BatchLogits::All, true);
            ForwardOptions o = serial;
            if (c == &replayed) o.gdn_log = &log;
            std::vector<float> rows(7 * static_cast<size_t>(V));
            m.forward(c->state(), step, o, rows.data());
        }
        ASSERT_TRUE(log.valid);
        ASSERT_FALSE(log.layers.empty());
        const std::vector<int32_t> k0 = {5}, k1 = {9, 10};
        EXPECT_EQ(log.usable(0, before[0].n_past, k0), 0);
        EXPECT_EQ(log.usable(1, before[1].n_past, k1), 1);
        EXPECT_EQ(log.usable(1, before[1].n_past, {9, 11}), -1);      // not the step's tokens
        EXPECT_EQ(log.usable(1, before[1].n_past + 1, k1), -1);       // not the step's state
        roll_back(m, replayed, {{0, &before[0], k0}, {1, &before[1], k1}}, serial, &log);
        roll_back(m, rerun, {{0, &before[2], k0}, {1, &before[3], k1}}, serial, nullptr);
        for (int slot = 0; slot < 2; ++slot) {
            ASSERT_EQ(replayed.n_past(slot), rerun.n_past(slot));
            const StateSnapshot a = replayed.snapshot(slot), b = rerun.snapshot(slot);
            for (size_t l = 0; l < a.ssm_state.size(); ++l) {
                ASSERT_EQ(a.ssm_state[l], b.ssm_state[l]) << "slot " << slot << " layer " << l;
                ASSERT_EQ(a.conv_state[l], b.conv_state[l]) << "slot " << slot << " layer " << l;
            }
            const int32_t t = 12;
            std::vector<float> la(static_cast<size_t>(V)), lb(static_cast<size_t>(V));
            m.forward(replayed.state(), &t, 1, serial, la.data(), nullptr, slot);
            m.forward(rerun.state(), &t, 1, serial, lb.data(), nullptr, slot);
            EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * 4)) << "slot " << slot;
        }
    }
}

// The sampled acceptance rule (accept_sampled) keeps the sampler's distribution: over 200,000
// seeded trials on three synthetic rows (top-k, top-p, min-p and temperature all cutting), the
// emitted prefix [t1, t2, t3] has plain sampling's probabilities p0(t1), p0(d1) p1(t2),
// p0(d1) p1(d2) p2(t3), each frequency within 5 sigma; a draft outside the candidates is never
// kept (t1 ~ p0); a greedy sampler gives accept_greedy's count and token.
TEST(Speculative, SampledAcceptanceKeepsTheSamplersDistribution) {
    constexpr int V = 12;
    std::mt19937 rng(17);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    std::vector<float> rows(3 * V);
    for (float& x : rows) x = nd(rng);
    SamplerParams sp;
    sp.temp = 0.9f, sp.top_k = 7, sp.top_p = 0.9f, sp.min_p = 0.03f, sp.seed = 7;
    Sampler exact(sp);
    std::vector<std::vector<int32_t>> ids(3);
    std::vector<std::vector<double>> probs(3);
    for (int r = 0; r < 3; ++r) exact.distribution(rows.data() + r * V, V, ids[size_t(r)], probs[size_t(r)]);
    auto p = [&](int r, int32_t id) {
        for (size_t i = 0; i < ids[size_t(r)].size(); ++i)
            if (ids[size_t(r)][i] == id) return probs[size_t(r)][i];
        return 0.0;
    };
    ASSERT_GE(ids[0].size(), 3u);  // the cuts leave a real choice
    ASSERT_GE(ids[1].size(), 2u);
    // d1 the second most likely of row 0, d2 the most likely of row 1.
    const std::vector<int32_t> drafts = {ids[0][1], ids[1][0]};
    constexpr int N = 200000;
    std::map<std::pair<int, int32_t>, int> seen;  // (accepted, next) -> count
    Sampler s(sp);
    for (int i = 0; i < N; ++i) {
        const SampledAccept a = accept_sampled(s, rows.data(), V, drafts);
        ++seen[{a.accepted, a.next}];
    }
    auto check = [&](double want, int got, const std::string& what) {
        const double f = double(got) / N, sigma = std::sqrt(std::max(want * (1 - want), 1e-12) / N);
        EXPECT_LE(std::fabs(f - want), 5 * sigma + 1e-4) << what << ": frequency " << f << ", plain sampling " << want;
    };
    double total = 0;
    for (int32_t x = 0; x < V; ++x) {
        const double e0 = x == drafts[0] ? 0.0 : p(0, x), e1 = x == drafts[1] ? 0.0 : p(0, drafts[0]) * p(1, x);
        const double e2 = p(0, drafts[0]) * p(1, drafts[1]) * p(2, x);
        check(e0, seen[{0, x}], "t1 = " + std::to_string(x));
        check(e1, seen[{1, x}], "t1 = d1, t2 = " + std::to_string(x));
        check(e2, seen[{2, x}], "t1 = d1, t2 = d2, t3 = " + std::to_string(x));
        total += e0 + e1 + e2;
    }
    EXPECT_NEAR(total, 1.0, 1e-9);
    // A draft the cuts exclude is never kept: t1 ~ p0.
    int32_t outside = 0;
    while (p(0, outside) > 0) ++outside;
    std::map<int32_t, int> first;
    for (int i = 0; i < N / 4; ++i) {
        const SampledAccept a = accept_sampled(s, rows.data(), V, {outside});
        ASSERT_EQ(a.accepted, 0);
        ++first[a.next];
    }
    for (int32_t x = 0; x < V; ++x) {
        const double f = double(first[x]) / (N / 4), want = p(0, x);
        EXPECT_LE(std::fabs(f - want), 5 * std::sqrt(std::max(want * (1 - want), 1e-12) / (N / 4)) + 1e-4) << "t1 = " << x;
    }
    // Greedy: accept_greedy's rule.
    SamplerParams gp;
    gp.temp = 0;
    Sampler g(gp);
    int32_t greedy[3];
    for (int r = 0; r < 3; ++r) greedy[r] = greedy_token(rows.data() + r * V, V);
    for (const std::vector<int32_t>& d : {std::vector<int32_t>{greedy[0], greedy[1]}, std::vector<int32_t>{greedy[0], 3},
                                          std::vector<int32_t>{(greedy[0] + 1) % V, greedy[1]}}) {
        const SampledAccept a = accept_sampled(g, rows.data(), V, d);
        const int want = accept_greedy(greedy, d);
        EXPECT_EQ(a.accepted, want);
        EXPECT_EQ(a.next, greedy[want]);
    }
}

TEST(Speculative, NgramDrafterLooksUpThePrompt) {
    const NgramDrafter d;
    EXPECT_EQ(d.draft({1, 2, 3, 4, 5, 1, 2, 3}, 3), (std::vector<int32_t>{4, 5, 1}));
    EXPECT_EQ(d.draft({1, 2, 3, 4, 5, 1, 2, 3}, 10), (std::vector<int32_t>{4, 5, 1, 2, 3}));
    EXPECT_EQ(d.draft({1, 2, 9, 2}, 3), (std::vector<int32_t>{9, 2}));  // only the last token matches
    EXPECT_EQ(d.draft({4, 1, 4, 2, 4}, 1), (std::vector<int32_t>{2}));  // the latest occurrence
    EXPECT_TRUE(d.draft({7, 8, 9}, 3).empty());
    EXPECT_TRUE(d.draft({}, 3).empty());
}

// The engine's incremental index answers as the scan does, call after call as a history grows
// (small vocabularies: many repeats; every rule the drafter takes), and starts over on a
// shorter history.
TEST(Speculative, NgramIndexAnswersAsTheScan) {
    std::mt19937 rng(7);
    for (const auto& [n_min, n_max] : std::vector<std::pair<int, int>>{{1, 3}, {2, 3}, {1, 1}, {2, 4}})
        for (int vocab : {2, 5, 40}) {
            const NgramDrafter rule{n_min, n_max};
            NgramIndex index(rule);
            std::vector<int32_t> h;
            for (int step = 0; step < 400; ++step) {
                const int grow = int(rng() % 3);  // 0..2 tokens between calls (accepted runs)
                for (int i = 0; i < grow; ++i) h.push_back(int32_t(rng() % uint32_t(vocab)));
                const int k = 1 + int(rng() % 4);
                ASSERT_EQ(index.draft(h, k), rule.draft(h, k)) << "n " << n_min << ".." << n_max << ", vocab " << vocab
                                                               << ", length " << h.size();
            }
            h.resize(h.size() / 2);
            EXPECT_EQ(index.draft(h, 3), rule.draft(h, 3)) << "after the history shrank";
        }
    EXPECT_THROW(NgramIndex(NgramDrafter{1, NgramDrafter::kMaxN + 1}), Error);
}
}  // namespace
}  // namespace alloy
