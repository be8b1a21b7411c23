#include "runtime/plan.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <new>
#include <cstdio>

namespace alloy {
namespace {

std::atomic<bool> g_poison{false};

// 64-byte aligned: the kernels move activations in 64-byte vectors, and a block from plain
// new[] starts 16 bytes into a line, which splits every such load and store in two lines.
std::shared_ptr<float[]> new_block(size_t n) {
    constexpr std::align_val_t kAlign{64};
    std::shared_ptr<float[]> b(new (kAlign) float[n], [](float* p) { ::operator delete[](p, kAlign); });
    if (g_poison) std::fill(b.get(), b.get() + n, std::numeric_limits<float>::quiet_NaN());
    return b;
}

}  // namespace

void PlanArena::set_poison(bool on) { g_poison = on; }

float* PlanArena::slot(size_t k, size_t n, std::vector<std::shared_ptr<float[]>>& keep) {
    if (k >= blocks_.size()) {
        blocks_.resize(k + 1);
        sizes_.resize(k + 1, 0);
    }
    if (sizes_[k] < n) {
        blocks_[k] = new_block(n);
        sizes_[k] = n;
    }
    keep.push_back(blocks_[k]);
    return blocks_[k].get();
}

float* Plan::buffer(size_t n) {
    if (arena_) return arena_->slot(buffers_.size(), n, buffers_);
    buffers_.push_back(new_block(n));
    return buffers_.back().get();
}

void Plan::replay(const StepContext& ctx, Profiler* prof) const {
    if (!prof) {
        for (const PlanStep& s : steps_) s.run(ctx);
        return;
    }
    for (const PlanStep& s : steps_) {
        const auto t0 = std::chrono::steady_clock::now();
        s.run(ctx);
        prof->record(s, t0, std::chrono::steady_clock::now());
    }
}

void Profiler::record(const PlanStep& step, std::chrono::steady_clock::time_point t0,
                      std::chrono::steady_clock::time_point t1) {
    Row& r = rows_[step.kernel];
    r.kernel = step.kernel;
    r.calls += 1;
    const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    r.total_ms += ms;
    events_.push_back({step.kernel, step.label, pid_,
                       std::chrono::duration<double, std::micro>(t0 - origin_).count(), ms * 1000.0});
}

std::vector<Profiler::Row> Profiler::rows() const {
    std::vector<Row> out;
    for (const auto& [k, r] : rows_) out.push_back(r);
    std::sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.total_ms > b.total_ms; });
    return out;
}

double Profiler::total_ms() const {
    double t = 0;
    for (const auto& [k, r] : rows_) t += r.total_ms;
    return t;
}

void Profiler::clear() { rows_.clear(); }

void Profiler::set_phase(int pid, std::string name) {
    pid_ = pid;
    phases_.emplace_back(pid, std::move(name));
}

static std::string json_escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\';
        o += c;
    }
    return o;
}

std::string Profiler::chrome_trace_json() const {
    std::string out = "{\"traceEvents\":[\n";
    bool first = true;
    char buf[512];
    for (const auto& [pid, name] : phases_) {
        std::snprintf(buf, sizeof buf, "%s{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"%s\"}}",
                      first ? "" : ",\n", pid, json_escape(name).c_str());
        out += buf;
        first = false;
    }
    for (const Event& e : events_) {
        std::snprintf(buf, sizeof buf,
                      "%s{\"name\":\"%s\",\"cat\":\"kernel\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":1,"
                      "\"args\":{\"step\":\"%s\"}}",
                      first ? "" : ",\n", json_escape(e.name).c_str(), e.ts_us, e.dur_us, e.pid,
                      json_escape(e.label).c_str());
        out += buf;
        first = false;
    }
    out += "\n]}\n";
    return out;
}

}  // namespace alloy
