// The `alloy` binary as a user meets it: bad input must give a clear message naming what was
// wrong and a non-zero exit, never a crash; good input must give the oracle's answers.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "model/convert_qwen35.h"
#include "tests/logits_error.h"

namespace alloy {
namespace {

namespace fs = std::filesystem;

struct Result {
    int code = -1;        // exit code; -1 if killed by a signal
    std::string output;   // stdout + stderr
};

// env: variable assignments for the command ("NAME=value "), or empty.
Result run(const std::string& args, bool with_stderr = true, const std::string& env = "") {
    const std::string cmd = env + std::string(ALLOY_BINARY) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
    const int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

class Cli : public ::testing::Test {
protected:
    static fs::path dir;
    static std::string model;  // r2_untied converted to f32
    static void SetUpTestSuite() {
        dir = fs::temp_directory_path() / ("alloy_cli_" + std::to_string(::getpid()));
        fs::create_directories(dir);
        model = (dir / "r2.gguf").string();
        ConvertOptions opt;
        opt.hf_dir = std::string(ALLOY_SOURCE_DIR) + "/tests/fixtures/r2_untied";
        opt.out_path = model;
        opt.dtype = GgmlType::F32;
        convert_hf_qwen35(opt);
    }
    static void TearDownTestSuite() { fs::remove_all(dir); }

    // Rewrites `model` with an edit applied: metadata and tensor list can be changed.
    static std::string rewrite(const std::string& name,
                               const std::function<void(gguf::Writer&, std::vector<gguf::TensorInfo>&)>& edit) {
        auto f = gguf::File::open(model);
        gguf::Writer w;
        for (const auto& [k, v] : f->metadata()) w.set(k, v);
        std::vector<gguf::TensorInfo> tensors = f->tensors();
        edit(w, tensors);
        for (const auto& t : tensors)
            w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
        const std::string out = (dir / name).string();
        w.write(out);
        return out;
    }

    static void expect_error(const Result& r, const std::string& needle) {
        EXPECT_NE(r.code, 0) << r.output;
        EXPECT_NE(r.code, -1) << "crashed: " << r.output;
        EXPECT_NE(r.output.find(needle), std::string::npos) << "message lacks '" << needle << "': " << r.output;
    }
};
fs::path Cli::dir;
std::string Cli::model;

TEST_F(Cli, GreedyRunMatchesTransformers) {
    auto ref = nlohmann::json::parse(std::ifstream(std::string(ALLOY_SOURCE_DIR) + "/tests/fixtures/r2_untied/reference.json"));
    std::string prompt, want;
    for (int id : ref["greedy"][0]["prompt"]) prompt += std::to_string(id) + " ";
    for (int id : ref["greedy"][0]["generated"]) want += (want.empty() ? "" : " ") + std::to_string(id);
    // transformers keeps K/V in fp32: the exact comparison runs with an fp32 KV cache (both
    // spellings of the flags). The default f16 cache moves these logits by ~1e-4 relative
    // (tests/model/test_hf_fixtures.cpp), which flips no greedy choice here: checked too.
    for (const char* cache : {"-ctk f32 -ctv f32", "--cache-type-k=f32 --cache-type-v f32", ""})
        for (const char* gdn : {"serial", "chunked"}) {
            Result r = run("run -m " + model + " --ids \"" + prompt + "\" -n 12 --temp 0 --print-ids --gdn " + gdn +
                               " " + cache,
                           false);
            ASSERT_EQ(r.code, 0) << r.output;
            EXPECT_EQ(r.output.substr(0, r.output.find('\n')), want) << gdn << " " << cache;
        }
}

// --spec ngram (issue 21): greedy ids are plain decode's (the oracle's here), the timing line
// says how many drafts were accepted (sampled runs too), and bad values name their flag before
// the model loads.
TEST_F(Cli, SpeculativeRunGivesTheSameTokens) {
    auto ref = nlohmann::json::parse(std::ifstream(std::string(ALLOY_SOURCE_DIR) + "/tests/fixtures/r2_untied/reference.json"));
    std::string prompt, want;
    for (int id : ref["greedy"][0]["prompt"]) prompt += std::to_string(id) + " ";
    for (int id : ref["greedy"][0]["generated"]) want += (want.empty() ? "" : " ") + std::to_string(id);
    for (const char* k : {"1", "3"}) {
        const std::string args = "run -m " + model + " --ids \"" + prompt +
                                 "\" -n 12 --temp 0 --print-ids -ctk f32 -ctv f32 --spec ngram --spec-k " + k;
        Result ids = run(args, false), timing = run(args);  // stdout alone; then with stderr
        ASSERT_EQ(ids.code, 0) << ids.output;
        EXPECT_EQ(ids.output.substr(0, ids.output.find('\n')), want) << "--spec-k " << k;
        EXPECT_NE(timing.output.find("; spec ngram: "), std::string::npos) << timing.output;
        EXPECT_NE(timing.output.find(" drafts accepted ("), std::string::npos) << timing.output;
    }
    Result sampled = run("run -m " + model + " --ids \"" + prompt + "\" -n 4 --temp 0.8 --print-ids --spec ngram");
    ASSERT_EQ(sampled.code, 0) << sampled.output;
    EXPECT_NE(sampled.output.find(" drafts accepted ("), std::string::npos) << sampled.output;  // sampling speculates too
    expect_error(run("run -m " + model + " --ids 1 --spec medusa"), "--spec");
    expect_error(run("run -m " + model + " --ids 1 --spec mtp"), "MTP block");  // this model has none
    expect_error(run("run -m " + model + " --ids 1 --spec ngram --spec-k 4"), "--spec-k");
    expect_error(run("run -m " + model + " --ids 1 --spec ngram --spec-k 0"), "--spec-k");
    expect_error(run("serve -m " + model + " --spec-k 9"), "--spec-k");
}

// bench --spec on the default model (trained: prompt lookup finds drafts in its Bible text):
// the table has a row per K with accepted drafts and tokens equal to plain decode's; bad
// options name their flag.
TEST_F(Cli, BenchSpecReportsAcceptanceAndExactness) {
    std::ifstream in(std::string(ALLOY_SOURCE_DIR) + "/testdata/default-model/heldout.txt", std::ios::binary);
    std::string text(1500, '\0');
    in.read(text.data(), std::streamsize(text.size()));
    const std::string prompt = (dir / "spec_prompt.txt").string();
    std::ofstream(prompt, std::ios::binary) << text;
    Result r = run("bench --spec ngram --spec-k 1,3 --spec-prompt " + prompt + " -n 24 -r 2 -t 2");
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* row : {"| off | 0 | tg24 |", "| ngram | 1 | tg24 |", "| ngram | 3 | tg24 |"})
        EXPECT_NE(r.output.find(row), std::string::npos) << row << "\n" << r.output;
    EXPECT_EQ(r.output.find("| NO |"), std::string::npos) << r.output;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)  // each drafting row kept some drafts
        if (line.rfind("| ngram", 0) == 0) EXPECT_EQ(line.find("| 0 of "), std::string::npos) << line;
    expect_error(run("bench --spec medusa --spec-prompt " + prompt + " -n 8 -r 2"), "--spec");
    expect_error(run("bench --spec ngram --spec-k 5 --spec-prompt " + prompt + " -n 8 -r 2"), "--spec-k");
    expect_error(run("bench --spec ngram -n 8 -r 2"), "--spec-prompt");
    expect_error(run("bench --spec ngram --spec-prompt " + (dir / "missing.txt").string() + " -n 8 -r 2"), "missing.txt");
}

// Logits of every position against transformers: 1e-4 relative with an fp32 cache, 1e-3 with
// the default f16 one (measured 1.2e-4 on this fixture; see test_hf_fixtures.cpp), 5e-3 with a
// bf16 one (measured 8.4e-4: 3 fewer mantissa bits than f16).
TEST_F(Cli, LogitsMatchTransformersWithEitherCache) {
    auto ref = nlohmann::json::parse(std::ifstream(std::string(ALLOY_SOURCE_DIR) + "/tests/fixtures/r2_untied/reference.json"));
    const auto& seq = ref["sequences"][0];
    std::string ids;
    for (int id : seq["ids"]) ids += std::to_string(id) + " ";
    std::ifstream in(std::string(ALLOY_SOURCE_DIR) + "/tests/fixtures/r2_untied/" + seq["file"].get<std::string>(),
                     std::ios::binary | std::ios::ate);
    std::vector<float> want(size_t(in.tellg()) / 4);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(want.data()), std::streamsize(want.size() * 4));
    const size_t V = ref["vocab"].get<size_t>();
    // --mmap: the weights used through the file mapping instead of read into memory.
    for (auto [cache, tol] : {std::pair{"-ctk f32 -ctv f32", 1e-4}, std::pair{"", 1e-3}, std::pair{"--mmap -ctk f32 -ctv f32", 1e-4},
                              std::pair{"-ctk bf16 -ctv bf16", 5e-3}}) {
        const std::string out = (dir / "lt.f32").string();
        Result r = run("logits -m " + model + " --ids \"" + ids + "\" -o " + out + " " + cache);
        ASSERT_EQ(r.code, 0) << r.output;
        std::ifstream f(out, std::ios::binary);
        std::vector<float> got(want.size());
        f.read(reinterpret_cast<char*>(got.data()), std::streamsize(got.size() * 4));
        ASSERT_TRUE(f.good()) << out;
        EXPECT_LT(test::max_row_rel_error(got, want, V), tol) << "cache flags '" << cache << "'";
    }
}

