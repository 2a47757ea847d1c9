"""Benchmark: splitting every zoo model at scale 1, and what running it as stages costs.

For each of the paper's nine networks (workloads/zoo.py, scale 1) this script:
- builds the model and saves it to a temporary file;
- splits it with the preparator (`model_prep.split`), timed (the split time
  includes writing the stage files and the manifest, without profiling);
- runs the whole model and the stage chain with one intra-op thread
  (`model_prep.session.create_session`), alternating whole run / chain run so that
  load from other processes hits both alike, and reports the ratio
  median(sum of the stage run times of one chain pass) / median(whole run time),
  in wall time (the target: <= 1.05 on every model) and in the calling
  thread's CPU time (with one intra-op thread ORT computes on the calling
  thread, so this one is robust to other processes sharing the cores);
- repeats the runs on a coarser split (`--min-stage-bytes 1MiB`: consecutive
  stages merged until each holds 1 MiB of weights), once more on the
  default split with graph optimisation level ORT_ENABLE_EXTENDED instead of
  ALL (diagnostic: no NCHWc layout transformer, so no layout reorders at the
  stage boundaries), and on the ORT-optimised split (`--ort-optimize`: the
  stages are cut from the graph ONNX Runtime optimises the whole model into,
  so blocked NCHWc tensors cross the cuts), always against the original
  whole model;
- checks that the chain's outputs equal the whole model's.
Each measurement runs in a fresh (spawned) process, so the variants do not
share allocator state.

Prints the table and writes docs/bench-split.md (atomically). Exit status 0
when the ORT-optimised split meets the target on every model in CPU time.

    /work/venv/bin/python benchmarks/bench_split.py [--runs 21] [--repeats 3] [NAMES...]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from masa.common.atomic import atomic_write_text
from model_prep.manifest import NetworkManifest, load_manifest
from model_prep.session import create_session, release_memory, session_options
from model_prep.split import split_model
from workloads.zoo import MIB, ZOO_NAMES, ZOO_SPECS, check_names, save_model

REPO = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.05


VARIANTS = ("create_session", "coarse", "extended", "ort_optimized")
COARSE_STAGE_BYTES = MIB


@dataclass(frozen=True)
class RunTimes:
    """Medians of one variant's alternating whole / chain runs (one process)."""

    whole_ms: float
    chain_ms: float
    whole_cpu_ms: float
    chain_cpu_ms: float
    max_abs_diff: float

    @property
    def ratio(self) -> float:
        return self.chain_ms / self.whole_ms

    @property
    def cpu_ratio(self) -> float:
        return self.chain_cpu_ms / self.whole_cpu_ms


@dataclass(frozen=True)
class Repeated:
    """One variant measured `--repeats` times, each in a fresh process.

    Ratios are the median of the repeats' ratios: each repeat's whole and
    chain runs alternate, so a burst of load from other processes hits both
    sides of one repeat, and the median drops the repeat it hit hardest.
    """

    repeats: tuple[RunTimes, ...]

    def _median(self, field: str) -> float:
        return statistics.median(getattr(r, field) for r in self.repeats)

    @property
    def whole_ms(self) -> float:
        return self._median("whole_ms")

    @property
    def chain_ms(self) -> float:
        return self._median("chain_ms")

    @property
    def whole_cpu_ms(self) -> float:
        return self._median("whole_cpu_ms")

    @property
    def ratio(self) -> float:
        return self._median("ratio")

    @property
    def cpu_ratio(self) -> float:
        return self._median("cpu_ratio")

    @property
    def cpu_range(self) -> str:
        """' (lowest-highest)' of the repeats' CPU-time ratios; empty for one repeat."""
        if len(self.repeats) < 2:
            return ""
        ratios = [r.cpu_ratio for r in self.repeats]
        return f" ({min(ratios):.3f}-{max(ratios):.3f})"

    @property
    def max_abs_diff(self) -> float:
        return max(r.max_abs_diff for r in self.repeats)


