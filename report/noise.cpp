// What else the machine did during each slice (see noise.h).
#include "report/noise.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "kernels/device_clock.h"
#include "kernels/text.h"
#include "report/format.h"

namespace mt {

using namespace report_text;

namespace {

// The names of the reasons that slow the clock (kSlowdownReasons), as throttle_reason_names
// spells them.
bool is_slowdown(const std::string& name) {
    static const std::vector<std::string> names = throttle_reason_names(kSlowdownReasons);
    return std::find(names.begin(), names.end(), name) != names.end();
}

double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string cores(double c) {
    return f("%.2f", c);
}

std::string step_span(int first, int last) {
    return first == last ? "step " + std::to_string(first)
                         : "steps " + std::to_string(first) + "–" + std::to_string(last);
}

std::string step_span(const NoiseFigures& f) {
    return step_span(f.first_step, f.last_step);
}

std::string clock_range(const NoiseFigures& f) {
    const double lo = *f.min_sm_clock_mhz, hi = *f.max_sm_clock_mhz;
    return lo == hi ? report_text::f("%.0f MHz", lo)
                    : report_text::f("%.0f", lo) + "–" + report_text::f("%.0f MHz", hi);
}

}  // namespace

void NoiseFigures::add(const StepRow& s) {
    if (steps == 0) first_step = s.step;
    first_step = std::min(first_step, s.step);
    last_step = std::max(steps == 0 ? s.step : last_step, s.step);
    ++steps;
    wall_ms += s.wall_ms;
    other_cpu_ms += s.other_cpu_ms;
    steal_ms += s.steal_ms;
    if (s.sm_clock_mhz) {
        min_sm_clock_mhz = std::min(min_sm_clock_mhz.value_or(*s.sm_clock_mhz), *s.sm_clock_mhz);
        max_sm_clock_mhz = std::max(max_sm_clock_mhz.value_or(*s.sm_clock_mhz), *s.sm_clock_mhz);
    }
    if (s.throttle_reasons)
        for (const std::string& r : *s.throttle_reasons)
            if (is_slowdown(r) &&
                std::find(slowdowns.begin(), slowdowns.end(), r) == slowdowns.end())
                slowdowns.push_back(r);
}

bool NoiseSummary::quiet() const {
    if (speed_change) return false;
    for (const NoiseSlice& s : slices)
        if (s.hit || s.figures.steal_cores() > kStealCores || !s.figures.slowdowns.empty())
            return false;
    return true;
}

const NoiseSlice* NoiseSummary::slice(const std::string& variant, int round) const {
    for (const NoiseSlice& s : slices)
        if (s.variant == variant && s.round == round) return &s;
    return nullptr;
}

namespace {

// The steadiest variant's slowest over fastest slice, when it exceeds 1 + kSpeedChange (two
// variants with two slices at least: one variant alone cannot tell the machine from itself).
std::optional<SpeedChange> speed_change_of(const NoiseSummary& n) {
    std::optional<SpeedChange> steadiest;
    int variants = 0;
    for (const std::string& v : n.variants) {
        SpeedChange c{v};
        int slices = 0;
        for (const NoiseSlice& s : n.slices) {
            if (s.variant != v || s.figures.steps == 0) continue;
            const double ms = s.figures.wall_ms / s.figures.steps;
            if (slices == 0 || ms < c.fast_ms) c.fast_round = s.round, c.fast_ms = ms;
            if (slices == 0 || ms > c.slow_ms) c.slow_round = s.round, c.slow_ms = ms;
            ++slices;
        }
        if (slices < 2) continue;
        ++variants;
        if (!steadiest || c.ratio() < steadiest->ratio()) steadiest = c;
    }
    if (variants < 2 || steadiest->ratio() <= 1 + kSpeedChange) return std::nullopt;
    return steadiest;
}

std::string speed_change_sentence(const SpeedChange& c) {
    return "The machine changed speed: even the steadiest variant, " + c.variant + ", took " +
           f("%.1f", c.fast_ms) + " ms a step in round " + std::to_string(c.fast_round) + " and " +
           f("%.1f", c.slow_ms) + " ms in round " + std::to_string(c.slow_round) + " (" +
           f("%.2f", c.ratio()) +
           "x) — a VM's host lending its cores to another guest, or a clock stepping down, "
           "slows every variant alike; the time calls leave out the rounds such a change split "
           "(docs/report.md).";
}

}  // namespace

NoiseSummary summarize_noise(const Results& results) {
    NoiseSummary n;
    n.rounds = std::max(1, results.experiment.rounds);
    for (const VariantResult& v : results.variants)
        for (const StepRow& s : v.steps)
            if (!s.warmup) n.rounds = std::max(n.rounds, s.round + 1);
    std::map<int, NoiseFigures> by_round;
    for (const VariantResult& v : results.variants) {
        std::map<int, NoiseFigures> slices;
        for (const StepRow& s : v.steps) {
            if (s.warmup) continue;
            const int round = std::max(0, s.round);
            slices[round].add(s);
            by_round[round].add(s);
            n.all.add(s);
        }
        if (slices.empty()) continue;
        n.variants.push_back(v.name);
        for (const auto& [round, figures] : slices)
            n.slices.push_back({v.name, round, figures, figures.cores_busy() > kBusySliceCores});
    }
    for (const auto& [round, figures] : by_round) n.rounds_figures.push_back({round, figures});
    for (NoiseRound& r : n.rounds_figures) {
        std::vector<double> others;
        for (const NoiseRound& o : n.rounds_figures)
            if (o.round != r.round) others.push_back(o.figures.cores_busy());
        if (others.empty()) continue;
        r.others_median_cores = median_of(others);
        const double c = r.figures.cores_busy();
        r.much_harder = c > kBusySliceCores && c > kHarderRoundFactor * r.others_median_cores;
    }
    for (size_t i = 0; i < n.slices.size(); ++i)
        if (!n.busiest ||
            n.slices[i].figures.cores_busy() > n.slices[*n.busiest].figures.cores_busy())
            n.busiest = i;
    n.speed_change = speed_change_of(n);
    return n;
}

std::vector<std::string> noise_sentences(const NoiseSummary& n, unsigned hardware_threads) {
    std::vector<std::string> out;
    if (n.slices.empty()) return out;
    const std::string of_threads =
        hardware_threads ? " (of " + std::to_string(hardware_threads) + " hardware threads)" : "";
    const NoiseSlice& top = n.slices[*n.busiest];
    const std::string top_where = top.variant +
                                  (n.rounds > 1 ? ", round " + std::to_string(top.round) : "") +
                                  ", " + step_span(top.figures);
    if (n.quiet()) {
        std::string s = "The machine was quiet: other processes took " + cores(n.all.cores_busy()) +
                        " cores on average" + of_threads + ", " + cores(top.figures.cores_busy()) +
                        " at most in any slice (no slice above " + cores(kBusySliceCores) + ")";
        s += n.all.steal_ms > 0 ? ", steal " + cores(n.all.steal_cores()) + " cores" : ", no steal";
        if (n.has_device_clock()) s += "; GPU SM clock " + clock_range(n.all) + ", no throttling";
        out.push_back(s + ".");
        return out;
    }
    out.push_back("Other processes took " + cores(n.all.cores_busy()) +
                  " cores on average during the measured steps" + of_threads + ", " +
                  cores(top.figures.cores_busy()) + " at most (" + top_where + ").");
    // The hit slices: one entry each with one round; grouped by round with several (a round
    // whose every slice was hit reads "round 2: every variant (1.18–1.25)").
    std::vector<std::string> hit;
    std::vector<std::string> hit_variants;
    size_t hit_slices = 0;
    for (const NoiseSlice& s : n.slices)
        if (s.hit &&
            std::find(hit_variants.begin(), hit_variants.end(), s.variant) == hit_variants.end())
            hit_variants.push_back(s.variant);
    for (int round = 0; round < n.rounds; ++round) {
        std::vector<std::string> in_round;
        size_t slices = 0;
        double lo = 0, hi = 0;
        for (const NoiseSlice& s : n.slices) {
            if (s.round != round) continue;
            ++slices;
            if (!s.hit) continue;
            const double c = s.figures.cores_busy();
            lo = in_round.empty() ? c : std::min(lo, c);
            hi = in_round.empty() ? c : std::max(hi, c);
            in_round.push_back(s.variant + " (" + cores(c) + ", " + step_span(s.figures) + ")");
        }
        hit_slices += in_round.size();
        if (in_round.empty()) continue;
        if (n.rounds == 1)
            hit.insert(hit.end(), in_round.begin(), in_round.end());
        else if (in_round.size() == slices && slices > 1)
            hit.push_back("round " + std::to_string(round) + ": every variant (" + cores(lo) +
                          (lo == hi ? "" : "–" + cores(hi)) + ")");
        else
            hit.push_back("round " + std::to_string(round) + ": " + join(in_round, ", "));
    }
    if (hit_slices == n.slices.size() && n.slices.size() > 1) {
        double lo = top.figures.cores_busy();
        for (const NoiseSlice& s : n.slices) lo = std::min(lo, s.figures.cores_busy());
        out.push_back("Every slice was hit (more than " + cores(kBusySliceCores) +
                      " cores busy, from " + cores(lo) + " to " + cores(top.figures.cores_busy()) +
                      "): the machine was busy throughout.");
    } else if (!hit.empty()) {
        out.push_back("Slices hit (more than " + cores(kBusySliceCores) +
                      " cores busy): " + join(hit, "; ") + ".");
        if (n.rounds == 1 && hit_variants.size() < n.variants.size())
            out.push_back(
                "With one round, only " + join(hit_variants, ", ") +
                " ran while the machine was busy: " + (hit_variants.size() == 1 ? "its" : "their") +
                " times carry that load, and a comparison with the others credits it "
                "to the knob (run.rounds interleaves the variants).");
    }
    if (n.speed_change) out.push_back(speed_change_sentence(*n.speed_change));
    for (const NoiseRound& r : n.rounds_figures)
        if (r.much_harder)
            out.push_back("Round " + std::to_string(r.round) +
                          " was hit much harder than the others: " + cores(r.figures.cores_busy()) +
                          " cores busy against a median of " + cores(r.others_median_cores) +
                          " for the other rounds (every variant's slice of it carries the load).");
    std::vector<std::string> stolen;
    for (const NoiseSlice& s : n.slices)
        if (s.figures.steal_cores() > kStealCores)
            stolen.push_back(s.variant + (n.rounds > 1 ? " round " + std::to_string(s.round) : "") +
                             " (" + cores(s.figures.steal_cores()) + ")");
    if (!stolen.empty())
        out.push_back(
            "The hypervisor stole CPU time (steal, in cores; part of the figures above): " +
            join(stolen, "; ") + ".");
    if (n.has_device_clock()) {
        std::string s = "GPU SM clock " + clock_range(n.all);
        std::vector<std::string> slowed;
        for (const NoiseSlice& sl : n.slices)
            if (!sl.figures.slowdowns.empty())
                slowed.push_back(sl.variant +
                                 (n.rounds > 1 ? " round " + std::to_string(sl.round) : "") + " (" +
                                 join(sl.figures.slowdowns, ", ") + ")");
        s += slowed.empty() ? ", no throttling." : "; throttled in " + join(slowed, "; ") + ".";
        out.push_back(s);
    }
    return out;
}

std::string render_noise_md(const Results& results) {
    const NoiseSummary n = summarize_noise(results);
    if (n.slices.empty()) return "";
    std::ostringstream o;
    o << "\n## Machine noise\n\nWhat else the machine did while each variant was measured: the "
         "CPU time other processes took, in cores busy (their CPU time / the slice's wall "
         "time; /proc, 10 ms ticks), per variant and round; steps numbered as in steps.csv.\n\n";
    for (const std::string& s : noise_sentences(n, results.environment.hardware_threads))
        o << s << "\n";
    if (n.quiet()) return o.str();  // one line says it all
    // Steal gets its column where some slice has steal worth naming (kStealCores).
    bool steal = false;
    for (const NoiseSlice& s : n.slices) steal |= s.figures.steal_cores() > kStealCores;
    const bool clock = n.has_device_clock();
    o << "\nCores busy" << (steal ? " (steal)" : "") << (clock ? " · lowest SM clock" : "")
      << "; **bold**: a slice hit (more than " << cores(kBusySliceCores) << ").\n\n| Variant |";
    std::string rule = "|---|";
    for (int r = 0; r < n.rounds; ++r) {
        bool harder = false;
        for (const NoiseRound& nr : n.rounds_figures) harder |= nr.round == r && nr.much_harder;
        o << " round " << r << (harder ? " (hit hardest)" : "") << " |";
        rule += "---:|";
    }
    o << "\n" << rule << "\n";
    for (const std::string& v : n.variants) {
        o << "| " << v << " |";
        for (int r = 0; r < n.rounds; ++r) {
            const NoiseSlice* s = n.slice(v, r);
            if (!s) {
                o << " – |";
                continue;
            }
            // Written piece by piece (GCC 12 warns falsely on "x" + std::string temporaries).
            o << " " << (s->hit ? "**" : "") << cores(s->figures.cores_busy())
              << (s->hit ? "**" : "");
            if (steal) o << " (" << cores(s->figures.steal_cores()) << ")";
            if (clock && s->figures.min_sm_clock_mhz)
                o << " · " << f("%.0f MHz", *s->figures.min_sm_clock_mhz);
            if (!s->figures.slowdowns.empty()) o << " " << join(s->figures.slowdowns, ", ");
            o << " |";
        }
        o << "\n";
    }
    return o.str();
}

void TrainNoiseTracker::add(const StepRow& s) {
    if (s.warmup) return;
    noise_.all.add(s);
    last_.push_back(s);
    other_ms_ += s.other_cpu_ms;
    wall_ms_ += s.wall_ms;
    // The shortest stretch ending here that is still full: drop steps from its front while it
    // stays at least min_steps long and min_wall_ms of step time.
    while (last_.size() > min_steps_ && wall_ms_ - last_.front().wall_ms >= min_wall_ms_) {
        other_ms_ -= last_.front().other_cpu_ms;
        wall_ms_ -= last_.front().wall_ms;
        last_.pop_front();
    }
    const bool full = last_.size() >= min_steps_ && wall_ms_ >= min_wall_ms_;
    const double c = wall_ms_ > 0 ? std::max(0.0, other_ms_) / wall_ms_ : 0;
    if (full_ && (!full || c <= noise_.busiest_cores)) return;
    full_ = full;
    noise_.busiest_cores = c;
    noise_.busiest_first = last_.front().step;
    noise_.busiest_last = last_.back().step;
}

TrainNoise noise_of_steps(const std::vector<StepRow>& steps, int min_steps, double min_wall_ms) {
    TrainNoiseTracker t(min_steps, min_wall_ms);
    for (const StepRow& s : steps) t.add(s);
    return t.noise();
}

std::string train_noise_line(const TrainNoise& t) {
    if (t.all.steps == 0) return "";
    std::string s =
        "machine: other processes took " + cores(t.all.cores_busy()) + " cores on average";
    if (t.busiest_first == t.all.first_step && t.busiest_last == t.all.last_step)
        // Shorter than one stretch: no busiest part to name.
        s += " over " + step_span(t.all) + " (" + f("%.1f", t.all.wall_ms / 1000.0) +
             " s of step time)";
    else
        s += ", " + cores(t.busiest_cores) + " at most (" +
             step_span(t.busiest_first, t.busiest_last) + ")";
    s += t.all.steal_ms > 0 ? "; steal " + cores(t.all.steal_cores()) + " cores" : "; steal 0";
    if (t.all.min_sm_clock_mhz) {
        s += "; GPU SM clock " + clock_range(t.all);
        s += t.all.slowdowns.empty() ? ", no throttling"
                                     : ", " + join(t.all.slowdowns, ", ") + " seen";
    }
    return s;
}

}  // namespace mt
