"""The drift alarm: has live acceptance at a draft position fallen below what the profile says, by more than chance
allows?

The test, per position p, is a one-sided Bernoulli CUSUM (Page 1954) on blocks of verifies:

- In control, a verify that reaches p accepts it with probability at least p0, the profile's acceptance at p
  lowered to its Wilson lower bound at ``z`` standard errors (the profile is a sample too). Out of control the
  probability is p1 = p0 * (1 - drop): the test is tuned to a relative drop of ``drop``.
- Each block (the plugin's flush interval, one second) brings n attempts and a acceptances, and its log-likelihood
  ratio a ln(p1/p0) + (n - a) ln((1 - p1)/(1 - p0)). S = max(0, S + LLR); the alarm fires when S >= h
  (``threshold``, in nats), once per episode: a new alarm needs S back at 0 first (acceptance recovered).
- False alarms. Started at any block, the one-sided test crosses h with probability at most e^-h when verifies
  accept independently with probability >= p0 (exp(LLR) is then a non-negative supermartingale: Ville's
  inequality). Every alarm episode starts at a distinct block, so the expected number of false alarms per hour is at
  most positions * (3600 / block_seconds) * e^-h, whatever the traffic (blocks without traffic add nothing).
  With h = 16, three positions and one-second blocks: at most 1.2e-3 per hour, one per 830 hours per server.
  Verifies of one request are not independent (a hard passage lowers several in a row), so the bound is a
  model's; tests/test_acceptance_drift.py measures the real rate by simulation.
- Detection. A position that stops accepting adds ln((1 - p1)/(1 - p0)) per attempt: about h / that many attempts
  (with p0 = 0.7 and drop 0.2, 0.38 nats each: 42 attempts at h = 16).

Positions whose lower bound p0 is below :data:`MIN_RATE` are not tested (no drop below nothing can be seen).
Pure Python.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

DEFAULT_DROP = 0.2
DEFAULT_THRESHOLD = 16.0
DEFAULT_Z = 3.0
BLOCK_SECONDS = 1.0
MIN_RATE = 0.02
DROP_RANGE = (0.01, 0.9)
THRESHOLD_RANGE = (4.0, 80.0)


@dataclass(frozen=True)
class DriftSettings:
    drop: float = DEFAULT_DROP              # the relative drop the test is tuned to
    threshold: float = DEFAULT_THRESHOLD    # h, in nats
    z: float = DEFAULT_Z                    # standard errors below the profile's estimate
    block_seconds: float = BLOCK_SECONDS    # one block of verifies (the plugin's flush interval)

    def __post_init__(self):
        for name, v, (lo, hi) in (("drop", self.drop, DROP_RANGE), ("threshold", self.threshold, THRESHOLD_RANGE),
                                  ("z", self.z, (0.0, 10.0)), ("block_seconds", self.block_seconds, (1e-3, 3600.0))):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
                raise ValueError(f"drift {name}: expected a number in [{lo}, {hi}], got {v!r}")


def wilson_lower(accepted: int, attempts: int, z: float) -> float:
    """The Wilson score interval's lower end for accepted / attempts at z standard errors (0 for no attempts)."""
    if attempts <= 0:
        return 0.0
    p = accepted / attempts
    z2 = z * z
    centre = p + z2 / (2 * attempts)
    half = z * math.sqrt(p * (1 - p) / attempts + z2 / (4 * attempts * attempts))
    return max(0.0, (centre - half) / (1 + z2 / attempts))


def false_alarms_per_hour(threshold: float, positions: int, block_seconds: float = BLOCK_SECONDS) -> float:
    """The bound on expected false alarms per hour (see the module's text)."""
    return positions * (3600.0 / block_seconds) * math.exp(-threshold)


def threshold_for(per_hour: float, positions: int, block_seconds: float = BLOCK_SECONDS) -> float:
    """The threshold h whose bound is `per_hour` false alarms per hour."""
    if not per_hour > 0:
        raise ValueError(f"false alarms per hour: expected > 0, got {per_hour!r}")
    return math.log(positions * 3600.0 / block_seconds / per_hour)


