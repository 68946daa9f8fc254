#!/usr/bin/env python3
"""bench/lockstep_stats.py on simulated data with known answers (ctest `lockstep_stats`): the
sandwich ratio cancels a linear drift exactly where the ratio of medians does not; steps that
overlap are refused; the median's interval is the order statistics the binomial tables give
(n 5, 10, 20) and covers the true median as often as it says on 2000 simulated comparisons; a
ratio that depends on the load shows in the two load halves and noise alone does not; the goal
is judged on the interval, for run_cpu_bench.sh's few rounds too (min–max at the coverage it has).

    python3 tests/lockstep_stats_test.py [-v]
"""
import math
import os
import random
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import lockstep_stats as s  # noqa: E402


def alternating(n_a, n_b, a_first=True, step=1.0, gap=0.5):
    """Spans of two sides taking turns: A B A B ... (or B A ...), each step `step` long."""
    spans_a, spans_b, t = [], [], 0.0
    order = ["a", "b"] if a_first else ["b", "a"]
    while len(spans_a) < n_a or len(spans_b) < n_b:
        for who in order:
            lst, n = (spans_a, n_a) if who == "a" else (spans_b, n_b)
            if len(lst) < n:
                lst.append([t, t + step])
                t += step + gap
    return spans_a, spans_b


class SandwichRatios(unittest.TestCase):
    def test_a_linear_drift_cancels_exactly(self):
        # The machine slows down linearly in time; A is exactly half as slow as B at any moment.
        spans_a, spans_b = alternating(12, 12)
        drift = lambda t: 100.0 + 7.5 * t  # noqa: E731
        a_ms = [0.5 * drift(sp[0]) for sp in spans_a]
        b_ms = [drift(sp[0]) for sp in spans_b]
        ratios = s.sandwich_ratios(spans_a, a_ms, spans_b, b_ms)
        self.assertEqual(len(ratios), 11)  # A's first step has no B before it
        for r in ratios:
            self.assertAlmostEqual(r, 0.5, places=12)
        # What the sandwich removes: A runs first in every pair, so the ratio of medians is off.
        self.assertLess(s.median(a_ms) / s.median(b_ms), 0.49)

    def test_only_steps_with_the_peer_on_both_sides_count(self):
        spans_a, spans_b = alternating(5, 5, a_first=False)  # B A B A ... A last
        ratios = s.sandwich_ratios(spans_a, [1.0] * 5, spans_b, [2.0] * 5)
        self.assertEqual(ratios, [0.5] * 4)  # A's last step has no B after it

    def test_overlapping_steps_are_refused(self):
        spans_a, spans_b = alternating(4, 4)
        spans_b[2] = [spans_b[2][0] - 0.7, spans_b[2][1]]  # starts before A's step ends
        with self.assertRaisesRegex(ValueError, "did not take turns"):
            s.sandwich_ratios(spans_a, [1.0] * 4, spans_b, [1.0] * 4)

    def test_spans_and_times_must_match(self):
        spans_a, spans_b = alternating(3, 3)
        with self.assertRaises(ValueError):
            s.sandwich_ratios(spans_a, [1.0] * 2, spans_b, [1.0] * 3)


class MedianInterval(unittest.TestCase):
    def test_order_statistics_of_the_binomial_tables(self):
        x = list(range(1, 11))  # x(i) = i
        low, high, cover = s.median_ci(x)
        self.assertEqual((low, high), (2, 9))  # n 10: x(2)..x(9)
        self.assertAlmostEqual(cover, 1 - 2 * 11 / 1024, places=12)
        low, high, cover = s.median_ci(list(range(1, 21)))
        self.assertEqual((low, high), (6, 15))  # n 20: x(6)..x(15)
        self.assertAlmostEqual(cover, 1 - 2 * sum(math.comb(20, j) for j in range(6)) / 2 ** 20)

    def test_too_few_values_give_the_range_and_its_coverage(self):
        low, high, cover = s.median_ci([5, 1, 4, 2, 3])
        self.assertEqual((low, high), (1, 5))
        self.assertAlmostEqual(cover, 1 - 2 / 32)  # 0.9375 < 0.95: said, not hidden

    def test_covers_the_true_median_as_often_as_it_says(self):
        rng = random.Random(20261206)
        n, trials, true_median = 21, 2000, 0.5
        hits, covers = 0, []
        for _ in range(trials):
            v = [true_median * math.exp(rng.gauss(0.0, 0.1)) for _ in range(n)]
            low, high, cover = s.median_ci(v)
            covers.append(cover)
            hits += low <= true_median <= high
        stated = covers[0]
        self.assertGreaterEqual(stated, 0.95)
        self.assertLess(abs(hits / trials - stated), 0.015)  # ~3.5 standard errors