@dataclass(frozen=True)
class SplitResult:
    name: str
    model_mib: float
    stages: int
    conv_stages: int
    fc_stages: int
    build_s: float
    split_s: float
    times: dict[str, Repeated]  # by variant
    coarse_stages: int
    optimized_stages: int
    optimized_split_s: float
    load_1min: float  # the machine's 1-minute load average after the measurements

    @property
    def ratio(self) -> float:
        return self.times["create_session"].ratio


def split_into_store(model_path: Path, network_dir: Path, name: str,
                     min_stage_weight_bytes: int = 0, ort_optimize: bool = False
                     ) -> NetworkManifest:
    """The preparator's public split entry point (no profiling)."""
    network_dir.parent.mkdir(parents=True, exist_ok=True)  # scratch_dir must exist
    return split_model(model_path, network_dir, name,
                       min_stage_weight_bytes=min_stage_weight_bytes,
                       ort_optimize=ort_optimize, scratch_dir=network_dir.parent)


def _session(path: Path, variant: str) -> ort.InferenceSession:
    if variant != "extended":
        return create_session(path, intra_op_threads=1)
    options = session_options(1)
    # Below ORT_ENABLE_ALL: no NCHWc layout transformer, so no layout
    # reorders at stage boundaries (and slower convolutions overall).
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return ort.InferenceSession(str(path), sess_options=options,
                                providers=["CPUExecutionProvider"])


def _time_chain(sessions: list[tuple[ort.InferenceSession, list[str], list[str]]],
                feeds: dict[str, np.ndarray]) -> tuple[float, float, dict[str, np.ndarray]]:
    """One pass over the stage chain: summed (wall s, thread CPU s) of the stage runs only."""
    tensors = dict(feeds)
    wall_s = cpu_s = 0.0
    for session, input_names, output_names in sessions:
        stage_feeds = {n: tensors[n] for n in input_names}
        start_s, start_cpu_s = time.perf_counter(), time.thread_time()
        outputs = session.run(output_names, stage_feeds)
        wall_s += time.perf_counter() - start_s
        cpu_s += time.thread_time() - start_cpu_s
        tensors.update(zip(output_names, outputs, strict=True))
    return wall_s, cpu_s, tensors


def measure_runs(model_path: Path, network_dir: Path, variant: str, runs: int,
                 seed: int) -> RunTimes:
    """Whole model vs stage chain, alternating; meant to run in a fresh process."""
    manifest = load_manifest(network_dir)
    whole = _session(model_path, variant)
    chain = [(_session(manifest.stage_path(stage), variant),
              [t.name for t in stage.inputs], [t.name for t in stage.outputs])
             for stage in manifest.stages]
    output_names = [o.name for o in manifest.outputs]
    rng = np.random.default_rng(seed)
    feeds = {t.name: rng.standard_normal(t.shape, dtype=np.float32) for t in manifest.inputs}

    # Warm-up: first runs allocate and pack; neither side should pay that in the figures.
    expected = whole.run(output_names, feeds)
    tensors = _time_chain(chain, feeds)[2]
    max_abs_diff = max(float(np.max(np.abs(tensors[n] - e)))
                       for n, e in zip(output_names, expected, strict=True))
    whole_s: list[float] = []
    whole_cpu_s: list[float] = []
    chain_s: list[float] = []
    chain_cpu_s: list[float] = []
    for _ in range(runs):
        start_s, start_cpu_s = time.perf_counter(), time.thread_time()
        whole.run(output_names, feeds)
        whole_s.append(time.perf_counter() - start_s)
        whole_cpu_s.append(time.thread_time() - start_cpu_s)
        wall, cpu, _ = _time_chain(chain, feeds)
        chain_s.append(wall)
        chain_cpu_s.append(cpu)
    median = statistics.median
    return RunTimes(median(whole_s) * 1e3, median(chain_s) * 1e3, median(whole_cpu_s) * 1e3,
                    median(chain_cpu_s) * 1e3, max_abs_diff)