@dataclass(frozen=True)
class Alarm:
    """One alarm: the position, what was seen since the statistic last stood at 0, and what the profile says."""

    position: int
    live_accepted: int
    live_attempts: int
    expected: float          # the profile's acceptance at the position
    expected_low: float      # p0: its lower bound
    tuned_to: float          # p1
    sample: int              # the profile's attempts at the position
    statistic: float
    threshold: float

    def line(self) -> str:
        live = self.live_accepted / self.live_attempts if self.live_attempts else float("nan")
        return (f"eagle3_capture: acceptance drift ALARM at draft position {self.position}: "
                f"{self.live_accepted} of {self.live_attempts} verifies that reached it accepted it ({live:.1%}) "
                f"against the profile's {self.expected:.1%} (n={self.sample}; at least {self.expected_low:.1%} "
                f"within chance); CUSUM {self.statistic:.1f} >= {self.threshold:g} (tuned to a fall to "
                f"{self.tuned_to:.1%}); the capture may have drifted: check it with `eagle3-capture doctor online`")


@dataclass
class PositionDrift:
    """The CUSUM of one position."""

    position: int
    expected: float
    sample: int
    settings: DriftSettings
    p0: float = field(init=False)
    p1: float = field(init=False)
    statistic: float = 0.0
    in_alarm: bool = False
    run_attempts: int = 0        # since the statistic last stood at 0
    run_accepted: int = 0

    def __post_init__(self):
        self.p0 = wilson_lower(round(self.expected * self.sample), self.sample, self.settings.z)
        self.p1 = self.p0 * (1.0 - self.settings.drop)
        self._down = math.log(self.p1 / self.p0) if self.monitored else 0.0          # per acceptance (< 0)
        self._up = math.log((1 - self.p1) / (1 - self.p0)) if self.monitored else 0.0  # per rejection (> 0)

    @property
    def monitored(self) -> bool:
        return self.p0 >= MIN_RATE and self.p0 < 1.0

    @property
    def ratio(self) -> float:
        """The statistic over the threshold (the alarm fires at 1)."""
        return self.statistic / self.settings.threshold

    def update(self, attempts: int, accepted: int) -> Optional[Alarm]:
        if attempts < 0 or not 0 <= accepted <= attempts:
            raise ValueError(f"position {self.position}: {accepted} accepted of {attempts} attempts")
        if not self.monitored or attempts == 0:
            return None
        s = self.statistic + accepted * self._down + (attempts - accepted) * self._up
        if s <= 0.0:
            self.statistic, self.run_attempts, self.run_accepted, self.in_alarm = 0.0, 0, 0, False
            return None
        self.statistic = s
        self.run_attempts += attempts
        self.run_accepted += accepted
        if s >= self.settings.threshold and not self.in_alarm:
            self.in_alarm = True
            return Alarm(self.position, self.run_accepted, self.run_attempts, self.expected, self.p0, self.p1,
                         self.sample, s, self.settings.threshold)
        return None


class DriftMonitor:
    """Every position's CUSUM, fed per block with the attempts and acceptances per position."""

    def __init__(self, expected: Sequence[Tuple[int, int]], settings: DriftSettings = DriftSettings()):
        """`expected`: per position 1..P, the profile's (attempts, accepted)."""
        self.settings = settings
        self.positions = [PositionDrift(i + 1, (a / n if n else 0.0), n, settings)
                          for i, (n, a) in enumerate(expected)]

    @classmethod
    def from_profile(cls, profile, settings: DriftSettings = DriftSettings()) -> "DriftMonitor":
        att, acc = profile.attempts_accepted()
        return cls(list(zip(att, acc)), settings)

    def update(self, attempts: Sequence[int], accepted: Sequence[int]) -> List[Alarm]:
        """One block; returns the alarms it raised (a position raises once per episode)."""
        if len(attempts) != len(self.positions) or len(accepted) != len(self.positions):
            raise ValueError(f"a block of {len(attempts)} / {len(accepted)} positions for a monitor of "
                             f"{len(self.positions)}")
        out = []
        for p, n, a in zip(self.positions, attempts, accepted):
            alarm = p.update(int(n), int(a))
            if alarm is not None:
                out.append(alarm)
        return out

    def false_alarms_per_hour(self) -> float:
        return false_alarms_per_hour(self.settings.threshold, sum(p.monitored for p in self.positions),
                                     self.settings.block_seconds)


__all__ = ["DriftSettings", "DriftMonitor", "PositionDrift", "Alarm", "wilson_lower", "false_alarms_per_hour",
           "threshold_for", "DEFAULT_DROP", "DEFAULT_THRESHOLD", "DEFAULT_Z", "BLOCK_SECONDS", "MIN_RATE",
           "DROP_RANGE", "THRESHOLD_RANGE"]
