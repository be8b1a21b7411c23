// The engine: one model, its state slots and a scheduler thread that serves many generation
// requests at once (continuous batching). This is the API the front ends use (cli/run, server/):
// no kernel, model or tensor types.
//
//   request -> Engine::submit -> scheduler (one thread owns the model and the slots):
//     each step: new requests take free slots; one Batch = one token of every decoding request,
//     or the next prompt piece (<= batch_size tokens) of the oldest prefilling one -> the
//     model's forward -> a logits row per request that needs one -> its sampler -> the token
//     streams back (on_token, on_text); finished or cancelled requests leave at once.
//
// Every request starts from an empty sequence (no prompt cache yet). With up to 16 requests at
// once, a request's tokens are bit for bit those it would get alone (runtime/engine.cpp says
// why and what breaks it past 16).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace alloy {

// The default model: a tiny Qwen3.5 trained on the King James Bible (share/alloy/ beside the
// binary or in its install prefix); a binary copied alone falls back to a random-weight one
// written to $ALLOY_HOME or ~/.cache/alloy (no download). Returns its path.
std::string default_model_path();

struct EngineOptions {
    std::string model_path;            // GGUF file; empty: the embedded default model
    int n_parallel = 4;                // requests served at once (state slots), llama-server's --parallel
    int n_ctx = 4096;                  // context of each request: prompt + generated tokens
    int threads = 0;                   // 0: every core
    int batch_size = 512;              // most prompt tokens per step (a multiple of gdn_chunk)
    std::string gdn = "chunked";       // prompt GDN kernel: chunked | serial (decode is always serial)
    int gdn_chunk = 64;
    std::string cache_type_k = "f16";  // f32 | f16 | bf16
    std::string cache_type_v = "f16";
    bool mmap = false;                 // use the file mapping instead of reading the weights in
    std::string backend = "cpu";       // where the model runs: cpu | cuda (a build with nvcc)
    int tensor_parallel = 1;           // ranks the model is split over (--tp): GPUs 0..N-1 with cuda
    bool expert_parallel = false;      // --ep: a MoE model's experts placed whole over those ranks
    // Hybrid prefix cache: checkpoints of the states at the end of every prompt and every
    // generation and every `checkpoint_every` prompt tokens, within cache_ram_mib MiB (0: off),
    // least recently used evicted. A request whose prompt starts with a checkpoint's tokens
    // resumes there (llama-server's --cache-ram). Prompts are cut into pieces at multiples of
    // checkpoint_every (>= 1) as well as of batch_size.
    int cache_ram_mib = 0;
    int checkpoint_every = 1024;
    // Speculative decoding (exact): "off", "ngram" (prompt lookup: drafts are the tokens that
    // followed the latest earlier occurrence of the context's last 1-3 tokens), "mtp" (the
    // model's MTP head, runtime/mtp_drafter.h: a model with the block) or "draft" (a separate
    // model with the same vocabulary, `draft_model`, greedy on a slot of its own per request).
    // A request without an output format then feeds its token and up to spec_k drafts (1..3) per
    // step: greedy requests keep each draft while it is the model's greedy token there, so their
    // tokens and logits are bit for bit plain decode's; sampled ones by the rejection-sampling
    // rule (plain sampling's distribution). How many drafts a step carries follows what they
    // measurably cost and gain (runtime/spec_policy.h): none where they do not pay.
    std::string spec = "off";
    std::string draft_model;  // with spec "draft": the draft model's GGUF file
    int spec_k = 1;  // the setting measured faster on the default model (bench/RESULTS.md: 2-3 pay the re-run)
};

// llama.cpp's sampling: greedy at temperature 0, else top-k -> top-p -> min-p -> temperature ->
// a draw seeded by `seed`.
struct SamplingOptions {
    float temperature = 0.8f;
    int top_k = 40;        // 0: off
    float top_p = 0.95f;   // 1: off
    float min_p = 0.05f;   // 0: off
    uint64_t seed = 0;
};