def bench_one(name: str, work_dir: Path, runs: int, seed: int, repeats: int = 1
              ) -> SplitResult:
    model_path = work_dir / f"{name}.onnx"
    start = time.perf_counter()
    save_model(name, model_path, scale=1.0, seed=seed)
    build_s = time.perf_counter() - start
    release_memory()

    network_dir = work_dir / "store" / name
    start = time.perf_counter()
    manifest = split_into_store(model_path, network_dir, name)
    split_s = time.perf_counter() - start
    coarse_dir = work_dir / "coarse" / name
    coarse = split_into_store(model_path, coarse_dir, name, COARSE_STAGE_BYTES)
    release_memory()
    optimized_dir = work_dir / "optimized" / name
    start = time.perf_counter()
    optimized = split_into_store(model_path, optimized_dir, name, ort_optimize=True)
    optimized_split_s = time.perf_counter() - start
    release_memory()
    directories = {"create_session": network_dir, "coarse": coarse_dir,
                   "extended": network_dir, "ort_optimized": optimized_dir}

    context = multiprocessing.get_context("spawn")
    measured: dict[str, list[RunTimes]] = {variant: [] for variant in VARIANTS}
    for _ in range(repeats):
        # Variants interleaved per repeat, so a long burst of load is not all one variant's.
        for variant in VARIANTS:
            with context.Pool(1) as pool:
                # The whole model is always the original one, also for the optimised split.
                measured[variant].append(pool.apply(
                    measure_runs, (model_path, directories[variant], variant, runs, seed)))
    times = {variant: Repeated(tuple(found)) for variant, found in measured.items()}
    return SplitResult(
        name=name, model_mib=model_path.stat().st_size / MIB, stages=len(manifest.stages),
        conv_stages=sum(s.layer_type == "conv" for s in manifest.stages),
        fc_stages=sum(s.layer_type == "fc" for s in manifest.stages),
        build_s=build_s, split_s=split_s, times=times, coarse_stages=len(coarse.stages),
        optimized_stages=len(optimized.stages), optimized_split_s=optimized_split_s,
        load_1min=os.getloadavg()[0],
    )