// -ctk/-ctv accept f32, f16 and bf16 only; anything else names the flag and the value.
TEST_F(Cli, BadCacheType) {
    expect_error(run("logits -m " + model + " --ids 1 -o /dev/null -ctk q4_0"),
                 "-ctk/--cache-type-k must be f32, f16 or bf16, got 'q4_0'");
    expect_error(run("run -m " + model + " --ids 1 -n 1 -ctv q8_0"), "-ctv/--cache-type-v must be f32, f16 or bf16, got 'q8_0'");
    expect_error(run("run -m " + model + " --ids 1 -n 1 --cache-type-k F16"), "'F16'");
    expect_error(run("profile -m " + model + " -p 4 -ctk q8_0"), "-ctk");
    expect_error(run("bench -m " + model + " -p 4 -n 0 -r 2 -ctk f16,q8_0"), "'q8_0'");
    expect_error(run("perplexity -m " + model + " -f /dev/null -ctv x"), "-ctv");
    expect_error(run("logits -m " + model + " --ids 1 -o /dev/null -ctk"), "cache-type-k");  // value missing
}

TEST_F(Cli, LogitsFileHasEveryPosition) {
    const std::string out = (dir / "l.f32").string();
    Result r = run("logits -m " + model + " --ids \"1 2 3 4 5\" -o " + out + " --decode");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(fs::file_size(out), size_t(5 * 384 * 4));
}