struct GenerationRequest {
    std::vector<int32_t> prompt;     // token ids
    int max_tokens = 64;             // < 0: up to the end of the context
    SamplingOptions sampling;
    std::vector<std::string> stop;   // the text ends before the first stop string
    bool ignore_eos = false;         // keep going past end-of-generation tokens
    bool text = true;                // detokenize (needs the model's tokenizer), else ids only
    // Prompt positions (ascending, in (0, prompt size)) where the prompt's pieces end and, with
    // the prefix cache on, checkpoints are taken: e.g. the end of each chat message, so the next
    // request that shares the system prompt or the earlier turns resumes there.
    std::vector<int> checkpoint_at;
    // Constrained output (the server's response_format). JsonObject: every sampled token keeps
    // the text a prefix of one JSON object (valid UTF-8, strings with escapes, numbers,
    // literals, nesting up to 32, at most 16 whitespace bytes in a row); the generation stops
    // ("stop") when the object closes, end-of-generation tokens are never sampled, and while
    // the object is open no token is taken that leaves more bytes to close it than tokens
    // remain of max_tokens, so the text parses as a JSON object whenever max_tokens allows the
    // shortest one ("{}"; a stop string or a cancel can still cut it). The sampler (temperature,
    // top-k, top-p, min-p) draws from the allowed tokens; logprobs stay the model's.
    // Needs the tokenizer (text).
    enum class Format { Text, JsonObject };
    Format format = Format::Text;
    // >= 0 with a Format: the constraint starts after this token is sampled (a reasoning
    // model's "</think>": the reasoning is free text, the answer JSON); -1: from the first token.
    int32_t format_after = -1;
    // >= 0: report each generated token's log-probability (GenerationResult::logprobs) with this
    // many most likely alternatives (at most kMaxTopLogprobs); -1: none (no extra work).
    int logprobs = -1;
};

constexpr int kMaxTopLogprobs = 20;

// A generated token's log-probability under the model: the log-softmax of its logits row,
// before the sampler's temperature and truncation (as vLLM reports them), and the `top` most
// likely tokens of that row, most likely first (ties: the lower id first).
struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0;
    std::vector<std::pair<int32_t, float>> top;
};

// log(sum_i exp(x_i)) over x [n] (n >= 1), in double after subtracting the largest: the
// log-softmax's normalizer (a token's log-probability is x[id] - log_sum_exp(x, n)).
double log_sum_exp(const float* x, int n);

struct GenerationResult {
    std::string text;                // generated text, stop string excluded
    std::vector<int32_t> ids;        // generated token ids, as sampled
    std::vector<TokenLogprob> logprobs;  // [ids] when the request asked for them, else empty
    int n_prompt = 0;
    int n_cached = 0;                // prompt tokens resumed from the prefix cache (not recomputed)
    // "stop" (end-of-generation token, stop string, or on_text returned false), "length",
    // "cancelled" (Engine::cancel) or "error" (then `error` says what failed).
    std::string finish_reason;
    std::string error;
    double queue_seconds = 0, prompt_seconds = 0, generate_seconds = 0;
    // Speculative decoding (EngineOptions::spec): drafts verified and drafts the verification
    // kept (a kept draft past a stop or max_tokens counts, though it is not emitted).
    int n_drafted = 0, n_accepted = 0;
    // Per draft position i (0 = the first draft after the sampled token): verifications that
    // drafted a token there, and those that kept it (bench --spec's acceptance by position).
    std::vector<int> drafted_at, accepted_at;
    int n_decode_steps = 0;  // steps that decoded this request (a verification counts once)
};

// Called on the engine's thread, in order; keep them short (the whole batch waits).
struct GenerationCallbacks {
    std::function<bool(const std::string& text)> on_text;   // text as it becomes final; false: stop
    std::function<void(int32_t id)> on_token;               // every sampled id
    std::function<void(const TokenLogprob&)> on_logprob;    // every sampled id's, before on_token (request.logprobs >= 0)
    std::function<void(const GenerationResult&)> on_done;   // exactly once, last
};

// A function call in an assistant turn: arguments in order, each value as text the way the
// chat template writes it (strings as they are, objects and arrays as JSON).
struct ChatToolCall {
    std::string name;
    std::vector<std::pair<std::string, std::string>> arguments;
};

struct ChatTurn {
    std::string role;     // system | user | assistant | tool
    std::string content;
    std::string reasoning_content;  // assistant only, optional
    std::vector<ChatToolCall> tool_calls;  // assistant only
};

struct EngineStats {
    uint64_t steps = 0;               // forward steps run
    uint64_t prompt_tokens = 0, generated_tokens = 0;  // run through the model; sampled (every token a request got)
    int max_batch_sequences = 0;      // most sequences one step has carried
    int active = 0, queued = 0;       // now
    uint64_t finished = 0;            // requests done (any finish reason)
    double prompt_seconds = 0, generate_seconds = 0;  // summed over finished requests
    uint64_t cache_hits = 0, cached_tokens = 0;  // prefix cache: requests resumed, prompt tokens reused
    int cache_checkpoints = 0;        // held now
    uint64_t cache_bytes = 0;
    uint64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding, summed over requests
};

