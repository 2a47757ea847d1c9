"""From a loaded workload to its jobs: rates, variants, the job list, run-time decisions.

Owns what is derived from a validated `Workload` (workloads.model):

- `apply_intensity`: the arrival rate set from a traffic intensity (needs the
  networks' manifests); `with_label_probability`: the workload with every
  `probability:` condition changed, for the context-aware sweeps;
- `generate_jobs`: the seeded list of `JobSpec` (arrival times and the
  networks each job runs);
- `should_run`: whether a network runs in a job, asked by an executor once its
  upstreams have finished;
- the packaged scenario files (`list_scenarios`, `scenario_path`,
  `resolve_workload_path`).

Input tensors are workloads.inputs; reading and validating files is
workloads.loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from masa.common.errors import UserError
from masa.sched.jobs import JobSpec
from model_prep.manifest import NetworkManifest
from workloads.arrivals import (
    US_PER_S,
    arrival_times_us,
    draw_networks,
    rate_for_intensity,
    with_rate,
)
from workloads.conditions import conditions_hold
from workloads.model import UpstreamOutputs, Workload

SCENARIO_DIR = Path(__file__).parent / "scenarios"


# ------------------------------------------------------------ variants


def apply_intensity(
    workload: Workload,
    manifests: Mapping[str, NetworkManifest],
    intensity: float | None = None,
) -> Workload:
    """The workload with its arrival rate set from a traffic intensity.

    intensity defaults to the workload's `intensity:`; the mean network time is
    taken over the workload's networks (profiles, or estimates when unprofiled).
    """
    target = intensity if intensity is not None else workload.intensity
    if target is None:
        raise UserError(f"{workload.source}: at 'intensity': no intensity to apply")
    if workload.arrivals.kind == "trace":
        raise UserError(f"{workload.source}: at 'intensity': trace arrivals have fixed times")
    try:
        rate_per_s = rate_for_intensity(target, manifests, workload.networks)
    except (KeyError, ValueError) as error:
        raise UserError(f"{workload.source}: at 'intensity': {error}") from None
    return replace(workload, arrivals=with_rate(workload.arrivals, rate_per_s),
                   intensity=float(target))


def with_label_probability(workload: Workload, probability: float) -> Workload:
    """The workload with every `probability:` condition set to `probability`.

    For the context-aware benchmarks, which sweep the label probability of the
    light and heavy scenarios (0, 0.25, ..., 1) on one file.
    """
    if not 0.0 <= probability <= 1.0:
        raise ValueError(f"probability must be in [0, 1], got {probability}")
    nodes = tuple(
        replace(node, when=tuple(
            replace(c, probability=float(probability)) if c.kind == "probability" else c
            for c in node.when))
        for node in workload.nodes
    )
    return replace(workload, nodes=nodes)


# ------------------------------------------------------------ generating jobs


def generate_jobs(workload: Workload, rng: np.random.Generator | None = None) -> list[JobSpec]:
    """The workload's jobs: arrival times and networks, deterministic for a seed.

    Without rng, a generator seeded with `arrivals.seed` is used. Arrival times
    and compositions come from two independent child streams, so changing the
    composition never moves the arrivals.
    """
    if not workload.rate_resolved:
        raise UserError(f"{workload.source}: at 'intensity': the arrival rate depends on the "
                        "networks' execution times: load the workload with a store (--store) "
                        "or call apply_intensity with their manifests")
    base = rng if rng is not None else np.random.default_rng(workload.arrivals.seed)
    arrival_rng, composition_rng = base.spawn(2)
    times_us = arrival_times_us(workload.arrivals, arrival_rng)
    networks = workload.networks
    return [
        JobSpec(job_id=index, arrival_us=int(time_us),
                networks=draw_networks(workload.composition, networks, composition_rng))
        for index, time_us in enumerate(times_us)
    ]


def mean_interarrival_ms(jobs: list[JobSpec]) -> float:
    """Mean gap between consecutive arrivals (0 for fewer than two jobs)."""
    if len(jobs) < 2:
        return 0.0
    return (jobs[-1].arrival_us - jobs[0].arrival_us) / (len(jobs) - 1) / (US_PER_S / 1000)


# -------------------------------------------------------------- at run time


def should_run(workload: Workload, network: str, job_id: int,
               upstream_outputs: UpstreamOutputs) -> bool:
    """Whether `network` runs in this job, once all its upstreams have finished.

    upstream_outputs maps each upstream network to its outputs. A network
    without `when:` always runs (its upstreams still have to finish first in
    CA-wait). The caller skips (or aborts) every transitive downstream when
    this is False (see Workload.downstreams).
    """
    return conditions_hold(workload.node(network).when, upstream_outputs, workload.seed, job_id)


# -------------------------------------------------------------- scenarios


def list_scenarios() -> tuple[str, ...]:
    """Names of the packaged scenario files."""
    return tuple(sorted(path.stem for path in SCENARIO_DIR.glob("*.yaml")))


def resolve_workload_path(text: str | Path) -> Path:
    """A workload file path, or the name of a packaged scenario ('lifelogging').

    An existing file wins; otherwise a packaged scenario of that name; otherwise
    the path itself, so that load_workload reports it as missing.
    """
    path = Path(text)
    if path.is_file() or path.suffix or len(path.parts) > 1:
        return path
    candidate = SCENARIO_DIR / f"{path.name}.yaml"
    return candidate if candidate.is_file() else path


def scenario_path(name: str) -> Path:
    """The packaged scenario NAME (e.g. 'lifelogging'), as a path for load_workload."""
    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"no scenario {name!r} (packaged scenarios: "
                        f"{', '.join(list_scenarios()) or 'none'})")
    return path
