"""The drift alarm (acceptance/drift.py) by simulation: the false-alarm rate in control stays under the bound the
plugin's startup line states, and the detection delay of a total failure and of a 30% drop is what the CUSUM's
drift per verify says. Pure Python, seeded: the figures are printed (pytest -s) and asserted.

Traffic: verifies of a chain of 3 draft positions; the draft at p is accepted with probability r[p] given the
earlier ones were (so the histogram of correct drafts follows), one block = one flush of `PER_BLOCK` verifies.
"""
from __future__ import annotations

import math
import random

import pytest

from eagle3_capture.acceptance.drift import (
    Alarm, DriftMonitor, DriftSettings, false_alarms_per_hour, threshold_for, wilson_lower,
)
from eagle3_capture.acceptance.positions import attempts_accepted
from acceptance_sim import simulated_verify

RATES = (0.8, 0.7, 0.6)        # the profile's acceptance per position
SAMPLE = 4000                  # the profile's verifies
PER_BLOCK = 20


def _profile_counts(rates=RATES, n=SAMPLE):
    """(attempts, accepted) per position of a profile of n verifies at exactly these rates."""
    out, reach = [], n
    for r in rates:
        acc = round(reach * r)
        out.append((reach, acc))
        reach = acc
    return out


_verify = simulated_verify


def _block(rates, rnd, n=PER_BLOCK):
    h = [0] * (len(rates) + 1)
    for _ in range(n):
        h[_verify(rates, rnd)] += 1
    return attempts_accepted(h, len(rates))


def _run(monitor, rates_of_block, blocks, rnd):
    """Feed `blocks` blocks; [(block, alarm)]."""
    out = []
    for b in range(blocks):
        att, acc = _block(rates_of_block(b), rnd)
        out += [(b, a) for a in monitor.update(att, acc)]
    return out


def test_false_alarms_in_control_stay_under_the_bound():
    """Worst case the bound allows: every position accepts at exactly p0 (the profile's Wilson lower bound).
    A low threshold (h = 5) makes alarms frequent enough to count in two simulated hours of one-second blocks."""
    settings = DriftSettings(threshold=5.0)
    monitor = DriftMonitor(_profile_counts(), settings)
    p0 = [p.p0 for p in monitor.positions]
    hours = 2
    alarms = _run(monitor, lambda b: p0, int(hours * 3600 / settings.block_seconds), random.Random(1))
    rate = len(alarms) / hours
    bound = monitor.false_alarms_per_hour()
    print(f"\nin control at p0 {[round(x, 3) for x in p0]}, h=5: {rate:.1f} false alarms per hour "
          f"(bound {bound:.1f})")
    assert rate <= bound


def test_false_alarms_with_correlated_requests_stay_under_the_bound():
    """Verifies of one request are not independent: here each block's traffic comes from a few requests, each with
    its own difficulty (its rates scaled by a factor of mean 1), at the profile's own rates."""
    settings = DriftSettings(threshold=5.0)
    monitor = DriftMonitor(_profile_counts(), settings)
    rnd = random.Random(2)
    hours = 2

    def rates(_b):
        f = rnd.choice((0.85, 1.0, 1.15))
        return [min(1.0, r * f) for r in RATES]

    alarms = _run(monitor, rates, int(hours * 3600), rnd)
    rate = len(alarms) / hours
    print(f"\ncorrelated in-control traffic, h=5: {rate:.1f} false alarms per hour "
          f"(bound {monitor.false_alarms_per_hour():.1f})")
    assert rate <= monitor.false_alarms_per_hour()


def _delay(rates_after, runs=30, seed=3, settings=DriftSettings()):
    """Verifies from a change (monitor fresh: statistic 0) to the first alarm, per run, and the positions named."""
    delays, named = [], set()
    rnd = random.Random(seed)
    for _ in range(runs):
        monitor = DriftMonitor(_profile_counts(), settings)
        for b in range(100000):
            att, acc = _block(rates_after, rnd, 1)  # block of one verify: the delay to the verify
            got = monitor.update(att, acc)
            if got:
                delays.append(b + 1)
                named |= {a.position for a in got}
                break
        else:
            pytest.fail(f"no alarm in 100000 verifies at rates {rates_after}")
    return delays, named


def test_detection_delay_of_a_total_failure():
    """Position 1 stops accepting: every verify adds ln((1 - p1)/(1 - p0)) at position 1, so the alarm comes at
    ceil(h / that) verifies exactly."""
    delays, named = _delay((0.0, RATES[1], RATES[2]), runs=3)
    m = DriftMonitor(_profile_counts())
    p = m.positions[0]
    want = math.ceil(m.settings.threshold / math.log((1 - p.p1) / (1 - p.p0)))
    print(f"\ntotal failure at position 1: alarm after {delays} verifies (CUSUM: {want})")
    assert delays == [want] * 3 and named == {1}


def test_detection_delay_of_a_30_percent_drop():
    """Every position accepts 30% less than the profile (more than the 20% the test is tuned to): the mean delay is
    near Wald's h / E[LLR per verify] at position 1 (each verify reaches it)."""
    dropped = tuple(r * 0.7 for r in RATES)
    delays, named = _delay(dropped, runs=30)
    p = DriftMonitor(_profile_counts()).positions[0]
    a = dropped[0]
    drift = a * math.log(p.p1 / p.p0) + (1 - a) * math.log((1 - p.p1) / (1 - p.p0))
    wald = DriftSettings().threshold / drift
    mean = sum(delays) / len(delays)
    print(f"\n30% drop: alarm after {mean:.0f} verifies on average (min {min(delays)}, max {max(delays)}; "
          f"Wald at position 1: {wald:.0f}); positions named {sorted(named)}")
    assert drift > 0 and mean <= 1.5 * wald and 1 in named


def test_no_alarm_without_traffic_and_one_per_episode():
    monitor = DriftMonitor(_profile_counts())
    assert monitor.update([0, 0, 0], [0, 0, 0]) == []
    first = monitor.update([200, 0, 0], [0, 0, 0])
    assert [a.position for a in first] == [1] and isinstance(first[0], Alarm)
    assert monitor.update([50, 0, 0], [0, 0, 0]) == []  # the same episode
    monitor.update([5000, 4000, 2800], [4000, 2800, 1700])  # recovered: back to 0
    assert monitor.positions[0].statistic == 0 and not monitor.positions[0].in_alarm
    assert [a.position for a in monitor.update([200, 0, 0], [0, 0, 0])] == [1]  # a new episode
    line = first[0].line()
    assert "\n" not in line and line.startswith("eagle3_capture: acceptance drift ALARM at draft position 1: 0 of ")


def test_the_bound_and_its_inverse():
    assert false_alarms_per_hour(16.0, 3) == pytest.approx(3 * 3600 * math.exp(-16))
    assert threshold_for(false_alarms_per_hour(16.0, 3), 3) == pytest.approx(16.0)
    assert wilson_lower(0, 0, 3.0) == 0.0 and 0 < wilson_lower(70, 100, 3.0) < 0.7
    with pytest.raises(ValueError, match="drift threshold: expected a number in"):
        DriftSettings(threshold=1.0)
    with pytest.raises(ValueError, match="a block of 2 / 2 positions for a monitor of 3"):
        DriftMonitor(_profile_counts()).update([1, 1], [1, 1])
