"""Arrival processes, per-job network composition, and traffic intensity.

Owns the pure, seeded generators that turn a workload's `arrivals:` and
`composition:` sections into arrival times (integer microseconds) and network
sets, and the paper's traffic intensity: the arrival rate normalised by the
mean execution time of the scenario's networks,

    intensity = rate_per_s * mean_time_s,

so intensity 1 means that, on average, a new input arrives every time one
network run (alone, loading included by default) would have finished.

Every generator takes a `numpy.random.Generator`; nothing here reads a clock
or the global RNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from masa.common.errors import UserError
from masa.sched.jobs import network_time_us
from model_prep.manifest import NetworkManifest

ARRIVAL_KINDS = ("periodic", "normal", "poisson", "trace")
COMPOSITION_KINDS = ("all", "subset", "one")
US_PER_S = 1_000_000
_T = TypeVar("_T")


@dataclass(frozen=True)
class Arrival:
    """When jobs arrive. Fields not used by `kind` stay None.

    - periodic: job i at start_us + i * interval_us;
    - normal: gaps ~ Normal(mean_us, std_us), negative gaps clipped to 0;
    - poisson: gaps ~ Exponential(1 / rate_per_s);
    - trace: the explicit times_us (non-decreasing), the first `count` of them.
    The first job always arrives at start_us (for trace: at times_us[0]).
    """

    kind: str
    count: int
    seed: int = 0
    start_us: int = 0
    interval_us: int | None = None
    mean_us: int | None = None
    std_us: int | None = None
    cv: float | None = None  # normal: std as a fraction of the mean (used with intensity)
    rate_per_s: float | None = None
    times_us: tuple[int, ...] | None = None

    @property
    def mean_rate_per_s(self) -> float | None:
        """Mean arrival rate implied by the parameters (None for a trace of one job)."""
        if self.kind == "periodic" and self.interval_us:
            return US_PER_S / self.interval_us
        if self.kind == "normal" and self.mean_us:
            return US_PER_S / self.mean_us
        if self.kind == "poisson":
            return self.rate_per_s
        if self.kind == "trace" and self.times_us and len(self.times_us) > 1:
            span_us = self.times_us[-1] - self.times_us[0]
            return (len(self.times_us) - 1) * US_PER_S / span_us if span_us > 0 else None
        return None


@dataclass(frozen=True)
class Composition:
    """Which of the workload's networks each job runs.

    - all: every network (deterministic scenarios);
    - subset: a size drawn uniformly in [min_size, max_size], then a uniformly
      drawn subset of that size (the paper's stochastic scenario II);
    - one: one network drawn uniformly (stochastic scenario I).
    """

    kind: str = "all"
    min_size: int = 1
    max_size: int | None = None  # None: all networks


# ------------------------------------------------------------------ arrivals


def periodic_times_us(count: int, interval_us: int, start_us: int = 0) -> np.ndarray:
    return start_us + interval_us * np.arange(count, dtype=np.int64)


def normal_times_us(
    count: int, mean_us: float, std_us: float, rng: np.random.Generator, start_us: int = 0
) -> np.ndarray:
    """Inter-arrival gaps from Normal(mean, std) clipped at 0: simultaneous, never earlier."""
    gaps_us = np.clip(rng.normal(mean_us, std_us, size=max(count - 1, 0)), 0.0, None)
    return _from_gaps(gaps_us, start_us)


def poisson_times_us(
    count: int, rate_per_s: float, rng: np.random.Generator, start_us: int = 0
) -> np.ndarray:
    """A Poisson process: exponential gaps with mean 1/rate."""
    gaps_us = rng.exponential(US_PER_S / rate_per_s, size=max(count - 1, 0))
    return _from_gaps(gaps_us, start_us)


def trace_times_us(times_us: Sequence[int], count: int | None = None) -> np.ndarray:
    times = np.asarray(times_us, dtype=np.int64)
    return times if count is None else times[:count]


def _from_gaps(gaps_us: np.ndarray, start_us: int) -> np.ndarray:
    # Round the cumulative sum, not each gap, so rounding never drifts.
    cumulative_us = np.concatenate(([0.0], np.cumsum(gaps_us)))
    return start_us + np.rint(cumulative_us).astype(np.int64)


# Arrival times are int64 microseconds: a process spanning more is refused (UserError),
# not wrapped around (an intensity of 1e-300 would make a gap of 1e306 us).
MAX_SPAN_US = 2**62


def _check_span(arrival: Arrival) -> None:
    rate = arrival.mean_rate_per_s
    gap_us = arrival.std_us or 0
    if rate is not None:
        gap_us += US_PER_S / rate if rate > 0 else float("inf")
    if arrival.start_us + gap_us * 4 * arrival.count > MAX_SPAN_US:
        raise UserError(f"arrivals: {arrival.count} jobs with a mean gap of {gap_us:.3g} us "
                        "span more than the clock holds (2**62 us): raise the rate or the "
                        "intensity, or lower the count")


def arrival_times_us(arrival: Arrival, rng: np.random.Generator) -> np.ndarray:
    """The arrival times (int64 microseconds, non-decreasing) of `arrival.count` jobs."""
    _check_span(arrival)
    if arrival.kind == "periodic":
        return periodic_times_us(arrival.count, _need(arrival.interval_us, "interval_us"),
                                 arrival.start_us)
    if arrival.kind == "normal":
        mean_us = _need(arrival.mean_us, "mean_us")
        std_us = arrival.std_us if arrival.std_us is not None else (
            (arrival.cv or 0.0) * mean_us)
        return normal_times_us(arrival.count, mean_us, std_us, rng, arrival.start_us)
    if arrival.kind == "poisson":
        return poisson_times_us(arrival.count, _need(arrival.rate_per_s, "rate_per_s"), rng,
                                arrival.start_us)
    if arrival.kind == "trace":
        return trace_times_us(_need(arrival.times_us, "times_us"), arrival.count)
    raise ValueError(f"unknown arrival kind {arrival.kind!r}")


def _need(value: _T | None, field_name: str) -> _T:
    # Arrival objects built by hand (not by the loader) may miss their parameter.
    if value is None:
        raise ValueError(f"arrivals need {field_name} for this kind")
    return value


def with_rate(arrival: Arrival, rate_per_s: float) -> Arrival:
    """The same process at another mean rate (periodic, normal, poisson only).

    A normal process keeps its coefficient of variation (std / mean).
    """
    if rate_per_s <= 0:
        raise ValueError(f"rate must be positive, got {rate_per_s}")
    mean_us = US_PER_S / rate_per_s
    if arrival.kind == "periodic":
        return replace(arrival, interval_us=max(1, round(mean_us)))
    if arrival.kind == "normal":
        if arrival.cv is not None:
            cv = arrival.cv
        elif arrival.std_us is not None and arrival.mean_us:
            cv = arrival.std_us / arrival.mean_us
        else:
            cv = 0.0
        return replace(arrival, mean_us=max(1, round(mean_us)), std_us=round(cv * mean_us),
                       cv=cv)
    if arrival.kind == "poisson":
        return replace(arrival, rate_per_s=float(rate_per_s))
    raise ValueError(f"cannot set the rate of {arrival.kind!r} arrivals")


# --------------------------------------------------------------- composition


def draw_networks(
    composition: Composition, networks: Sequence[str], rng: np.random.Generator
) -> tuple[str, ...]:
    """The networks one job runs, in the order of `networks`."""
    if composition.kind == "all":
        return tuple(networks)
    if composition.kind == "one":
        return (networks[int(rng.integers(len(networks)))],)
    if composition.kind == "subset":
        max_size = composition.max_size if composition.max_size is not None else len(networks)
        size = int(rng.integers(composition.min_size, max_size + 1))
        chosen = rng.choice(len(networks), size=size, replace=False)
        return tuple(networks[index] for index in sorted(int(i) for i in chosen))
    raise ValueError(f"unknown composition kind {composition.kind!r}")


# --------------------------------------------------------- traffic intensity


def mean_network_time_s(
    manifests: Mapping[str, NetworkManifest],
    networks: Sequence[str] | None = None,
    include_load: bool = True,
) -> float:
    """Mean time of one network run alone over `networks` (default: all manifests).

    A network's time is the sum of its stages' EXEC durations plus, with
    include_load (the default, since every job loads its layers), their LOAD
    durations, from the profile or the documented estimates of masa.sched.jobs.
    """
    names = list(networks) if networks is not None else sorted(manifests)
    if not names:
        raise ValueError("traffic intensity needs at least one network")
    missing = [name for name in names if name not in manifests]
    if missing:
        raise KeyError(f"no manifest for {', '.join(missing)}")
    total_us = sum(network_time_us(manifests[name], include_load) for name in names)
    return total_us / len(names) / US_PER_S


def traffic_intensity(
    rate_per_s: float,
    manifests: Mapping[str, NetworkManifest],
    networks: Sequence[str] | None = None,
    include_load: bool = True,
) -> float:
    """The paper's traffic intensity: arrival rate x mean network time."""
    return rate_per_s * mean_network_time_s(manifests, networks, include_load)


def rate_for_intensity(
    intensity: float,
    manifests: Mapping[str, NetworkManifest],
    networks: Sequence[str] | None = None,
    include_load: bool = True,
) -> float:
    """The arrival rate (per second) that gives `intensity`."""
    if intensity <= 0:
        raise ValueError(f"intensity must be positive, got {intensity}")
    mean_time_s = mean_network_time_s(manifests, networks, include_load)
    if mean_time_s <= 0:
        raise ValueError("networks have zero execution time; intensity is undefined")
    return intensity / mean_time_s