// --dump: the graph's names listed; a dumped tensor in its own file, [positions, cols]; a name
// the forward does not have refused by name.
TEST_F(Cli, LogitsDumpsNamedTensors) {
    Result list = run("logits -m " + model + " --dump list", false);
    ASSERT_EQ(list.code, 0) << list.output;
    EXPECT_NE(list.output.find("blk.0.gdn  gdn_fused"), std::string::npos) << list.output;
    EXPECT_NE(list.output.find(" hf [T, "), std::string::npos) << list.output;
    const std::string out = (dir / "dump.f32").string();
    Result r = run("logits -m " + model + " --ids \"1 2 3 4 5\" -o " + out + " --dump blk.0.x --dump hf");
    ASSERT_EQ(r.code, 0) << r.output;
    for (const char* name : {"blk.0.x", "hf"}) {
        const auto path = out + "." + name + ".f32";
        ASSERT_TRUE(fs::exists(path)) << path;
        EXPECT_EQ(fs::file_size(path) % (5 * 4), 0u) << path;
        EXPECT_GT(fs::file_size(path), 0u) << path;
    }
    expect_error(run("logits -m " + model + " --ids 1 -o " + out + " --dump blk.0.nothing"), "'blk.0.nothing'");
    expect_error(run("logits -m " + model + " --dump hf"), "--ids");
}

