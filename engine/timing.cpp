// PhaseTimer and step statistics (see timing.h).
#include "engine/timing.h"

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
    : backend_(backend), use_ranges_(use_ranges) {}

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

void PhaseTimer::reserve_events(size_t steps, size_t events_per_step) {
    while (device_pool_.size() < steps * events_per_step)
        device_pool_.push_back(backend_.create_event());
}

void PhaseTimer::begin_step() {
    if (in_step_)
        throw std::logic_error("PhaseTimer::begin_step: the previous step is not finished");
    in_step_ = true;
    // The pools are reused from the start unless closed steps still hold their events.
    if (deferred_.empty()) device_used_ = host_used_ = 0;
    step_ = StepMarks{};
    phase_count_.fill(0);
    open_.reset();
    // Two origins: host-clock phases (data) are measured from the host event, device phases from
    // the device event. The device event is recorded first, so its origin is never later than the
    // host one: a device phase that follows a host phase then never appears to start before that
    // host phase ended (on the CPU backend both are steady_clock reads a few ns apart; recorded the
    // other way round, h2d's start came out ~10 ns before data's end).
    next_device_event(&step_.start_event).record();
    HostEvent& host_start = next_host_event(&step_.host_start_event);
    host_start.record();
    step_start_host_ = host_start.time();
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
    step_.marks.push_back(m);
}

void PhaseTimer::end(Phase p) {
    if (!open_ || *open_ != p)
        throw std::logic_error(std::string("PhaseTimer::end(") + to_string(p) + "): " +
                               (open_ ? std::string("the open phase is '") + to_string(*open_) + "'"
                                      : std::string("no phase is open")));
    Mark& m = step_.marks.back();
    if (p == Phase::data)
        next_host_event(&m.end_event).record();
    else
        next_device_event(&m.end_event).record();
    if (use_ranges_) backend_.range_pop();
    open_.reset();
}

PhaseTimes PhaseTimer::read_marks(const StepMarks& s, std::vector<PhaseInterval>& intervals) const {
    const HostEvent& host_start = host_pool_[s.host_start_event];
    const TimingEvent& device_start = *device_pool_[s.start_event];
    PhaseTimes t;
    intervals.clear();
    for (const Mark& m : s.marks) {
        PhaseInterval iv{m.phase, m.micro_step, 0, 0};
        if (m.phase == Phase::data) {
            const HostEvent& b = host_pool_[m.begin_event];
            const HostEvent& e = host_pool_[m.end_event];
            iv.start_ms = b.elapsed_ms_since(host_start);
            iv.duration_ms = e.elapsed_ms_since(b);
        } else {
            const TimingEvent& b = *device_pool_[m.begin_event];
            const TimingEvent& e = *device_pool_[m.end_event];
            iv.start_ms = b.elapsed_ms_since(device_start);
            iv.duration_ms = e.elapsed_ms_since(b);
        }
        t[m.phase] += iv.duration_ms;
        intervals.push_back(iv);
    }
    return t;
}

void PhaseTimer::check_closable(const char* what) const {
    if (!in_step_) throw std::logic_error(std::string("PhaseTimer::") + what + ": no step begun");
    if (open_)
        throw std::logic_error(std::string("PhaseTimer::") + what + ": phase '" +
                               to_string(*open_) + "' is still open");
}

PhaseTimes PhaseTimer::finish_step() {
    check_closable("finish_step");
    if (!deferred_.empty())
        throw std::logic_error(
            "PhaseTimer::finish_step: deferred steps are unread (read_deferred)");
    const auto now = std::chrono::steady_clock::now();
    in_step_ = false;
    PhaseTimes t = read_marks(step_, intervals_);
    t.wall_ms = std::chrono::duration<double, std::milli>(now - step_start_host_).count();
    return t;
}

void PhaseTimer::end_step_deferred() {
    check_closable("end_step_deferred");
    in_step_ = false;
    next_device_event(&step_.end_event).record();
    deferred_.push_back(step_);
}

std::vector<DeferredStepTimes> PhaseTimer::read_deferred() {
    if (in_step_) throw std::logic_error("PhaseTimer::read_deferred: a step is still running");
    std::vector<DeferredStepTimes> out;
    for (size_t i = 0; i < deferred_.size(); ++i) {
        const StepMarks& s = deferred_[i];
        DeferredStepTimes d;
        d.times = read_marks(s, d.intervals);
        // Device clock: to the next step's start (the device's whole time on this step), the
        // last one to its own end.
        const TimingEvent& start = *device_pool_[s.start_event];
        const TimingEvent& stop = i + 1 < deferred_.size()
                                      ? *device_pool_[deferred_[i + 1].start_event]
                                      : *device_pool_[s.end_event];
        d.times.wall_ms = stop.elapsed_ms_since(start);
        // On the trace's timeline too: the window's first host start, then the device's offsets
        // (the host, having run ahead, began the later steps long before the device did).
        const StepMarks& first = deferred_.front();
        const double offset_ms = start.elapsed_ms_since(*device_pool_[first.start_event]);
        d.host_start = host_pool_[first.host_start_event].time() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double, std::milli>(offset_ms));
        out.push_back(std::move(d));
    }
    if (!out.empty()) {
        intervals_ = out.back().intervals;
        step_start_host_ = out.back().host_start;
    }
    deferred_.clear();
    return out;
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
