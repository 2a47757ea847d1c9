"""`masa prepare` and `masa verify`: turn an ONNX model into a prepared network in a store.

This module owns the store side of preparation: `prepare_network` splits the
model (model_prep.split), runs the stages once on a sample input and fixes
the cut tensors' shapes to what they really were (model_prep.stage_shapes;
with `--no-profile` it only loads every stage once), optionally verifies the
stages against the whole model (model_prep.verify) and profiles them on the
tensors they received (model_prep.profile), all inside a temporary directory
in the store, and only then renames that directory to `DIR/NAME`. With
`--ort-optimize` the ONNX Runtime-optimised model the stages are cut from
(model_prep.optimize) is made in that temporary directory too, beside the
network directory, and never reaches the store.
A failed or interrupted prepare therefore leaves the store as it was; an
existing network of the same name is replaced only once the new one is
complete.

The two commands follow masa.cli.main's exit codes (a verification
mismatch or ONNX Runtime failing while verifying is 1, bad input 2) and print
one JSON document with `--json`.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from masa.common.errors import RunFailed, UserError, one_line
from masa.common.output import add_json_flag, print_json
from masa.common.progress import ProgressBar
from masa.common.units import parse_memory_bytes
from model_prep.feeds import bind_feeds, load_feeds
from model_prep.manifest import (
    LOAD_MODES,
    MANIFEST_NAME,
    NetworkManifest,
    load_manifest,
    manifest_to_dict,
    record_stage_files,
    write_manifest,
)
from model_prep.planner import DEFAULT_MAX_CUT_TENSORS
from model_prep.profile import profile_network
from model_prep.sample_run import SAMPLE_DIM, sample_feeds
from model_prep.shapes import parse_input_shape
from model_prep.slicing import max_stage_bytes_for_target
from model_prep.split import check_model_file, check_network_name, default_network_name, split_model
from model_prep.stage_files import DEFAULT_LOAD_MODE
from model_prep.stage_shapes import check_stages_load, fix_shapes_on_sample
from model_prep.store_lock import prepare_lock, remove_retired, retire_network
from model_prep.summary import stage_summary
from model_prep.verify import VerifyMismatch, VerifyResult, verify_network

log = logging.getLogger(__name__)

# "~" cannot occur in a network name, so ".prepare~a~*" never matches the
# temporary directory of network "a-b" (or "a.b").
_TEMP_PREFIX = ".prepare~"


@dataclass(frozen=True)
class PreparedNetwork:
    manifest: NetworkManifest  # directory: the final DIR/NAME
    verify: VerifyResult | None
    split_time_s: float
    profile_time_s: float | None
    sample_time_s: float | None = None  # the sample and probe runs (None: not run)


def prepare_network(
    model_path: str | Path,
    store_dir: str | Path,
    name: str | None = None,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    *,
    profile: bool = True,
    profile_runs: int | None = None,
    verify: bool = False,
    seed: int = 0,
    verify_feeds: Mapping[str, np.ndarray] | None = None,
    max_cut_tensors: int = DEFAULT_MAX_CUT_TENSORS,
    min_stage_weight_bytes: int = 0,
    ort_optimize: bool | None = None,
    show_progress: bool | None = None,
    load_mode: str = DEFAULT_LOAD_MODE,
    max_stage_weight_bytes: int = 0,
    sample_input: str | Path | None = None,
) -> PreparedNetwork:
    """Split (+ sample run) (+ verify) (+ profile) MODEL into `store_dir/name`, atomically.

    name defaults to the model file's stem. ort_optimize: cut ONNX Runtime's
    optimised graph (see model_prep.optimize); None: in load mode mmap when the
    input dims are fixed (model_prep.split.wants_ort_optimize); verify still
    compares with the original model. load_mode: "mmap" (weights mapped, not copied, by a LOAD) or
    "copy" (model_prep.stage_files). show_progress: None draws a bar when stderr is a terminal.
    max_stage_weight_bytes: slice larger Gemm/MatMul/Conv operators (model_prep.slicing).
    With profile, or a sample_input (.npz/.npy), the stages run once on that input
    (default: seeded random data of the declared shapes) and every cut tensor's
    shape is fixed to what it really was (model_prep.stage_shapes); profiling then
    measures each stage on the tensors it received. Otherwise every stage file is
    loaded once in ONNX Runtime. Raises UserError on bad input, and its subclass
    RunFailed when verify or profiling fails (VerifyMismatch for a mismatch),
    leaving the store untouched.
    """
    model_path = check_model_file(model_path)  # before the store is created
    sample = (str(Path(sample_input).resolve()), load_feeds(sample_input)) \
        if sample_input is not None else None
    name = check_network_name(name) if name is not None else default_network_name(model_path)
    store = Path(store_dir)
    final_dir = store / name
    _check_store(store, final_dir)
    # One prepare per name at a time: the stale-folder clean-up below would
    # otherwise delete a running prepare's work folder.
    with prepare_lock(store, name):
        return _prepare_locked(model_path, store, name, input_shapes, profile=profile,
                               profile_runs=profile_runs, verify=verify, seed=seed,
                               verify_feeds=verify_feeds, max_cut_tensors=max_cut_tensors,
                               min_stage_weight_bytes=min_stage_weight_bytes,
                               ort_optimize=ort_optimize, show_progress=show_progress,
                               load_mode=load_mode,
                               max_stage_weight_bytes=max_stage_weight_bytes, sample=sample)


def _prepare_locked(
    model_path: Path, store: Path, name: str,
    input_shapes: Mapping[str, Sequence[int | str]] | None, *, profile: bool,
    profile_runs: int | None, verify: bool, seed: int,
    verify_feeds: Mapping[str, np.ndarray] | None, max_cut_tensors: int,
    min_stage_weight_bytes: int, ort_optimize: bool | None, show_progress: bool | None,
    load_mode: str, max_stage_weight_bytes: int,
    sample: tuple[str, dict[str, np.ndarray]] | None,
) -> PreparedNetwork:
    final_dir = store / name
    _remove_stale_temp_dirs(store, name)
    remove_retired(store, name)
    try:
        work_dir = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{name}~", dir=store))
    except OSError as exc:
        raise UserError(f"{store}: cannot write the store: {exc.strerror or exc}") from None
    try:
        # Inside the try: a signal that lands while this line is being logged (the
        # handler runs Python code after the write) must still remove the folder.
        log.debug("preparing %s in %s", name, work_dir)
        network_dir = work_dir / name
        started_s = time.perf_counter()
        with ProgressBar(f"split {name}", enabled=show_progress) as bar:
            manifest = split_model(model_path, network_dir, name, input_shapes,
                                   max_cut_tensors=max_cut_tensors,
                                   min_stage_weight_bytes=min_stage_weight_bytes,
                                   progress=bar, ort_optimize=ort_optimize,
                                   scratch_dir=work_dir, load_mode=load_mode,
                                   max_stage_weight_bytes=max_stage_weight_bytes)
        split_time_s = time.perf_counter() - started_s
        sample_time_s, stage_inputs = None, None
        if profile or sample is not None:
            started_s = time.perf_counter()
            manifest, stage_inputs = _fix_shapes(manifest, model_path, seed, sample,
                                                 work_dir / "sample")
            write_manifest(manifest, network_dir / MANIFEST_NAME)
            sample_time_s = time.perf_counter() - started_s
        else:
            check_stages_load(manifest)
        verify_result = None
        if verify:
            feeds = bind_feeds(manifest, verify_feeds) if verify_feeds is not None else None
            verify_result = verify_network(manifest, model_path, np.random.default_rng(seed),
                                           feeds=feeds)
        profile_time_s = None
        if profile:
            started_s = time.perf_counter()
            kwargs = {} if profile_runs is None else {"runs": profile_runs}
            with ProgressBar(f"profile {name}", enabled=show_progress) as bar:
                profiles, runtime_base = profile_network(manifest, progress=bar, seed=seed,
                                                         stage_inputs=stage_inputs, **kwargs)
            manifest = manifest.with_profiles(profiles, runtime_base)
            write_manifest(manifest, network_dir / MANIFEST_NAME)
            profile_time_s = time.perf_counter() - started_s
        record_stage_files(manifest)  # the first run checks them by stat, unread
        _install(network_dir, final_dir)
        # The replaced version (if any) is in the work folder now: a run may pin it.
        for old in (network_dir, network_dir.with_name(network_dir.name + ".old")):
            if old.is_dir():
                retire_network(old, store, name)
    except OSError as exc:  # a full or read-only disk: the run failed, the input was fine
        raise RunFailed(f"{store}: cannot write the network {name!r}: "
                        f"{exc.strerror or exc}") from None
    except (ValueError, KeyError, UnicodeDecodeError, DecodeError) as exc:
        _refuse_invalid_model(model_path, exc)  # a corrupted model: one line, exit 2
        raise  # a valid model: a bug of ours (exit 3, the traceback with --debug)
    except RunFailed as exc:  # ONNX Runtime refused a stage: the model's fault, or ours?
        if not isinstance(exc, VerifyMismatch):
            _refuse_invalid_model(model_path, exc)
        raise
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return PreparedNetwork(replace(manifest, directory=final_dir), verify_result,
                           split_time_s, profile_time_s, sample_time_s)


def _fix_shapes(manifest: NetworkManifest, model_path: Path, seed: int,
                sample: tuple[str, dict[str, np.ndarray]] | None, save_dir: Path
                ) -> tuple[NetworkManifest, dict[str, Path]]:
    """Run the stages on the sample (the user's or seeded random data) and fix the cut
    tensors' shapes; each stage's real inputs, saved for the profiler."""
    given, source = (bind_feeds(manifest, sample[1]), sample[0]) if sample else (None, "random")
    feeds, record = sample_feeds(manifest, seed, given, source)
    return fix_shapes_on_sample(manifest, model_path, feeds, record, save_dir)


def _refuse_invalid_model(model_path: Path, exc: Exception) -> None:
    """After `exc` while preparing: UserError (exit 2) when the model itself is invalid,
    so that a byte-corrupted file that still parses is bad input, not a bug of ours.
    Checked only on failure: the ONNX checker, then ONNX Runtime loading the model."""
    if isinstance(exc, UnicodeDecodeError):  # protobuf strings must be UTF-8
        raise UserError(f"{model_path}: not a valid ONNX model: a name or string in it is "
                        f"not UTF-8 ({one_line(exc)})") from None
    import onnx  # imported by the splitter already

    from model_prep.session import create_session

    try:
        onnx.checker.check_model(str(model_path))
        session = create_session(model_path)
        del session
    except Exception as invalid:  # noqa: BLE001 - the checker's and ORT's own types
        raise UserError(f"{model_path}: not a valid ONNX model: {one_line(invalid)} "
                        f"(preparing it failed with {type(exc).__name__}: "
                        f"{one_line(exc)})") from None


def ensure_store(store: Path) -> None:
    """Create the store directory if needed; a file in its place is a UserError."""
    if store.exists() and not store.is_dir():
        raise UserError(f"--store {store}: expected a directory, found a file")
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--store {store}: cannot create the store directory: "
                        f"{exc.strerror or exc}") from None


def _check_store(store: Path, final_dir: Path) -> None:
    ensure_store(store)
    if not os.access(store, os.W_OK | os.X_OK):
        raise UserError(f"--store {store}: cannot write the store (permission denied)")
    if final_dir.exists() and not (final_dir / MANIFEST_NAME).is_file():
        if not final_dir.is_dir() or any(final_dir.iterdir()):
            raise UserError(f"{final_dir}: exists and is not a prepared network; refusing to "
                            "replace it (choose another --name)")


def _remove_stale_temp_dirs(store: Path, name: str) -> None:
    """What an interrupted prepare of this name left behind (never a DIR/NAME)."""
    for stale in store.glob(f"{_TEMP_PREFIX}{name}~*"):
        if stale.is_dir():
            log.info("removing %s, left by an interrupted prepare", stale)
            shutil.rmtree(stale, ignore_errors=True)


def _install(network_dir: Path, final_dir: Path) -> None:
    """Move the finished network into place, replacing an old one only now."""
    if not final_dir.exists():
        os.rename(network_dir, final_dir)
        return
    if _exchange(network_dir, final_dir):
        return  # network_dir now holds the old network; the caller removes it
    # No atomic exchange here: move the old one aside, then the new one in.
    aside = network_dir.with_name(network_dir.name + ".old")
    os.rename(final_dir, aside)
    try:
        os.rename(network_dir, final_dir)
    except OSError:
        os.rename(aside, final_dir)
        raise


def _exchange(first: Path, second: Path) -> bool:
    """Atomically swap two directories (Linux renameat2 RENAME_EXCHANGE)."""
    if not sys.platform.startswith("linux"):
        return False
    libc_name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        renameat2 = ctypes.CDLL(libc_name, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(first), at_fdcwd, os.fsencode(second),
                       rename_exchange)
    return result == 0


# --------------------------------------------------------------- CLI


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare",
        help="split an ONNX model into per-layer stages, profile them, store the network",
        description="Split MODEL.onnx into per-layer stage files and write DIR/NAME/"
                    "manifest.yaml (format: docs/manifest.md), profiling every stage unless "
                    "--no-profile. Atomic: the store is unchanged if anything fails.",
    )
    parser.add_argument("model", metavar="MODEL.onnx", help="the ONNX model to prepare")
    parser.add_argument("--store", required=True, metavar="DIR", help="the model store")
    parser.add_argument("--name", help="network name in the store (default: model file stem)")
    parser.add_argument("--input-shape", action="append", default=[],
                        metavar="NAME=1x3x224x224",
                        help="fix the dims of input NAME (repeatable); a non-number dim "
                             "such as N stays dynamic")
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the sample run and profiling (every stage file is still "
                             "loaded once in ONNX Runtime)")
    parser.add_argument("--sample-input", metavar="X.npz|X.npy",
                        help="run the stages on this input to fix the cut tensors' shapes and "
                             "profile each stage on what it receives (default: seeded random "
                             "data of the declared shapes, dynamic dims 1 for the first, "
                             f"{SAMPLE_DIM} for others); for models whose behaviour depends "
                             "on real values")
    parser.add_argument("--runs", type=int, default=None,
                        help="timed runs per stage when profiling (default: the profiler's)")
    parser.add_argument("--verify", action="store_true",
                        help="run the stages and the whole model on one seeded random input "
                             "and fail unless every output matches within 1e-5 x max|output|")
    parser.add_argument("--verify-input", metavar="X.npy|X.npz",
                        help="verify on this input instead of a random one (.npy for a "
                             "single-input model, .npz with one array per input name)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random sample and verify inputs")
    parser.add_argument("--max-cut-tensors", type=int, default=DEFAULT_MAX_CUT_TENSORS,
                        help="merge stages rather than cut where more tensors than this "
                             "would cross the cut (default %(default)s)")
    parser.add_argument("--min-stage-bytes", default="0", metavar="SIZE",
                        help="merge consecutive stages until each holds this many weight "
                             "bytes, e.g. 1MiB (default 0: one weighted operator per stage)")
    add_load_mode_argument(parser)
    parser.add_argument("--ort-optimize", action=argparse.BooleanOptionalAction, default=None,
                        help="cut the graph ONNX Runtime optimises the model into (fused "
                             "operators, BatchNorm folded, NCHWc layout kept across cuts on "
                             "x86), so mapped stages run at full speed without private "
                             "copies; the stage files then suit only this onnxruntime version "
                             "and machine type. Default: on in load mode mmap when every "
                             "input dim is fixed (declared or --input-shape), off otherwise; "
                             "--no-ort-optimize keeps the stage files portable")
    add_slicing_arguments(parser)
    add_json_flag(parser, "the prepared network (its manifest, timings, verify result)")
    parser.set_defaults(handler=_prepare_command)

    verify_parser = subparsers.add_parser(
        "verify",
        help="check a prepared network's stages against its source model",
        description="Load DIR/NAME/manifest.yaml (checking every stage file's sha256), run "
                    "the stages and the whole model on one seeded random input and compare "
                    "every output (max|diff| <= 1e-5 x max|output|). The whole model is the "
                    "source model as given, also for networks prepared with --ort-optimize.",
    )
    verify_parser.add_argument("network", metavar="DIR/NAME", help="a prepared network")
    verify_parser.add_argument("--model", metavar="MODEL.onnx",
                               help="the source model (default: the path in the manifest)")
    verify_parser.add_argument("--input", metavar="X.npy|X.npz",
                               help="compare on this input instead of a random one")
    verify_parser.add_argument("--seed", type=int, default=0, help="seed of the random input")
    add_json_flag(verify_parser, "the comparison of every output")
    verify_parser.set_defaults(handler=_verify_command)


def add_load_mode_argument(parser: argparse.ArgumentParser) -> None:
    """--load-mode, for `masa prepare` and `masa zoo`."""
    parser.add_argument("--load-mode", choices=LOAD_MODES, default=DEFAULT_LOAD_MODE,
                        help="how stage files hold their weights: 'mmap' (default) writes "
                             "them page-aligned beside each stage so a LOAD maps them "
                             "instead of copying them (the profiler keeps prepacking per "
                             "stage only where it pays for itself); 'copy' keeps them inside "
                             "the stage files, which ONNX Runtime copies (load peak ~2x)")


def add_slicing_arguments(parser: argparse.ArgumentParser) -> None:
    """--max-stage-bytes and --target-memory (read back by `max_stage_bytes`)."""
    slicing = parser.add_mutually_exclusive_group()
    slicing.add_argument("--max-stage-bytes", default=None, metavar="SIZE",
                         help="slice a Gemm, MatMul or Conv whose weights exceed SIZE into "
                              "stages along its outputs, joined by Concat (e.g. 128MiB)")
    slicing.add_argument("--target-memory", default=None, metavar="SIZE",
                         help="the memory budget the network must run in: slice operators "
                              "whose weights exceed a sixteenth of it (--max-stage-bytes "
                              "SIZE/16), so that the stages masa keeps loaded leave room to "
                              "load the others")


def _prepare_command(args: argparse.Namespace) -> int:
    input_shapes: dict[str, list[int | str]] = {}
    for text in args.input_shape:
        input_name, dims = parse_input_shape(text)
        if input_name in input_shapes:
            raise UserError(f"--input-shape {input_name}: given twice")
        input_shapes[input_name] = dims
    if args.runs is not None and args.runs < 1:
        raise UserError(f"--runs: expected a positive integer, got {args.runs}")
    quiet = bool(getattr(args, "quiet", False))
    feeds = load_feeds(args.verify_input) if args.verify_input else None
    try:
        prepared = prepare_network(
            args.model, args.store, args.name, input_shapes,
            profile=not args.no_profile, profile_runs=args.runs,
            verify=args.verify or feeds is not None, seed=args.seed, verify_feeds=feeds,
            max_cut_tensors=args.max_cut_tensors,
            min_stage_weight_bytes=parse_memory_bytes(args.min_stage_bytes, "--min-stage-bytes"),
            ort_optimize=args.ort_optimize, show_progress=False if quiet else None,
            load_mode=args.load_mode, max_stage_weight_bytes=max_stage_bytes(args),
            sample_input=args.sample_input,
        )
    except VerifyMismatch as mismatch:
        if args.json:
            print_json({"name": mismatch.result.network, "prepared": False,
                        "verify": mismatch.result.to_dict()})
        raise
    if args.json:
        print_json(_prepared_document(prepared))
    else:
        _print_prepared(prepared, quiet)
    return 0


def max_stage_bytes(args: argparse.Namespace) -> int:
    """The slicing limit from --max-stage-bytes or --target-memory (0: no slicing)."""
    if args.max_stage_bytes is not None:
        limit = parse_memory_bytes(args.max_stage_bytes, "--max-stage-bytes")
        if limit <= 0:
            raise UserError(f"--max-stage-bytes: expected a positive size, got "
                            f"{args.max_stage_bytes!r}")
        return limit
    if args.target_memory is not None:
        return max_stage_bytes_for_target(parse_memory_bytes(args.target_memory,
                                                             "--target-memory"))
    return 0


def _prepared_document(prepared: PreparedNetwork) -> dict[str, Any]:
    manifest = prepared.manifest
    return {
        "name": manifest.name,
        "prepared": True,
        "directory": str(manifest.directory),
        "stage_count": len(manifest.stages),
        "split_time_s": prepared.split_time_s,
        "profile_time_s": prepared.profile_time_s,
        "sample_time_s": prepared.sample_time_s,
        "verify": prepared.verify.to_dict() if prepared.verify is not None else None,
        "manifest": manifest_to_dict(manifest),
    }


def _print_prepared(prepared: PreparedNetwork, quiet: bool) -> None:
    manifest = prepared.manifest
    if not quiet:
        for line in stage_summary(manifest):
            print(line)
        for stage in manifest.stages:
            if stage.note:
                print(f"* {stage.stage_id}: {stage.note}")
    print(f"prepared {manifest.name}: {len(manifest.stages)} stages in {manifest.directory} "
          f"(split {prepared.split_time_s:.2f} s"
          + (f", sample run {prepared.sample_time_s:.2f} s" if prepared.sample_time_s else "")
          + (f", profile {prepared.profile_time_s:.1f} s" if prepared.profile_time_s else "")
          + ")")
    if manifest.ort_optimized is not None:
        optimized = manifest.ort_optimized
        print(f"stages cut from ONNX Runtime's optimised graph ({optimized.graph_level}, "
              f"onnxruntime {optimized.onnxruntime}, {optimized.machine}): run them with "
              "that version on that machine type")
    if prepared.verify is not None:
        print(prepared.verify.summary())


def _verify_command(args: argparse.Namespace) -> int:
    manifest = load_manifest(args.network, full_check=True)  # hashes every file
    model_path = Path(args.model) if args.model else Path(manifest.source_path)
    if not model_path.is_file():
        raise UserError(f"{model_path}: source model not found (pass --model)")
    feeds = bind_feeds(manifest, load_feeds(args.input)) if args.input else None
    try:
        result = verify_network(manifest, model_path, np.random.default_rng(args.seed),
                                feeds=feeds)
    except VerifyMismatch as mismatch:
        if args.json:
            print_json({"model": str(model_path), **mismatch.result.to_dict()})
        raise
    if args.json:
        print_json({"model": str(model_path), **result.to_dict()})
    else:
        print(result.summary())
    return 0