def markdown_table(results: list[SplitResult]) -> str:
    lines = [
        "| network | model MiB | stages (conv/fc) | build s | split s | whole ms | "
        "sum of stages ms | ratio | CPU-time ratio | coarse split: stages, ratio (CPU) | "
        "without NCHWc: ratio (CPU) | max abs diff | ORT-optimised split: stages, split s | "
        "ORT-optimised: ratio | ORT-optimised: CPU-time ratio | ORT-optimised: max abs diff "
        "vs original | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def over(ratio: float) -> str:
        return "" if ratio <= TARGET_RATIO else " (over)"

    for r in results:
        main, coarse = r.times["create_session"], r.times["coarse"]
        extended, optimized = r.times["extended"], r.times["ort_optimized"]
        mark, cpu_mark = over(main.ratio), over(main.cpu_ratio)
        lines.append(
            f"| {ZOO_SPECS[r.name].paper_name} | {r.model_mib:.1f} | {r.stages} "
            f"({r.conv_stages}/{r.fc_stages}) | {r.build_s:.1f} | {r.split_s:.2f} | "
            f"{main.whole_ms:.1f} | {main.chain_ms:.1f} | {main.ratio:.3f}{mark} | "
            f"{main.cpu_ratio:.3f}{cpu_mark}{main.cpu_range} | {r.coarse_stages}, "
            f"{coarse.ratio:.3f} ({coarse.cpu_ratio:.3f}) | {extended.cpu_ratio:.3f} (whole model "
            f"{extended.whole_cpu_ms / main.whole_cpu_ms:.2f}x the CPU time) | "
            f"{max(t.max_abs_diff for v, t in r.times.items() if v != 'ort_optimized'):.1e} | "
            f"{r.optimized_stages}, {r.optimized_split_s:.2f} | "
            f"{optimized.ratio:.3f}{over(optimized.ratio)} | "
            f"{optimized.cpu_ratio:.3f}{over(optimized.cpu_ratio)}{optimized.cpu_range} | "
            f"{optimized.max_abs_diff:.1e} | {r.load_1min:.1f} |")
    return "\n".join(lines)


def diagnosis(results: list[SplitResult]) -> str:
    """Which overhead keeps each network over the target, judged on CPU-time ratios."""
    def names(keep: list[SplitResult]) -> str:
        return ", ".join(ZOO_SPECS[r.name].paper_name for r in keep) or "none"

    def within(variant: str, keep: list[SplitResult], cpu: bool = True) -> list[SplitResult]:
        return [r for r in keep if (r.times[variant].cpu_ratio if cpu
                                    else r.times[variant].ratio) <= TARGET_RATIO]

    over = [r for r in results if r.times["create_session"].cpu_ratio > TARGET_RATIO]
    coarse = within("coarse", over)
    layout = within("extended", over)
    optimized_cpu = within("ort_optimized", results)
    optimized_wall = within("ort_optimized", results, cpu=False)
    optimized_over = [r for r in results if r not in optimized_cpu]
    default_cpu = within("create_session", results)
    return (f"Default split (one weighted operator per stage): within the target in CPU "
            f"time on {len(default_cpu)} of {len(results)} networks; over it: {names(over)}. "
            f"Of those, within it with the coarse split: {names(coarse)}; without NCHWc "
            f"layout reorders (at a slower whole model): {names(layout)}.\n"
            f"ORT-optimised split (`--ort-optimize`): within the target in CPU time on "
            f"{len(optimized_cpu)} of {len(results)} networks (over it: "
            f"{names(optimized_over)}), in wall time on {len(optimized_wall)} of "
            f"{len(results)}.")


def write_report(results: list[SplitResult], runs: int, repeats: int, path: Path) -> None:
    worst = max(results, key=lambda r: r.ratio)
    over = [ZOO_SPECS[r.name].paper_name for r in results if r.ratio > TARGET_RATIO]
    text = f"""# Split benchmark

Written by `benchmarks/bench_split.py` (run: `python benchmarks/bench_split.py`).

Every zoo network (docs/zoo.md) at scale 1: the time to split it into
per-layer stage files with the preparator (`model_prep.split.split_model`:
stage files and manifest written, no profiling), and the cost of running it as
a chain of stage sessions instead of one session, with 1 intra-op thread.
Per run the whole model and then the stage chain run on the same random input;
"whole ms" and "sum of stages ms" are medians over {runs} runs after one
warm-up run each, and "sum of stages" counts only the stage `run` calls (not
the Python glue between them). Ratio = sum of stages / whole, target <= {TARGET_RATIO}.
Every variant was measured {repeats} time(s), each in a fresh process, the
variants interleaved; the table gives the median of the repeats' ratios and,
for the two main CPU-time columns, the lowest-highest repeat in parentheses
(one full run on this shared machine is not enough to call a 2% difference).

- "ratio": wall time, sessions from `model_prep.session.create_session` (what the
  profiler and the executors run).
- "CPU-time ratio": the same runs measured in the calling thread's CPU time
  (with one intra-op thread ONNX Runtime computes on the calling thread), which
  other processes competing for the cores inflate far less than wall time, but
  not at all only on an idle machine (caches and memory bandwidth are shared:
  at a load of 4-5 on 2 cores single full runs moved by up to +-0.05).
- "coarse split": the same model split with `--min-stage-bytes 1MiB`
  (consecutive stages merged until each holds 1 MiB of weights): its stage
  count, and its ratio in wall (CPU) time.
- "without NCHWc": the default split at graph optimisation level
  ORT_ENABLE_EXTENDED instead of ALL, so ONNX Runtime's NCHWc layout
  transformer is off and no stage converts its input into the blocked layout
  and its output back (CPU-time ratio vs the whole model at the same level; the
  whole model's CPU time is then the factor given times that at ALL).
- The diagnostic columns give CPU-time ratios only: on a shared machine the
  wall-time ratios of separate runs are too noisy to compare.
- "load": the machine's 1-minute load average when that network's runs ended
  (2 cores: above 2, other processes were waiting for a core).
- "max abs diff": the stage chain's outputs vs the whole model's (default,
  coarse and without-NCHWc splits).
- "ORT-optimised": the model split with `masa prepare --ort-optimize`
  (model_prep/optimize.py): ONNX Runtime optimises the whole model once at the
  level the sessions use (ORT_ENABLE_ALL), every tensor is typed, and that
  graph is cut, one weighted operator (here NCHWc or fused convolutions and
  Gemms) per stage. The tensors crossing the cuts are then the blocked NCHWc
  ones the whole model passes on, so no stage reorders its input and output.
  Its stage count and split time (optimising included), and its ratios
  against the ORIGINAL whole model, in wall and CPU time; "max abs diff vs
  original": its outputs vs the original model's.

{markdown_table(results)}

Worst ratio: {worst.ratio:.3f} ({ZOO_SPECS[worst.name].paper_name}) in wall time,
{max(r.times["create_session"].cpu_ratio for r in results):.3f} in CPU time; with the
coarse split {max(r.times["coarse"].ratio for r in results):.3f} in wall time,
{max(r.times["coarse"].cpu_ratio for r in results):.3f} in CPU time; with the
ORT-optimised split {max(r.times["ort_optimized"].ratio for r in results):.3f} in wall
time, {max(r.times["ort_optimized"].cpu_ratio for r in results):.3f} in CPU time.
{"Default split: all networks meet the target (wall time)." if not over else
 "Default split, over the target in wall time: " + ", ".join(over) + "."}
{diagnosis(results)}

The ORT-optimised stage files hold hardware-specific operators (ONNX Runtime
says so itself): they are for the onnxruntime version and machine type the
manifest records (`ort_optimized`, docs/manifest.md), and loading them
elsewhere logs a warning. The default split stays portable.

Machine: {platform.machine()}, {os.cpu_count()} cores, Python
{platform.python_version()}, onnxruntime {ort.__version__}. The machine was
shared with other work while this ran, so wall times carry noise; whole and
chain runs alternate so that noise hits both alike.
"""
    atomic_write_text(path, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"zoo networks (default: all of "
                        f"{', '.join(ZOO_NAMES)})")
    parser.add_argument("--runs", type=int, default=21, help="timed runs per model and variant")
    parser.add_argument("--repeats", type=int, default=3,
                        help="measurements per model and variant, each in a fresh process; "
                             "the table gives the median (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench-split.md")
    args = parser.parse_args(argv)
    names = check_names(args.names) if args.names else list(ZOO_NAMES)
    results = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"bench-split-{name}-") as work_dir:
            result = bench_one(name, Path(work_dir), args.runs, args.seed, args.repeats)
        results.append(result)
        main_times = result.times["create_session"]
        optimized = result.times["ort_optimized"]
        print(f"{name}: split {result.split_s:.2f} s, whole {main_times.whole_ms:.1f} ms, "
              f"stages {main_times.chain_ms:.1f} ms, ratio {main_times.ratio:.3f} "
              f"(CPU {main_times.cpu_ratio:.3f}; coarse split, {result.coarse_stages} "
              f"stages: {result.times['coarse'].ratio:.3f}; ORT-optimised split, "
              f"{result.optimized_stages} stages: {optimized.ratio:.3f}, CPU "
              f"{optimized.cpu_ratio:.3f}, max abs diff {optimized.max_abs_diff:.1e})",
              flush=True)
    print(markdown_table(results))
    print(diagnosis(results))
    write_report(results, args.runs, args.repeats, args.out)
    print(f"wrote {args.out}")
    # Exit status: does the ORT-optimised split meet the target everywhere, in
    # CPU time (the figure other processes on the machine do not inflate)?
    return 0 if all(r.times["ort_optimized"].cpu_ratio <= TARGET_RATIO for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