TEST_F(Cli, UnknownFlag) { expect_error(run("run -m " + model + " --bogus-flag 3"), "bogus-flag"); }
TEST_F(Cli, UnknownSubcommand) { EXPECT_NE(run("frobnicate").code, 0); }
TEST_F(Cli, MissingModelFile) { expect_error(run("logits -m /nonexistent.gguf --ids 1 -o /dev/null"), "/nonexistent.gguf"); }
// -m by name: NAME.gguf in $ALLOY_MODELS runs as its path does (the same logits bytes); an
// unknown name is refused, listing the names the folder holds; a path still works, a missing
// path is still named as a file.
TEST_F(Cli, ModelsByName) {
    const fs::path models = dir / "models";
    fs::create_directories(models);
    fs::copy_file(model, models / "qwen3.5-test.gguf", fs::copy_options::overwrite_existing);
    std::ofstream(models / "other.gguf") << "x";
    const std::string env = "ALLOY_MODELS=" + models.string() + " ";
    const std::string by_path = (dir / "by_path.f32").string(), by_name = (dir / "by_name.f32").string();
    ASSERT_EQ(run("logits -m " + model + " --ids \"1 2 3\" -o " + by_path).code, 0);
    Result r = run("logits -m qwen3.5-test --ids \"1 2 3\" -o " + by_name, true, env);
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_GT(fs::file_size(by_name), 0u);
    std::ifstream a(by_path, std::ios::binary), b(by_name, std::ios::binary);
    EXPECT_TRUE(std::equal(std::istreambuf_iterator<char>(a), {}, std::istreambuf_iterator<char>(b), {}))
        << "the name ran another model";
    Result unknown = run("run -m qwen3.5-9b -p hi -n 1", true, env);
    EXPECT_NE(unknown.code, 0);
    EXPECT_NE(unknown.output.find("qwen3.5-9b"), std::string::npos) << unknown.output;
    EXPECT_NE(unknown.output.find(models.string()), std::string::npos) << unknown.output;
    EXPECT_NE(unknown.output.find("other, qwen3.5-test"), std::string::npos) << "the names there: " << unknown.output;
    Result none = run("bench -m qwen3.5-9b -p 8 -n 0 -r 2", true, "ALLOY_MODELS=" + (dir / "no_such_dir").string() + " ");
    EXPECT_NE(none.code, 0);
    EXPECT_NE(none.output.find("does not exist"), std::string::npos) << none.output;
    // tokenize resolves the name too (this file has no tokenizer: the error names the file found).
    Result tok = run("tokenize -m qwen3.5-test < /dev/null", true, env);
    EXPECT_NE(tok.output.find((models / "qwen3.5-test.gguf").string()), std::string::npos) << tok.output;
    expect_error(run("logits -m /nonexistent/qwen3.5-test --ids 1 -o /dev/null"), "/nonexistent/qwen3.5-test");
}

TEST_F(Cli, BadGdnMode) { expect_error(run("logits -m " + model + " --ids 1 -o /dev/null --gdn fast"), "--gdn"); }
TEST_F(Cli, BadTokenIdText) { expect_error(run("logits -m " + model + " --ids \"1 x2 3\" -o /dev/null"), "x2"); }
TEST_F(Cli, TokenIdOutsideVocabulary) { expect_error(run("logits -m " + model + " --ids \"1 384\" -o /dev/null"), "384"); }

TEST_F(Cli, PromptLongerThanContext) {
    expect_error(run("run -m " + model + " --ids \"1 2 3 4 5 6 7 8 9 10\" -n 2 --ctx 8"), "context");
    expect_error(run("logits -m " + model + " --ids \"1 2 3 4 5 6 7 8 9 10\" --ctx 8 -o /dev/null"), "context");
}

TEST_F(Cli, WrongArchitecture) {
    const std::string f = rewrite("arch.gguf", [](gguf::Writer& w, auto&) {
        w.set("general.architecture", gguf::Value::str("llama"));
    });
    expect_error(run("logits -m " + f + " --ids 1 -o /dev/null"), "llama");
}

