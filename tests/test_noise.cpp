// The machine-noise rules (report/noise.h) on hand-made step rows with known busy slices: which
// slices are hit, which round is hit much harder, the quiet one-liner, steal and the GPU clock,
// the report.md section and the busiest stretch of a `train` run. No timing is measured.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "report/noise.h"
#include "report/recording.h"
#include "report/render.h"
#include "report/results.h"
#include "tests/hand_made_run.h"
#include "tests/test_util.h"

namespace mt {
namespace {

// One measured step of 100 ms wall in `round` during which others took `other_ms` of CPU.
StepRow step(int index, int round, double other_ms, double steal_ms = 0) {
    StepRow s;
    s.step = index;
    s.warmup = false;
    s.round = round;
    s.wall_ms = 100;
    s.other_cpu_ms = other_ms;
    s.steal_ms = steal_ms;
    return s;
}

// Variants named `names`, `rounds` rounds of `per_slice` steps each (steps numbered per variant
// in the order they ran), other CPU per step from `other(variant, round)`.
template <class Other>
Results run_of(const std::vector<std::string>& names, int rounds, int per_slice, Other other) {
    Results r;
    r.experiment.rounds = rounds;
    r.environment.hardware_threads = 2;
    for (size_t v = 0; v < names.size(); ++v) {
        VariantResult vr;
        vr.name = names[v];
        StepRow warm = step(0, -1, 500);  // warm-up: busy, and never counted
        warm.warmup = true;
        vr.steps.push_back(warm);
        int index = 1;
        for (int round = 0; round < rounds; ++round)
            for (int i = 0; i < per_slice; ++i)
                vr.steps.push_back(step(index++, round, other(static_cast<int>(v), round)));
        r.variants.push_back(vr);
    }
    return r;
}

std::string all_of(const std::vector<std::string>& lines) {
    std::string s;
    for (const std::string& l : lines) s += l + "\n";
    return s;
}

TEST(Noise, AQuietRunSaysSoInOneLine) {
    // 10 ms of others' CPU per 100 ms step: 0.10 cores, below kBusySliceCores.
    const Results r = run_of({"baseline", "fast"}, 5, 3, [](int, int) { return 10.0; });
    const NoiseSummary n = summarize_noise(r);
    EXPECT_EQ(n.rounds, 5);
    EXPECT_EQ(n.slices.size(), 10u);
    EXPECT_TRUE(n.quiet());
    EXPECT_NEAR(n.all.cores_busy(), 0.10, 1e-12);  // warm-up's 500 ms left out
    const std::vector<std::string> lines = noise_sentences(n, 2);
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_EQ(lines[0],
              "The machine was quiet: other processes took 0.10 cores on average (of 2 hardware "
              "threads), 0.10 at most in any slice (no slice above 0.25), no steal.");
    // The section is the sentence, no table.
    const std::string md = render_noise_md(r);
    EXPECT_NE(md.find("## Machine noise"), std::string::npos);
    EXPECT_EQ(md.find("| Variant |"), std::string::npos) << md;
}

TEST(Noise, ABurstInOneRoundIsNamedWithTheSlicesItHit) {
    // Round 2 busy for every variant (a core burning: 120 ms of others' CPU per 100 ms step),
    // the rest quiet (5 ms).
    const Results r = run_of({"baseline", "fast", "lean"}, 5, 4,
                             [](int, int round) { return round == 2 ? 120.0 : 5.0; });
    const NoiseSummary n = summarize_noise(r);
    EXPECT_FALSE(n.quiet());
    for (const NoiseSlice& s : n.slices) EXPECT_EQ(s.hit, s.round == 2) << s.variant << s.round;
    ASSERT_EQ(n.rounds_figures.size(), 5u);
    for (const NoiseRound& rd : n.rounds_figures) {
        EXPECT_EQ(rd.much_harder, rd.round == 2) << rd.round;
        if (rd.round == 2) {
            EXPECT_NEAR(rd.figures.cores_busy(), 1.2, 1e-12);
            EXPECT_NEAR(rd.others_median_cores, 0.05, 1e-12);
        }
    }
    const std::string text = all_of(noise_sentences(n, 2));
    EXPECT_NE(text.find("1.20 at most (baseline, round 2, steps 9–12)"), std::string::npos) << text;
    EXPECT_NE(text.find("Slices hit (more than 0.25 cores busy): round 2: every variant (1.20)."),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("Round 2 was hit much harder than the others: 1.20 cores busy against a "
                        "median of 0.05"),
              std::string::npos)
        << text;
    const std::string md = render_noise_md(r);
    EXPECT_NE(
        md.find("| Variant | round 0 | round 1 | round 2 (hit hardest) | round 3 | round 4 |"),
        std::string::npos)
        << md;
    EXPECT_NE(md.find("| fast | 0.05 | 0.05 | **1.20** | 0.05 | 0.05 |"), std::string::npos) << md;
}

// Measured on a 2-core VM: every variant's steps went from about 231 to 315 ms and back with no
// other process in sight. The section names it, from the steadiest variant's slices.
TEST(Noise, AMachineThatChangedSpeedIsNamedFromTheSteadiestVariant) {
    Results r = run_of({"baseline", "jitter"}, 5, 4, [](int, int) { return 0.0; });
    const double level[5] = {231, 315, 315, 231, 315};
    for (StepRow& s : r.variants[0].steps)
        if (!s.warmup) s.wall_ms = level[s.round];
    for (StepRow& s : r.variants[1].steps)  // varies more: 0.6x .. 1.5x of the machine's level
        if (!s.warmup) s.wall_ms = level[s.round] * (s.round == 1 ? 1.5 : s.round == 3 ? 0.6 : 1.0);
    const NoiseSummary n = summarize_noise(r);
    ASSERT_TRUE(n.speed_change.has_value());
    EXPECT_EQ(n.speed_change->variant, "baseline");
    EXPECT_EQ(n.speed_change->fast_round, 0);
    EXPECT_EQ(n.speed_change->slow_round, 1);
    EXPECT_FALSE(n.quiet());
    EXPECT_CONTAINS(all_of(noise_sentences(n, 2)),
                    "The machine changed speed: even the steadiest variant, baseline, took 231.0 "
                    "ms a step in round 0 and 315.0 ms in round 1 (1.36x)");
    // One variant that varies by design beside a steady one: the machine did not change.
    for (StepRow& s : r.variants[0].steps) s.wall_ms = 100;
    EXPECT_FALSE(summarize_noise(r).speed_change.has_value());
    EXPECT_TRUE(summarize_noise(r).quiet());
}

TEST(Noise, ARoundIsHitMuchHarderOnlyAboveBothThresholds) {
    // Round 1 at 4x the others but only 0.20 cores busy: not named (below kBusySliceCores).
    const Results low = run_of({"a", "b"}, 3, 2, [](int, int r) { return r == 1 ? 20.0 : 5.0; });
    for (const NoiseRound& rd : summarize_noise(low).rounds_figures) EXPECT_FALSE(rd.much_harder);
    // Every round busy alike (a steady background load): slices hit, no round singled out.
    const Results steady = run_of({"a", "b"}, 3, 2, [](int, int) { return 80.0; });
    const NoiseSummary n = summarize_noise(steady);
    EXPECT_FALSE(n.quiet());
    for (const NoiseSlice& s : n.slices) EXPECT_TRUE(s.hit);
    for (const NoiseRound& rd : n.rounds_figures) EXPECT_FALSE(rd.much_harder);
    const std::string text = all_of(noise_sentences(n, 2));
    EXPECT_EQ(text.find("hit much harder"), std::string::npos) << text;
    EXPECT_NE(text.find("Every slice was hit (more than 0.25 cores busy, from 0.80 to 0.80): the "
                        "machine was busy throughout."),
              std::string::npos)
        << text;
    EXPECT_EQ(text.find("Slices hit"), std::string::npos) << text;
    // Round 0 at 2.9x the median of the others and busy: not "much harder" (3x is the rule).
    const Results close = run_of({"a"}, 3, 2, [](int, int r) { return r == 0 ? 87.0 : 30.0; });
    for (const NoiseRound& rd : summarize_noise(close).rounds_figures)
        EXPECT_FALSE(rd.much_harder) << rd.round;
}

TEST(Noise, HitSlicesAreListedRoundByRound) {
    // Round 1: only fast's slice busy (0.60); round 2: both (0.90); round 0 quiet.
    const Results r = run_of({"baseline", "fast"}, 3, 2, [](int v, int round) {
        return round == 2 ? 90.0 : (round == 1 && v == 1 ? 60.0 : 5.0);
    });
    const NoiseSummary n = summarize_noise(r);
    const std::string text = all_of(noise_sentences(n, 2));
    EXPECT_NE(text.find("Slices hit (more than 0.25 cores busy): round 1: fast (0.60, steps 3–4); "
                        "round 2: every variant (0.90)."),
              std::string::npos)
        << text;
    // Round 2 (0.90) > 3 x the median of rounds 0 and 1 (0.05, 0.325); round 1 is not.
    EXPECT_NE(text.find("Round 2 was hit much harder than the others: 0.90 cores busy against a "
                        "median of 0.19"),
              std::string::npos)
        << text;
    EXPECT_EQ(text.find("Round 1 was"), std::string::npos) << text;
}

TEST(Noise, OneRoundNamesTheVariantsTheBusySpellHit) {
    // Sequential (one round): "lean" ran while another process burned a core.
    const Results r =
        run_of({"baseline", "fast", "lean"}, 1, 5, [](int v, int) { return v == 2 ? 100.0 : 0.0; });
    const NoiseSummary n = summarize_noise(r);
    EXPECT_EQ(n.rounds, 1);
    const std::string text = all_of(noise_sentences(n, 0));
    EXPECT_NE(text.find("1.00 at most (lean, steps 1–5)"), std::string::npos) << text;
    EXPECT_NE(text.find("Slices hit (more than 0.25 cores busy): lean (1.00, steps 1–5)."),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("With one round, only lean ran while the machine was busy"),
              std::string::npos)
        << text;
    EXPECT_EQ(text.find("much harder"), std::string::npos) << text;  // one round: no such rule
}

TEST(Noise, StealAndTheGpuClockAreNamed) {
    Results r = run_of({"baseline", "fast"}, 2, 2, [](int, int) { return 10.0; });
    // fast's round-1 steps: 10 ms of the 10 ms were steal (0.10 cores); a power-capped clock.
    for (StepRow& s : r.variants[1].steps)
        if (s.round == 1) {
            s.steal_ms = 10;
            s.sm_clock_mhz = 1410;
            s.throttle_reasons = std::vector<std::string>{"gpu_idle", "sw_power_cap"};
        }
    for (VariantResult& v : r.variants)
        for (StepRow& s : v.steps)
            if (!s.sm_clock_mhz && !s.warmup) {
                s.sm_clock_mhz = 1980;
                s.throttle_reasons = std::vector<std::string>{"gpu_idle"};  // idle: not a slowdown
            }
    const NoiseSummary n = summarize_noise(r);
    EXPECT_TRUE(n.has_device_clock());
    EXPECT_FALSE(n.quiet());
    const NoiseSlice* s = n.slice("fast", 1);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->figures.slowdowns, std::vector<std::string>{"sw_power_cap"});
    EXPECT_EQ(*s->figures.min_sm_clock_mhz, 1410);
    EXPECT_TRUE(n.slice("baseline", 0)->figures.slowdowns.empty());
    const std::string text = all_of(noise_sentences(n, 2));
    EXPECT_NE(text.find("steal, in cores; part of the figures above): fast round 1 (0.10)"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("GPU SM clock 1410–1980 MHz; throttled in fast round 1 (sw_power_cap)."),
              std::string::npos)
        << text;
    const std::string md = render_noise_md(r);
    EXPECT_NE(md.find("| fast | 0.10 (0.00) · 1980 MHz | 0.10 (0.10) · 1410 MHz sw_power_cap |"),
              std::string::npos)
        << md;
}

TEST(Noise, TheReportHasTheSectionAfterTheComparison) {
    // Through the runner's own recording path (step_row): a hand-made variant whose steps saw
    // others take 30 ms per 10 ms step (3 cores busy).
    HandMadeExperiment ex;
    ex.name = "noise";
    ex.baseline = "baseline";
    for (const char* name : {"baseline", "other"}) {
        HandMadeRun run;
        run.config.variant = name;
        for (int i = 0; i < 4; ++i) {
            StepRecord s;
            s.step = i;
            s.warmup = i == 0;
            s.times.wall_ms = 10;
            s.loss = 5;
            s.other_cpu_ms = std::string(name) == "other" ? 30 : 0;
            run.steps.push_back(s);
        }
        ex.runs.push_back(run);
    }
    const Results r = ex.results();
    const std::string md = render_report_md(r);
    const size_t noise = md.find("## Machine noise");
    ASSERT_NE(noise, std::string::npos);
    EXPECT_GT(noise, md.find("## Comparison"));
    EXPECT_NE(md.find("Slices hit (more than 0.25 cores busy): round 0: other (3.00, step 1); "
                      "round 1: other (3.00, step 2); round 2: other (3.00, step 3)."),
              std::string::npos)
        << md;
    EXPECT_NE(md.find("| other | **3.00** |"), std::string::npos) << md;
    // report.html renders the same section (from report.md): the hit slice in bold.
    const std::string html = render_report_html(r);
    EXPECT_NE(html.find("<h2>Machine noise</h2>"), std::string::npos);
    EXPECT_NE(html.find("<strong>3.00</strong>"), std::string::npos);
}

TEST(Noise, ATrainRunNamesItsBusiestStretch) {
    std::vector<StepRow> steps;
    for (int i = 1; i <= 40; ++i) steps.push_back(step(i, -1, i >= 21 && i <= 25 ? 170.0 : 0.0));
    steps.front().warmup = true;  // never counted
    steps.front().other_cpu_ms = 900;
    const TrainNoise t = noise_of_steps(steps, 5, 500);
    EXPECT_EQ(t.all.steps, 39);
    EXPECT_NEAR(t.all.cores_busy(), 5 * 170.0 / (39 * 100.0), 1e-12);
    EXPECT_EQ(t.busiest_first, 21);
    EXPECT_EQ(t.busiest_last, 25);
    EXPECT_NEAR(t.busiest_cores, 1.7, 1e-12);
    EXPECT_EQ(train_noise_line(t),
              "machine: other processes took 0.22 cores on average, 1.70 at most (steps 21–25); "
              "steal 0");
    // Fewer steps than the window: the whole run is the stretch.
    const TrainNoise short_run = noise_of_steps({step(7, -1, 50), step(8, -1, 50)}, 16, 2000);
    EXPECT_EQ(short_run.busiest_first, 7);
    EXPECT_EQ(short_run.busiest_last, 8);
    EXPECT_NEAR(short_run.busiest_cores, 0.5, 1e-12);
    EXPECT_EQ(train_noise_line(short_run),
              "machine: other processes took 0.50 cores on average over steps 7–8 (0.2 s of step "
              "time); steal 0");
    EXPECT_EQ(train_noise_line(noise_of_steps({}, 16, 2000)), "");
    // Millisecond steps: the stretch spans min_wall_ms of step time, not min_steps steps, so one
    // step's 10 ms tick (10 cores busy over 1 ms) does not read as the busiest stretch.
    std::vector<StepRow> fast;
    for (int i = 1; i <= 3000; ++i) {
        StepRow s = step(i, -1, i == 100 ? 10.0 : (i % 10 == 0 ? 2.0 : 0.0));
        s.wall_ms = 1;
        fast.push_back(s);
    }
    const TrainNoise f = noise_of_steps(fast, 16, 1000);
    EXPECT_EQ(f.busiest_last - f.busiest_first + 1, 1000);
    EXPECT_LE(f.busiest_first, 100);
    EXPECT_GE(f.busiest_last, 100);
    EXPECT_NEAR(f.busiest_cores, (10.0 + 99 * 2.0) / 1000.0, 1e-9);
}

}  // namespace
}  // namespace mt
