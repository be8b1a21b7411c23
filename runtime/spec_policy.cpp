#include "runtime/spec_policy.h"

#include <algorithm>

#include "alloy/error.h"

namespace alloy {

SpecPolicy::SpecPolicy(int k_max)
    : k_max_(k_max), times_(size_t(std::max(k_max, 0)) + 1), n_times_(times_.size(), 0),
      last_measured_(times_.size(), -1), drafted_(size_t(std::max(k_max, 0)), 0.0), accepted_(drafted_.size(), 0.0) {
    if (k_max < 1) throw Error("speculation: drafts per step must be at least 1, got " + std::to_string(k_max));
}

double SpecPolicy::step_seconds(int k) const {
    const std::vector<double>& v = times_[size_t(k)];
    if (v.empty()) return 0;
    std::vector<double> s = v;
    std::nth_element(s.begin(), s.begin() + long(s.size() / 2), s.end());
    return s[s.size() / 2];
}

double SpecPolicy::tokens_per_step(int k) const {
    double e = 1, last = 1;
    for (int t = 0; t < k; ++t) {
        // P(drafts 0..t all accepted); a position not measured yet is taken as likely as the one before.
        const double p = drafted_[size_t(t)] > 0 ? accepted_[size_t(t)] / drafted_[size_t(t)] : last;
        e += p;
        last = p;
    }
    return e;
}

double SpecPolicy::probe_loss(int k, int best) const {
    // A step of k instead of best emits E(k) tokens in t(k); at best's rate they would take
    // E(k) / rate(best): the rest of t(k) is lost.
    const double tk = step_seconds(k), tb = step_seconds(best);
    if (!(tk > 0) || !(tb > 0)) return 0;
    const double lost = tk - tokens_per_step(k) * tb / tokens_per_step(best);
    return std::max(0.0, lost / tb);
}

bool SpecPolicy::warming_up() const {
    for (int k = 0; k <= k_max_; ++k)
        if (n_times_[size_t(k)] < kWarmup) return true;
    return drafted_[0] < kWarmupVerifications;
}

int SpecPolicy::best_k() const {
    int best = 0;
    double best_rate = 0;
    for (int k = 0; k <= k_max_; ++k) {
        const double t = step_seconds(k);
        const double rate = t > 0 ? tokens_per_step(k) / t : 0;
        if (rate > best_rate) best = k, best_rate = rate;
    }
    return best;
}

int SpecPolicy::next_probe(int best) const {
    int oldest = -1;
    for (int k = 0; k <= k_max_; ++k)
        if (k != best && (oldest < 0 || last_measured_[size_t(k)] < last_measured_[size_t(oldest)])) oldest = k;
    return oldest;
}

double SpecPolicy::probe_interval(int best, int probe) const {
    // A re-measurement's cost: from the medians, plus where it switches between drafting and
    // not, what the first drafting step after plain ones costs beyond its median (the MTP head
    // runs the rows it was given meanwhile; the medians hide that one-off).
    double loss = probe_loss(probe, best);
    if ((probe == 0) != (best == 0) && resume_k_ > 0 && step_seconds(best) > 0)
        loss += std::max(0.0, resume_seconds_ - step_seconds(resume_k_)) / step_seconds(best);
    // probe_every_ restarts at kProbeEvery when the choice changes (choose() sees that first).
    const double every = best == last_best_ ? double(probe_every_) : double(kProbeEvery);
    return std::max(every, loss / kProbeShare);
}

bool SpecPolicy::may_draft_within(int steps) const {
    if (warming_up()) return true;
    const int best = best_k();
    if (best > 0) return true;
    return double(steps_ + steps - last_probe_) >= probe_interval(best, next_probe(best));
}

int SpecPolicy::choose() {
    ++steps_;
    exploring_ = true;
    // Measure every k first: plain decode (the yardstick) before the drafts.
    for (int k = 0; k <= k_max_; ++k)
        if (n_times_[size_t(k)] < kWarmup) return k;
    if (drafted_[0] < kWarmupVerifications) return 1 + int(steps_ % k_max_);
    const int best = best_k();
    const int probe = next_probe(best);  // the least recently measured other k
    const double interval = probe_interval(best, probe);
    if (best != last_best_) probe_every_ = kProbeEvery, last_best_ = best;
    if (double(steps_ - last_probe_) >= interval) {
        last_probe_ = steps_;
        probe_every_ = std::min<int64_t>(2 * probe_every_, kProbeMax);
        return probe;
    }
    exploring_ = false;
    return best;
}

void SpecPolicy::record_step(int k, double seconds) {
    if (k < 0 || k > k_max_ || !(seconds >= 0)) return;
    std::vector<double>& v = times_[size_t(k)];
    if (v.size() < size_t(kSamples)) v.push_back(seconds);
    else v[size_t(n_times_[size_t(k)] % kSamples)] = seconds;
    ++n_times_[size_t(k)];
    last_measured_[size_t(k)] = steps_;
    if (k > 0 && last_k_ == 0) resume_k_ = k, resume_seconds_ = seconds;
    last_k_ = k;
}

void SpecPolicy::record_verification(int n, int accepted) {
    for (size_t t = 0; t < drafted_.size(); ++t) {
        drafted_[t] *= kDecay;
        accepted_[t] *= kDecay;
        if (int(t) < n) {
            drafted_[t] += 1;
            accepted_[t] += int(t) < accepted ? 1 : 0;
        }
    }
}

}  // namespace alloy