// One state slot as the scheduler last left it (Engine::slots): what `GET /slots` shows.
struct SlotInfo {
    int id = 0;                      // the slot, 0 .. n_parallel - 1
    std::string state = "idle";      // idle | prefilling (prompt pieces left) | decoding
    uint64_t request = 0;            // the engine's id of the request holding it (submit's); 0: idle
    int n_past = 0;                  // tokens in the slot's context (prompt run + tokens fed)
    int n_prompt = 0;                // the request's prompt tokens
    int n_prompt_done = 0;           // of which run or resumed from the prefix cache
    int n_cached = 0;                // of which resumed from the prefix cache
    int n_generated = 0;             // tokens sampled so far
};

// Every slot as of the scheduler's last step, and the queue now (a request that just took a
// slot can be missing from both for the moment between its admission and the next publication).
struct EngineSlots {
    std::vector<SlotInfo> slots;     // [n_parallel], by id
    int queued = 0;                  // requests waiting for a slot
};

class Engine {
public:
    // Loads the model and starts the scheduler; throws alloy::Error naming the file or the
    // option that is wrong.
    explicit Engine(const EngineOptions& options);
    ~Engine();  // cancels what is queued or running, then joins the scheduler
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Queues a request; returns its id. Throws alloy::Error (naming the field) for a request
    // that can never run: empty prompt, ids outside the vocabulary, prompt + max_tokens over
    // n_ctx, text without a tokenizer.
    uint64_t submit(GenerationRequest request, GenerationCallbacks callbacks = {});
    // Stops a queued or running request at the next step (finish_reason "cancelled"); unknown
    // or finished ids are ignored.
    void cancel(uint64_t id);
    // submit() and wait for the result.
    GenerationResult generate(GenerationRequest request,
                              std::function<bool(const std::string&)> on_text = nullptr,
                              std::function<void(int32_t)> on_token = nullptr);

    // The logits of every position of `ids` ([ids.size(), n_vocab], row-major), from an empty
    // sequence of its own (not a slot: requests keep running around it), as one prefill in
    // pieces of batch_size, or with tokens_per_step > 0 that many tokens per step through the
    // serial (decode and verification) path: 1 is decode, more is speculative verification.
    // Runs on the scheduler's thread between steps. Throws alloy::Error naming the ids or the
    // context size when they cannot run.
    std::vector<float> evaluate(const std::vector<int32_t>& ids, int tokens_per_step = 0);
    // The same, also handing back intermediate tensors of the forward by name (model/graph.h
    // names, e.g. "blk.3.attn.q_rope"; a trailing '*' matches a prefix) to diff against
    // transformers: each name's rows in the order the steps computed them. Throws alloy::Error
    // naming a requested name that no tensor of the forward has.
    struct TensorDump {
        std::string name;
        int64_t cols = 0;
        std::vector<int64_t> positions;  // [rows] the sequence position of each row
        std::vector<float> data;         // [rows, cols] fp32
    };
    std::vector<float> evaluate(const std::vector<int32_t>& ids, int tokens_per_step, const std::vector<std::string>& dump,
                                std::vector<TensorDump>& dumped);
    // The MTP head's logits over `ids` ([ids.size(), n_vocab]): row t predicts token t + 2 from
    // the trunk's hidden state at t and token t + 1 (spec/MODEL.md section 8, teacher-forced as
    // the head was trained; the last row pairs the last token with itself and means nothing).
    // One prefill from an empty sequence on the CPU backend. Throws alloy::Error when the model
    // has no MTP block, the backend is not the CPU's, or the ids cannot run.
    std::vector<float> evaluate_mtp(const std::vector<int32_t>& ids);
    // The forward's ops and tensors, one line per op (alloy logits --dump list).
    std::string describe_forward() const;

    bool has_tokenizer() const;
    // Throws alloy::Error naming the model file when it has no tokenizer.
    std::vector<int32_t> tokenize(const std::string& text, bool parse_special) const;
    // A token's raw bytes (may be part of a UTF-8 character); throws alloy::Error naming an id
    // outside the vocabulary or a model without a tokenizer.
    std::string token_bytes(int32_t id) const;
    // tools: each as JSON text the way the template's `tojson` writes it (Python's json.dumps).
    std::string chat_prompt(const std::vector<ChatTurn>& turns, bool add_generation_prompt,
                            bool enable_thinking, const std::vector<std::string>& tools = {}) const;

    const EngineOptions& options() const;  // model_path resolved
    int n_vocab() const;
    EngineStats stats() const;
    // Thread-safe; the view the scheduler published after its last step (or admission).
    EngineSlots slots() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    void run_between_steps(const std::function<void()>& body);
};

}  // namespace alloy
