// PhaseTimer and step statistics (see timing.h).
#include "harness/timing.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <numeric>
#include <stdexcept>

namespace mt {

std::optional<Phase> phase_from_string(const std::string& name) {
    for (Phase p : kAllPhases)
        if (name == to_string(p)) return p;
    return std::nullopt;
}

double PhaseTimes::phase_sum_ms() const {
    return std::accumulate(ms.begin(), ms.end(), 0.0);
}

double HostEvent::elapsed_ms_since(const TimingEvent& start) const {
    const auto* s = dynamic_cast<const HostEvent*>(&start);
    if (!s) throw std::logic_error("HostEvent::elapsed_ms_since: start is not a HostEvent");
    return std::chrono::duration<double, std::milli>(t_ - s->t_).count();
}

PhaseTimer::PhaseTimer(Backend& backend, bool use_ranges)
    : backend_(backend), use_ranges_(use_ranges), step_start_event_(backend.create_event()) {}

TimingEvent& PhaseTimer::next_device_event(size_t* index) {
    if (device_used_ == device_pool_.size()) device_pool_.push_back(backend_.create_event());
    *index = device_used_;
    return *device_pool_[device_used_++];
}

HostEvent& PhaseTimer::next_host_event(size_t* index) {
    if (host_used_ == host_pool_.size()) host_pool_.emplace_back();
    *index = host_used_;
    return host_pool_[host_used_++];
}

void PhaseTimer::begin_step() {
    if (in_step_)
        throw std::logic_error("PhaseTimer::begin_step: the previous step is not finished");
    in_step_ = true;
    device_used_ = host_used_ = 0;
    marks_.clear();
    phase_count_.fill(0);
    open_.reset();
    // Two origins: host-clock phases (data) are measured from the host event, device phases from
    // the device event. The device event is recorded first, so its origin is never later than the
    // host one: a device phase that follows a host phase then never appears to start before that
    // host phase ended (on the CPU backend both are steady_clock reads a few ns apart; recorded the
    // other way round, h2d's start came out ~10 ns before data's end).
    step_start_event_->record();
    step_start_host_event_.record();
    step_start_host_ = step_start_host_event_.time();
}

void PhaseTimer::begin(Phase p) {
    if (!in_step_) throw std::logic_error("PhaseTimer::begin: no step begun (call begin_step)");
    if (open_)
        throw std::logic_error(std::string("PhaseTimer::begin(") + to_string(p) + "): phase '" +
                               to_string(*open_) + "' is still open");
    open_ = p;
    Mark m{p, phase_count_[static_cast<int>(p)]++, 0, 0};
    if (use_ranges_) backend_.range_push(to_string(p));
    if (p == Phase::data)
        next_host_event(&m.begin_event).record();
    else
        next_device_event(&m.begin_event).record();
    marks_.push_back(m);
}

void PhaseTimer::end(Phase p) {
    if (!open_ || *open_ != p)
        throw std::logic_error(std::string("PhaseTimer::end(") + to_string(p) + "): " +
                               (open_ ? std::string("the open phase is '") + to_string(*open_) + "'"
                                      : std::string("no phase is open")));
    Mark& m = marks_.back();
    if (p == Phase::data)
        next_host_event(&m.end_event).record();
    else
        next_device_event(&m.end_event).record();
    if (use_ranges_) backend_.range_pop();
    open_.reset();
}

PhaseTimes PhaseTimer::finish_step() {
    if (!in_step_) throw std::logic_error("PhaseTimer::finish_step: no step begun");
    if (open_)
        throw std::logic_error(std::string("PhaseTimer::finish_step: phase '") + to_string(*open_) +
                               "' is still open");
    const auto now = std::chrono::steady_clock::now();
    in_step_ = false;
    PhaseTimes t;
    t.wall_ms = std::chrono::duration<double, std::milli>(now - step_start_host_).count();
    intervals_.clear();
    for (const Mark& m : marks_) {
        PhaseInterval iv{m.phase, m.micro_step, 0, 0};
        if (m.phase == Phase::data) {
            const HostEvent& b = host_pool_[m.begin_event];
            const HostEvent& e = host_pool_[m.end_event];
            iv.start_ms = b.elapsed_ms_since(step_start_host_event_);
            iv.duration_ms = e.elapsed_ms_since(b);
        } else {
            const TimingEvent& b = *device_pool_[m.begin_event];
            const TimingEvent& e = *device_pool_[m.end_event];
            iv.start_ms = b.elapsed_ms_since(*step_start_event_);
            iv.duration_ms = e.elapsed_ms_since(b);
        }
        t[m.phase] += iv.duration_ms;
        intervals_.push_back(iv);
    }
    return t;
}

// ---- statistics -------------------------------------------------------------------------------

double percentile_sorted(const std::vector<double>& sorted, double p) {
    if (sorted.empty()) throw std::invalid_argument("percentile of an empty series");
    if (p <= 0) return sorted.front();
    if (p >= 100) return sorted.back();
    const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
    const auto lo = static_cast<size_t>(std::floor(rank));
    const size_t hi = std::min(lo + 1, sorted.size() - 1);
    const double frac = rank - static_cast<double>(lo);
    return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

SeriesStats compute_stats(std::vector<double> v) {
    SeriesStats s;
    s.n = v.size();
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    s.min = v.front();
    s.max = v.back();
    s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    s.median = percentile_sorted(v, 50);
    s.p10 = percentile_sorted(v, 10);
    s.p90 = percentile_sorted(v, 90);
    s.q1 = percentile_sorted(v, 25);
    s.q3 = percentile_sorted(v, 75);
    if (v.size() > 1) {
        double ss = 0;
        for (double x : v) ss += (x - s.mean) * (x - s.mean);
        s.std = std::sqrt(ss / static_cast<double>(v.size() - 1));
    }
    return s;
}

std::string utc_now_iso() {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

}  // namespace mt