TEST_F(Cli, MissingTensor) {
    const std::string f = rewrite("missing.gguf", [](gguf::Writer&, std::vector<gguf::TensorInfo>& t) {
        std::erase_if(t, [](const auto& x) { return x.name == "blk.1.ssm_a"; });
    });
    expect_error(run("logits -m " + f + " --ids 1 -o /dev/null"), "blk.1.ssm_a");
}

TEST_F(Cli, TensorWithWrongShape) {
    const std::string f = rewrite("shape.gguf", [](gguf::Writer&, std::vector<gguf::TensorInfo>& t) {
        for (auto& x : t)
            if (x.name == "blk.0.ssm_norm.weight") { x.ne = {16}; x.nbytes = 64; }
    });
    expect_error(run("logits -m " + f + " --ids 1 -o /dev/null"), "blk.0.ssm_norm.weight");
}

TEST_F(Cli, MissingHyperparameter) {
    // Rebuild the file without one required key.
    auto f = gguf::File::open(model);
    gguf::Writer w;
    for (const auto& [k, v] : f->metadata())
        if (k != "qwen35.ssm.state_size") w.set(k, v);
    for (const auto& t : f->tensors()) w.add_tensor(t.name, t.type, t.ne, std::vector<uint8_t>(t.data, t.data + t.nbytes));
    const std::string out = (dir / "nokey.gguf").string();
    w.write(out);
    expect_error(run("logits -m " + out + " --ids 1 -o /dev/null"), "qwen35.ssm.state_size");
}

TEST_F(Cli, TruncatedModelFile) {
    const std::string out = (dir / "trunc.gguf").string();
    fs::copy_file(model, out);
    fs::resize_file(out, fs::file_size(out) / 2);
    Result r = run("logits -m " + out + " --ids 1 -o /dev/null");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.code, -1) << r.output;
    EXPECT_NE(r.output.find("trunc.gguf"), std::string::npos) << r.output;
}

TEST_F(Cli, NotAGgufFile) {
    const std::string out = (dir / "text.gguf").string();
    std::ofstream(out) << "this is not a model";
    expect_error(run("logits -m " + out + " --ids 1 -o /dev/null"), "text.gguf");
}

TEST_F(Cli, ConvertRejectsBrokenCheckpoint) {
    const fs::path hf = dir / "hf_broken";
    fs::create_directories(hf);
    std::ofstream(hf / "config.json") << "{ \"text_config\": { \"vocab_size\": 10 ";
    expect_error(run("convert " + hf.string() + " -o " + (dir / "x.gguf").string()), "config.json");
    std::ofstream(hf / "config.json") << "{\"vocab_size\": 10}";
    expect_error(run("convert " + hf.string() + " -o " + (dir / "x.gguf").string()), "hidden_size");
}

}  // namespace
}  // namespace alloy

