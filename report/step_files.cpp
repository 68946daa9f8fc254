// steps.csv and trace.json (see step_files.h).
#include "report/step_files.h"

#include <cstdio>
#include <sstream>

#include "report/format.h"

namespace mt {

using nlohmann::json;
using namespace report_text;

std::string steps_csv(const Results& results) {
    std::ostringstream o;
    o << "variant,step,warmup,wall_ms";
    for (Phase p : kAllPhases) o << "," << to_string(p) << "_ms";
    o << ",other_ms,loss,grad_norm,lr,comm_busy_ms,comm_bytes,tokens,other_cpu_ms,steal_ms\n";
    auto num = [](double x) {
        if (!std::isfinite(x)) return std::string(std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf"));
        char b[48];
        std::snprintf(b, sizeof b, "%.6f", x);
        return std::string(b);
    };
    for (const VariantResult& v : results.variants) {
        // Variant names are identifiers validated by the spec; quote anyway if a comma sneaks in.
        std::string name = v.name;
        if (name.find_first_of(",\"\n") != std::string::npos) {
            std::string q = "\"";
            for (char c : name) q += c == '"' ? std::string("\"\"") : std::string(1, c);
            name = q + "\"";
        }
        for (const StepRow& s : v.steps) {
            o << name << "," << s.step << "," << (s.warmup ? 1 : 0) << "," << num(s.wall_ms);
            for (Phase p : kAllPhases) o << "," << num(s.phases_ms[static_cast<int>(p)]);
            o << "," << num(s.other_ms) << "," << num(s.loss) << "," << num(s.grad_norm) << ","
              << f("%.6g", s.lr) << "," << num(s.comm_busy_ms) << "," << f("%.0f", s.comm_bytes)
              << "," << f("%.0f", s.tokens) << "," << num(s.other_cpu_ms) << "," << num(s.steal_ms)
              << "\n";
        }
    }
    return o.str();
}

namespace {

// The trace events of one track (pid, tid) of kept steps: a step's phases, or its ops, or the
// step itself, each placed at the step's host offset plus its own offset.
enum class TraceTrack { steps, phases, ops };

void add_track(json& events, int pid, int tid, const std::vector<TraceStep>& trace,
               TraceTrack what) {
    for (const TraceStep& s : trace) {
        const double base_us = s.start_ms * 1000.0;
        if (what == TraceTrack::steps)
            events.push_back({{"name", "step " + std::to_string(s.step)},
                              {"cat", "step"},
                              {"ph", "X"},
                              {"pid", pid},
                              {"tid", tid},
                              {"ts", base_us},
                              {"dur", s.wall_ms * 1000.0},
                              {"args", {{"step", s.step}}}});
        if (what == TraceTrack::phases)
            for (const PhaseInterval& iv : s.phases)
                events.push_back({{"name", to_string(iv.phase)},
                                  {"cat", "phase"},
                                  {"ph", "X"},
                                  {"pid", pid},
                                  {"tid", tid},
                                  {"ts", base_us + iv.start_ms * 1000.0},
                                  {"dur", iv.duration_ms * 1000.0},
                                  {"args", {{"step", s.step}, {"micro_step", iv.micro_step}}}});
        if (what == TraceTrack::ops)
            for (const OpInterval& op : s.ops)
                events.push_back({{"name", op.name},
                                  {"cat", "op"},
                                  {"ph", "X"},
                                  {"pid", pid},
                                  {"tid", tid},
                                  {"ts", base_us + op.start_ms * 1000.0},
                                  {"dur", op.duration_ms * 1000.0},
                                  {"args", {{"step", s.step}}}});
    }
}

json thread_name(int pid, int tid, const std::string& name) {
    return {{"name", "thread_name"},
            {"ph", "M"},
            {"pid", pid},
            {"tid", tid},
            {"args", {{"name", name}}}};
}

bool has_trace(const VariantResult& v) {
    if (!v.trace.empty()) return true;
    if (v.data_parallel)
        for (const RankRecord& rank : v.data_parallel->ranks)
            if (!rank.trace.empty()) return true;
    return false;
}

}  // namespace

json trace_json(const Results& results) {
    json events = json::array();
    int pid = 0;
    for (const VariantResult& r : results.variants) {
        ++pid;
        if (!has_trace(r)) continue;
        events.push_back({{"name", "process_name"},
                          {"ph", "M"},
                          {"pid", pid},
                          {"args", {{"name", "variant " + r.name}}}});
        events.push_back(thread_name(pid, 1, "steps"));
        add_track(events, pid, 1, r.trace, TraceTrack::steps);
        if (!r.data_parallel) {
            events.push_back(thread_name(pid, 2, "phases"));
            add_track(events, pid, 2, r.trace, TraceTrack::phases);
            events.push_back(thread_name(pid, 3, "ops"));
            add_track(events, pid, 3, r.trace, TraceTrack::ops);
            continue;
        }
        // Data parallel: one phases track per rank (rank 0's is the variant's own trace), so a
        // straggler or a rank waiting in comm shows beside the others; the steps and ops tracks
        // stay rank 0's, which keeps the file as small as one rank's.
        const std::vector<RankRecord>& ranks = r.data_parallel->ranks;
        for (size_t i = 0; i < ranks.size(); ++i) {
            const int tid = 2 + static_cast<int>(i);
            events.push_back(
                thread_name(pid, tid, "rank " + std::to_string(ranks[i].rank) + " phases"));
            add_track(events, pid, tid, ranks[i].trace, TraceTrack::phases);
        }
        const int ops_tid = 2 + static_cast<int>(ranks.size());
        events.push_back(thread_name(pid, ops_tid, "ops"));
        add_track(events, pid, ops_tid, r.trace, TraceTrack::ops);
    }
    return {{"traceEvents", events},
            {"displayTimeUnit", "ms"},
            {"otherData",
             {{"experiment", results.experiment.name},
              {"note",
               "measured steps only (profile.trace_steps per variant); device phases are "
               "timed on the device clock and placed relative to the step start"}}}};
}

}  // namespace mt
