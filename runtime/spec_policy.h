// How many drafts a speculative step carries, from what speculation measurably costs and
// gains here (issue 21: "never slower than plain decode at its default settings"). A draft
// pays only when the tokens a step emits grow faster than the step's time: with drafts free
// (n-gram lookup) and verification nearly free (a memory-bound decode reads the weights once
// for 1 or 4 rows) more drafts win; with a drafter that costs a forward of its own (an MTP
// head whose LM head is as large as the trunk's, as in the default model) none may.
// The policy keeps, per draft count k in 0..k_max, the wall times of recent steps that
// carried k drafts (drafting, the forward, the rollback), and the acceptance by draft
// position (decayed, so it follows the text). It picks argmax_k E(k) / t(k), where
// E(k) = 1 + sum_{t<k} P(the first t+1 drafts accepted) is the tokens a step emits; it first
// measures every k a few times, then re-measures the least recently measured one after
// kProbeEvery steps, the interval doubling (up to kProbeMax) while the choice holds and back
// to kProbeEvery when it changes, and never shorter than what keeps the re-measurements' own
// cost at kProbeShare of the time (a probe of a k that costs 3 plain steps for 1.2 tokens, as
// the MTP head of a small model on a GPU, waits ~360 steps), so that a change in costs or
// acceptance is seen at a cost of about 0.5% of the time once settled. Output never depends on
// it: whether a step drafts changes no token or bit (verification is exact).
#pragma once
#include <cstdint>
#include <vector>

namespace alloy {

class SpecPolicy {
public:
    static constexpr int kSamples = 8;      // step times kept per k (their median is t(k))
    static constexpr int kWarmup = 3;       // samples of each k before choosing by the estimates
    static constexpr int kWarmupVerifications = 16;  // and verifications (acceptance is noisier)
    static constexpr int kProbeEvery = 64;  // steps between re-measurements of another k, at first
    static constexpr int kProbeMax = 4096;
    static constexpr double kDecay = 0.98;  // per verification, on the acceptance counts
    static constexpr double kProbeShare = 0.005;  // of the time, spent re-measuring once settled

    explicit SpecPolicy(int k_max);
    int k_max() const { return k_max_; }
    // Drafts for the next step, 0..k_max (0: plain decode).
    int choose();
    // Whether that choice measures (warm-up or a re-measurement) rather than exploits: the
    // caller then drafts exactly that many where it can (its own heuristics would hide the cost).
    bool exploring() const { return exploring_; }
    // Whether any of the next `steps` choices may carry drafts (warm-up, drafting, or a
    // re-measurement due by then): --spec mtp gives its head the trunk's rows only then (the
    // head keeps at most MtpDrafter::kMaxPending waiting rows anyway).
    bool may_draft_within(int steps) const;
    // A decode step that carried k drafts (the most any request carried; 0: none) took
    // `seconds` in all.
    void record_step(int k, double seconds);
    // A verification of n drafts that kept the first `accepted`.
    void record_verification(int n, int accepted);
    // The estimates behind choose(): t(k) in seconds (0 while unmeasured) and E(k).
    double step_seconds(int k) const;
    double tokens_per_step(int k) const;

private:
    // The time a step of k loses against a step of best (in steps of best): 0 where k is as fast.
    double probe_loss(int k, int best) const;
    bool warming_up() const;
    int best_k() const;                              // by the estimates
    int next_probe(int best) const;                  // the least recently measured other k
    double probe_interval(int best, int probe) const;  // steps between re-measurements
    int k_max_;
    int64_t steps_ = 0, last_probe_ = 0, probe_every_ = kProbeEvery;
    int last_best_ = -1;
    int last_k_ = -1;            // the k of the last recorded step
    int resume_k_ = 0;           // the last drafting step after a plain one: its k and time
    double resume_seconds_ = 0;
    bool exploring_ = true;
    std::vector<std::vector<double>> times_;  // [k] the last kSamples step times
    std::vector<int64_t> n_times_, last_measured_;  // [k] samples recorded; the step of the last one
    std::vector<double> drafted_, accepted_;       // [position] decayed counts
};

}  // namespace alloy