class LoadHalves(unittest.TestCase):
    def test_a_ratio_that_depends_on_the_load_shows_in_the_halves(self):
        # Quiet and loaded stretches of 10 turns each; under load A is 1.2x slower, B 1.4x:
        # the true ratio is 0.5 quiet and 0.5 * 1.2 / 1.4 loaded.
        spans_a, spans_b = alternating(40, 40)
        loaded = lambda k: (k // 10) % 2 == 1  # noqa: E731
        a_ms = [50.0 * (1.2 if loaded(k) else 1.0) for k in range(40)]
        b_ms = [100.0 * (1.4 if loaded(k) else 1.0) for k in range(40)]
        pairs = s.sandwiches(spans_a, a_ms, spans_b, b_ms)
        quiet, busy, n = s.load_halves(a_ms, pairs)
        self.assertEqual(n, 19)
        self.assertAlmostEqual(quiet, 0.5, places=12)
        self.assertAlmostEqual(busy, 0.5 * 1.2 / 1.4, places=12)

    def test_noise_alone_does_not_split_the_halves(self):
        # A/A with independent noise on every step: sorting by the neighbours' times must not
        # sort the ratios (a step's own noise is not in its neighbours).
        rng = random.Random(7)
        spans_a, spans_b = alternating(401, 401)
        a_ms = [100.0 * math.exp(rng.gauss(0.0, 0.05)) for _ in range(401)]
        b_ms = [100.0 * math.exp(rng.gauss(0.0, 0.05)) for _ in range(401)]
        quiet, busy, n = s.load_halves(a_ms, s.sandwiches(spans_a, a_ms, spans_b, b_ms))
        self.assertEqual(n, 199)
        self.assertLess(abs(quiet - busy), 0.02)  # ~2.5 standard errors of their difference

    def test_too_few_steps(self):
        spans_a, spans_b = alternating(4, 4)
        self.assertIsNone(s.load_halves([1.0] * 4,
                                        s.sandwiches(spans_a, [1.0] * 4, spans_b, [1.0] * 4)))


class Verdict(unittest.TestCase):
    def test_judged_on_the_interval(self):
        self.assertEqual(s.verdict(0.45, 0.49, 0.50), "met")
        self.assertEqual(s.verdict(0.51, 0.56, 0.50), "missed")
        self.assertEqual(s.verdict(0.48, 0.52, 0.50), "undecided at this noise")
        self.assertEqual(s.verdict(0.9, 1.1, None), "no goal")

    def test_three_rounds_that_straddle_the_goal_are_undecided(self):
        # run_cpu_bench.sh's 3 rounds: the interval is min–max, which covers the median with
        # probability 1 - 2 (1/2)^3 = 0.75; one round on the other side of the goal leaves the
        # verdict open (it once printed "missed (1 of 3 within)").
        q = s.ratio_verdict([0.56, 0.45, 0.59], 0.50)
        self.assertEqual((q["median"], q["low"], q["high"]), (0.56, 0.45, 0.59))
        self.assertAlmostEqual(q["coverage"], 0.75, places=12)
        self.assertEqual(q["verdict"], "undecided at this noise")
        self.assertEqual(s.ratio_verdict([0.52, 0.51, 0.53], 0.50)["verdict"], "missed")
        self.assertEqual(s.ratio_verdict([0.47, 0.49, 0.48], 0.50)["verdict"], "met")

    def test_many_values_use_the_order_statistics_interval(self):
        # 20 ratios 0.40, 0.41, ... 0.59: the 95 % interval is x(6)..x(15) (binomial table), so
        # 0.45..0.54 straddles 0.50, and 0.55 as a goal is met, 0.44 missed.
        ratios = [0.40 + 0.01 * i for i in range(20)]
        random.Random(3).shuffle(ratios)
        q = s.ratio_verdict(ratios, 0.50)
        self.assertAlmostEqual(q["low"], 0.45, places=12)
        self.assertAlmostEqual(q["high"], 0.54, places=12)
        self.assertEqual((q["n"], q["verdict"]), (20, "undecided at this noise"))
        self.assertEqual(s.ratio_verdict(ratios, 0.55)["verdict"], "met")
        self.assertEqual(s.ratio_verdict(ratios, 0.44)["verdict"], "missed")
        self.assertEqual(s.ratio_verdict(ratios, None)["verdict"], "no goal")


if __name__ == "__main__":
    unittest.main()
