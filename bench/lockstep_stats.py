"""The statistics of a lockstep comparison (bench/cpu_lockstep.py): two processes that took turns
step by step, A B A B ..., so each step of one ran between two steps of the other.

Why pairs of neighbouring steps: on a shared machine the speed drifts over seconds and minutes
(another tenant, the clock, the memory bus). Two processes run one after the other meet
different stretches of it, and their ratio carries the difference; two steps a fraction of a
second apart meet the same one. A step of A sandwiched between two steps of B is compared with
their mean, which also cancels a drift that is linear over the three steps:

    ratio_i = a_i / ((b_before_i + b_after_i) / 2)

The ratio of the comparison is the median of these ratios, with a distribution-free 95 %
confidence interval of that median from the order statistics (the number of ratios below the
true median is Binomial(n, 1/2)), and a goal is judged on the interval, not the point: met when
all of it is at or below the goal, missed when all of it is above, otherwise undecided at this
noise (more steps narrow the interval). The ratio can also depend on the load itself, not only
drift with it: load_halves shows the ratio in the less and the more loaded half of the steps.
Standard library only.
"""

import math


def sandwich_ratios(a_spans, a_ms, b_spans, b_ms):
    """Ratios a_i / mean(b before, b after) for every step of A that has a step of B on both
    sides in time. *_spans: [start, end] per step (any clock shared by both); *_ms: the step
    times to compare (same order). Raises ValueError when two steps overlap (the processes did
    not take turns)."""
    return [r for _, r in sandwiches(a_spans, a_ms, b_spans, b_ms)]


def sandwiches(a_spans, a_ms, b_spans, b_ms):
    """(i, ratio) for each sandwiched step i of A, in time order (see sandwich_ratios)."""
    if len(a_spans) != len(a_ms) or len(b_spans) != len(b_ms):
        raise ValueError("each step needs a span and a time")
    events = sorted([(s, e, "a", i) for i, (s, e) in enumerate(a_spans)] +
                    [(s, e, "b", i) for i, (s, e) in enumerate(b_spans)])
    for (s0, e0, w0, i0), (s1, _, w1, i1) in zip(events, events[1:]):
        if s1 < e0:
            raise ValueError(f"step {i0} of {w0.upper()} (ends {e0:.3f}) overlaps step {i1} of "
                             f"{w1.upper()} (starts {s1:.3f}): the processes did not take turns")
    ratios = []
    for k, (_, _, who, i) in enumerate(events):
        if who != "a" or k == 0 or k + 1 == len(events):
            continue
        before, after = events[k - 1], events[k + 1]
        if before[2] == "b" and after[2] == "b":
            ratios.append((i, a_ms[i] / (0.5 * (b_ms[before[3]] + b_ms[after[3]]))))
    return ratios


def load_halves(a_ms, indexed_ratios):
    """Does the ratio move with the machine's load? The sandwiched steps split in two halves by
    the load around each: the mean time of A's two neighbouring steps (i-1 and i+1: neither is
    in ratio i, so a step's own noise cannot sort it into a half). Returns (median ratio of the
    less loaded half, of the more loaded half, steps per half), or None with fewer than 4 steps
    that have both neighbours. Two programs that lean on the memory bus differently slow down
    differently when another tenant loads it: then the two halves differ, and a ratio measured
    on a busy machine is not the quiet machine's."""
    scored = sorted((0.5 * (a_ms[i - 1] + a_ms[i + 1]), r) for i, r in indexed_ratios
                    if 0 < i < len(a_ms) - 1)
    if len(scored) < 4:
        return None
    h = len(scored) // 2
    return median([r for _, r in scored[:h]]), median([r for _, r in scored[-h:]]), h


def median(v):
    s = sorted(v)
    n = len(s)
    if n == 0:
        raise ValueError("median of nothing")
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def median_ci(values, confidence=0.95):
    """Distribution-free interval for the median: the order statistics x(k) and x(n+1-k) (1-based)
    with the largest k such that P(k <= Binomial(n, 1/2) <= n - k) >= confidence. Returns
    (low, high, coverage); (min, max, coverage of that) when n is too small for the confidence."""
    s = sorted(values)
    n = len(s)
    if n == 0:
        raise ValueError("an interval of nothing")
    pmf = [math.comb(n, j) / 2.0 ** n for j in range(n + 1)]
    best = None
    for k in range(1, n // 2 + 1):  # x(k) .. x(n+1-k) covers with P(k <= X <= n - k)
        coverage = sum(pmf[k:n - k + 1])
        if coverage >= confidence:
            best = (k, coverage)
        else:
            break
    if best is None:  # too few values: the whole range, with what it covers
        return s[0], s[-1], 1.0 - 2 * pmf[0] if n > 1 else 0.0
    k, coverage = best
    return s[k - 1], s[n - k], coverage


def verdict(low, high, goal):
    """A goal 'ratio <= goal' judged on the median's interval."""
    if goal is None:
        return "no goal"
    if high <= goal:
        return "met"
    if low > goal:
        return "missed"
    return "undecided at this noise"


def ratio_verdict(ratios, goal):
    """Paired ratios (each from two runs that met the same stretch of the machine: sandwiched
    steps, or the two processes of one benchmark round) summarised the one way both CPU benchmarks
    report them: the median, its distribution-free interval with the coverage it really has (with
    fewer than 6 values no interval reaches 95 %: it is then min–max, e.g. 75 % for 3 rounds), and
    the goal judged on that interval."""
    low, high, coverage = median_ci(ratios)
    return {"median": median(ratios), "low": low, "high": high, "coverage": coverage,
            "min": min(ratios), "max": max(ratios), "n": len(ratios),
            "verdict": verdict(low, high, goal)}