namespace alloy {
namespace {

TEST_F(Cli, BenchJsonUsesLlamaBenchFields) {
    Result r = run("bench -m " + model + " -p 16 -n 4 -d 0,8 -r 3 -o json", false);
    ASSERT_EQ(r.code, 0) << r.output;
    auto j = nlohmann::json::parse(r.output);
    ASSERT_EQ(j.size(), 4u);  // pp16, tg4 at depth 0 and 8
    for (const auto& t : j) {
        for (const char* f : {"n_prompt", "n_gen", "n_depth", "n_threads", "avg_ts", "stddev_ts", "samples_ts",
                              "samples_ns", "avg_ns", "model_size", "model_n_params", "cold_ts", "median_ts"})
            EXPECT_TRUE(t.contains(f)) << f;
        EXPECT_EQ(t["samples_ts"].size(), 2u);  // the cold repetition is reported apart
        EXPECT_GT(t["avg_ts"].get<double>(), 0);
        // Alloy's additions: the pool's per-region cost (and OpenMP's, for comparison); for
        // decode tests the bandwidth probe and the bytes per token it is compared with.
        EXPECT_GE(t["pool_region_us"].get<double>(), 0.0);
        EXPECT_GT(t["omp_region_us"].get<double>(), 0.0);
        if (t["n_gen"].get<int>() > 0) {
            // The test model's weights fit in the caches (under 128 MB): no bandwidth probe (it
            // would measure the caches), only the bytes per token.
            EXPECT_FALSE(t.contains("read_bw_probe_gbs"));
            EXPECT_GT(t["decode_bytes_per_token"].get<double>(), 0.0);
        }
    }
    EXPECT_EQ(j[1]["n_gen"], 4);
    EXPECT_EQ(j[3]["n_depth"], 8);
    EXPECT_EQ(j[0]["type_k"], "f16");  // llama.cpp's default KV cache
    EXPECT_EQ(j[0]["use_mmap"], false);  // weights read into memory (llama-bench -mmp 0)
    EXPECT_EQ(j[0]["type_v"], "f16");

    // Cache types are lists as in llama-bench: one test per (type_k, type_v) pair.
    Result r2 = run("bench -m " + model + " -p 16 -n 0 -r 2 -ctk f32,f16 -ctv f32 -o json", false);
    ASSERT_EQ(r2.code, 0) << r2.output;
    auto j2 = nlohmann::json::parse(r2.output);
    ASSERT_EQ(j2.size(), 2u);
    EXPECT_EQ(j2[0]["type_k"], "f32");
    EXPECT_EQ(j2[1]["type_k"], "f16");
    EXPECT_EQ(j2[1]["type_v"], "f32");
}

// --interleave runs repetition r of every test before repetition r + 1 of any (A/B arms on
// a drifting host); run_order records where each repetition ran.
TEST_F(Cli, BenchInterleavesRepetitions) {
    for (bool inter : {false, true}) {
        Result r = run("bench -m " + model + " -p 16 -n 0 -r 3 --gdn chunked,serial -o json" +
                           std::string(inter ? " --interleave" : ""), false);
        ASSERT_EQ(r.code, 0) << r.output;
        auto j = nlohmann::json::parse(r.output);
        ASSERT_EQ(j.size(), 2u);
        EXPECT_EQ(j[0]["gdn"], "chunked");
        EXPECT_EQ(j[1]["gdn"], "serial");
        EXPECT_EQ(j[0]["samples_ns"].size(), 2u);
        EXPECT_EQ(j[0]["cold_run_order"], 0);
        EXPECT_EQ(j[1]["cold_run_order"], inter ? 1 : 3) << inter;
        EXPECT_EQ(j[0]["run_order"], inter ? nlohmann::json({2, 4}) : nlohmann::json({1, 2})) << inter;
        EXPECT_EQ(j[1]["run_order"], inter ? nlohmann::json({3, 5}) : nlohmann::json({4, 5})) << inter;
    }
}

TEST_F(Cli, BenchRejectsBadLists) {
    expect_error(run("bench -m " + model + " -p 16,x"), "-p");
    expect_error(run("bench -m " + model + " -r 1"), "-r");
    expect_error(run("bench -m " + model + " --gdn fast"), "--gdn");
}

TEST_F(Cli, ProfileTableAndTrace) {
    const std::string trace = (dir / "trace.json").string();
    Result r = run("profile -m " + model + " -p 70 --trace " + trace, false);
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("| gdn_fused_chunked |"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("| gdn_fused_serial |"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("bucket 128"), std::string::npos) << r.output;
    Result pieces = run("profile -m " + model + " -p 200 -b 64", false);
    ASSERT_EQ(pieces.code, 0) << pieces.output;
    EXPECT_NE(pieces.output.find("bucket 64"), std::string::npos) << pieces.output;
    auto j = nlohmann::json::parse(std::ifstream(trace));
    EXPECT_GT(j["traceEvents"].size(), 20u);
    // -n N profiles N decode steps: every decode kernel is called N times as often.
    Result steps = run("profile -m " + model + " -p 16 -n 5", false);
    ASSERT_EQ(steps.code, 0) << steps.output;
    EXPECT_NE(steps.output.find("5 decode steps from position 16"), std::string::npos) << steps.output;
    EXPECT_NE(steps.output.find("| embed | 5 |"), std::string::npos) << steps.output;
    expect_error(run("profile -m " + model + " -p 16 -n 0"), "-n");
}

}  // namespace
}  // namespace alloy
