"""Tests for the workload YAML (workloads.loader, .model, .generation, .inputs), arrivals,
composition and conditions."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from masa.common.errors import UserError, ValidationError
from model_prep.manifest import NetworkManifest, Stage, StageProfile, TensorSpec, write_manifest
from workloads.arrivals import (
    Arrival,
    Composition,
    arrival_times_us,
    draw_networks,
    rate_for_intensity,
    traffic_intensity,
)
from workloads.conditions import condition_draw, evaluate_condition, load_plugin
from workloads.generation import (
    apply_intensity,
    generate_jobs,
    list_scenarios,
    scenario_path,
    should_run,
    with_label_probability,
)
from workloads.inputs import crop_best_box, fit_to_input, network_inputs
from workloads.loader import load_workload
from workloads.model import Condition
from workloads.zoo import ZOO_NAMES

ZOO = ("agenet", "gendernet", "facenet", "sos", "memnet", "scenenet", "emotionnet",
       "googlenet", "tinyyolo")


def _write(tmp_path: Path, text: str, name: str = "work.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _manifest(name: str, outputs: tuple[str, ...], exec_time_us: int, load_time_us: int,
              input_shape: tuple[int, ...] = (1, 3, 8, 8)) -> NetworkManifest:
    profile = StageProfile(
        load_time_us=load_time_us, exec_time_us=exec_time_us, exec_runs=3,
        load_peak_bytes=2000, resident_bytes=1000, exec_peak_bytes=500,
        sampled_load_peak_bytes=0, sampled_exec_peak_bytes=0, sampling_interval_us=2.0,
    )
    data = TensorSpec("data", "float32", input_shape, 4 * int(np.prod(input_shape)))
    out = tuple(TensorSpec(o, "float32", (1, 4), 16) for o in outputs)
    stage = Stage(stage_id="s0", file="stages/s0.onnx", sha256="0" * 64, op_types=("Gemm",),
                  layer_type="fc", inputs=(data,), outputs=out, producers=(),
                  weight_bytes=1000, profile=profile)
    return NetworkManifest(name=name, source_path=f"{name}.onnx", source_sha256="0" * 64,
                           ir_version=8, opsets=(("", 17),), inputs=(data,), outputs=out,
                           stages=(stage,))


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    """detector (boxes, scores) 100 ms exec + 100 ms load; classifier (probs) 300 + 300 ms."""
    store_dir = tmp_path / "store"
    for manifest in (_manifest("detector", ("boxes", "scores"), 100_000, 100_000),
                     _manifest("classifier", ("probs",), 300_000, 300_000)):
        write_manifest(manifest, store_dir / manifest.name / "manifest.yaml")
    return store_dir


# ------------------------------------------------------------------ scenarios


def test_packaged_scenarios_load_and_use_zoo_names() -> None:
    assert set(ZOO) == set(ZOO_NAMES)
    assert set(list_scenarios()) >= {"small", "mixed", "lifelogging", "stochastic1",
                                     "stochastic2", "light", "heavy"}
    expected = {
        "small": {"agenet", "gendernet", "tinyyolo"},
        "mixed": {"agenet", "emotionnet", "facenet"},
        "lifelogging": {"tinyyolo", "emotionnet", "memnet", "scenenet", "sos"},
        "stochastic1": set(ZOO), "stochastic2": set(ZOO),
        "light": {"facenet", "agenet", "gendernet"},
        "heavy": {"tinyyolo", "facenet", "agenet", "gendernet", "emotionnet", "memnet"},
    }
    for name, networks in expected.items():
        workload = load_workload(scenario_path(name))
        assert set(workload.networks) == networks, name
        assert generate_jobs(workload), name
    stochastic1 = load_workload(scenario_path("stochastic1"))
    assert stochastic1.composition.kind == "one" and stochastic1.arrivals.kind == "normal"
    stochastic2 = load_workload(scenario_path("stochastic2"))
    assert stochastic2.composition.kind == "subset" and stochastic2.arrivals.kind == "periodic"
    heavy = load_workload(scenario_path("heavy"))
    assert heavy.downstreams("tinyyolo") == ("facenet", "agenet", "gendernet", "emotionnet")
    assert heavy.node("memnet").after == ()
    assert all(c.kind == "probability" for c in heavy.node("agenet").when)
    with pytest.raises(UserError, match="no scenario 'nope'"):
        scenario_path("nope")


# ---------------------------------------------------------------- validation


def test_every_problem_is_reported_at_once_with_its_path(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
        graph:
          facenet:
            after: [facenet2]
          agenet:
            after: facenet
            when: {max_above: 0.5, any_above: 0.2}
          loop_a:
            after: loop_b
          loop_b:
            after: loop_a
          emo:
            after: facenet
            when: {count_above: {threshold: 0.5}}
            colour: blue
        arrivals: {kind: poisson, rate_per_s: -2, count: 0}
        composition: {kind: subset, min_size: 3, max_size: 2}
        """, name="lifelog.yaml")
    with pytest.raises(ValidationError) as caught:
        load_workload(path)
    problems = caught.value.problems
    source = str(path)
    expected = [
        f"{source}: at 'graph.facenet.after': unknown network 'facenet2'",
        f"{source}: at 'graph.agenet.when': expected exactly one predicate",
        f"{source}: at 'graph.loop_a.after': cycle in the job graph: loop_a -> loop_b -> loop_a",
        f"{source}: at 'graph.emo.when.count_above.min_count': missing field",
        f"{source}: at 'graph.emo.colour': unknown field",
        f"{source}: at 'arrivals.rate_per_s': expected a positive number, got -2",
        f"{source}: at 'arrivals.count': expected an integer >= 1, got 0",
        f"{source}: at 'composition.min_size': expected 1 <= min_size <= max_size",
    ]
    for start in expected:
        assert any(problem.startswith(start) for problem in problems), (start, problems)
    assert len(problems) == len(expected)
    # One line for the CLI.
    assert "\n" not in str(caught.value)


def test_bad_yaml_and_wrong_top_level_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"bad\.yaml: line 2, column 9: not valid YAML"):
        load_workload(_write(tmp_path, "graph: [a, b\narrivals: {", name="bad.yaml"))
    with pytest.raises(UserError, match="expected a mapping at the top level"):
        load_workload(_write(tmp_path, "- a\n- b\n", name="list.yaml"))
    duplicate = "graph:\n  agenet:\n  agenet:\narrivals: {kind: trace, times_ms: [0]}\n"
    with pytest.raises(UserError, match="line 3, column 3: not valid YAML: duplicate key"):
        load_workload(_write(tmp_path, duplicate, name="dup.yaml"))
    with pytest.raises(UserError, match="no such workload file"):
        load_workload(tmp_path / "missing.yaml")


def test_malformed_predicates_and_transforms(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
        graph:
          det:
          cls:
            after: [det]
            when:
              - {argmax_in: [1, -3]}
              - {probability: 1.5}
              - {call: "no_such_module_xyz:func"}
              - {call: "json"}
              - {probability: 0.5, output: scores}
            input: {transform: sharpen}
          other:
            when: {max_above: 0.1}
          both:
            after: [det, cls]
            when: {max_above: 0.1}
            input: {transform: crop_best_box, network: cls}
        arrivals: {kind: periodic, interval_ms: 10, count: 2}
        """)
    with pytest.raises(ValidationError) as caught:
        load_workload(path)
    text = "\n".join(caught.value.problems)
    assert "at 'graph.cls.when[0].argmax_in': expected a list of class ids" in text
    assert "at 'graph.cls.when[1].probability': expected a number in [0, 1]" in text
    assert "at 'graph.cls.when[2].call': no plugin 'no_such_module_xyz' is loaded" in text
    assert "at 'graph.cls.when[3].call': expected 'plugin:function'" in text
    assert "at 'graph.cls.when[4].output': not used by 'probability'" in text
    assert "at 'graph.cls.input.transform': expected crop_best_box" in text
    assert "at 'graph.other.when': a condition needs 'after:'" in text
    assert "at 'graph.both.when': several upstreams (det, cls): say which" in text
    assert "at 'graph.both.input.boxes': missing field" in text


def test_store_checks_network_and_output_names(tmp_path: Path, store: Path) -> None:
    path = _write(tmp_path, """\
        graph:
          detector:
          classifier:
            after: detector
            when: {any_above: 0.5, output: score}
          facenet2:
            after: detector
            when: {max_above: 0.5}
        arrivals: {kind: periodic, interval_ms: 10, count: 2}
        """)
    with pytest.raises(ValidationError) as caught:
        load_workload(path, store_dir=store)
    text = "\n".join(caught.value.problems)
    assert "at 'graph.classifier.when.output': unknown output 'score' of network 'detector' " \
           "(it has: boxes, scores)" in text
    assert "at 'graph.facenet2': unknown network 'facenet2'" in text
    assert "at 'graph.facenet2.when.output': network 'detector' has outputs boxes, scores" \
           in text
    # The same file without a store cannot know names or outputs: it loads.
    assert load_workload(path).networks == ("detector", "classifier", "facenet2")


def test_arrival_fields_are_validated_per_kind(tmp_path: Path) -> None:
    cases = {
        "{kind: periodic, count: 2}": "at 'arrivals.interval_ms': missing field",
        "{kind: normal, mean_ms: 5, std_ms: 1, cv: 0.2, count: 2}":
            "at 'arrivals.cv': set either std_ms or cv",
        "{kind: normal, mean_ms: 5, count: 2}": "at 'arrivals.std_ms': missing field",
        "{kind: normal, mean_ms: 5, std_ms: -1, count: 2}":
            "at 'arrivals.std_ms': expected a number >= 0, got -1",
        "{kind: poisson, rate_per_s: 0, count: 2}":
            "at 'arrivals.rate_per_s': expected a positive number, got 0",
        "{kind: periodic, interval_ms: 5, count: 2, times_ms: [1]}":
            "at 'arrivals.times_ms': unknown field",
        "{kind: trace, times_ms: [5, 1]}": "at 'arrivals.times_ms': expected non-decreasing",
        "{kind: trace, times_ms: [0, 1], count: 3}": "at 'arrivals.count': expected at most 2",
        "{kind: burst, count: 2}": "at 'arrivals.kind': expected one of periodic, normal",
        "{kind: periodic, interval_ms: 5, count: 2.5}": "at 'arrivals.count': expected an integer",
        "{kind: periodic, interval_ms: 5, count: 2, seed: -1}": "at 'arrivals.seed': expected",
    }
    for index, (arrivals, message) in enumerate(cases.items()):
        path = _write(tmp_path, f"graph: [a]\narrivals: {arrivals}\n", f"case{index}.yaml")
        with pytest.raises(ValidationError) as caught:
            load_workload(path)
        assert any(message in problem for problem in caught.value.problems), (arrivals, message,
                                                                               caught.value)
    trace_with_intensity = _write(tmp_path, "graph: [a]\nintensity: 1\n"
                                  "arrivals: {kind: trace, times_ms: [0]}\n")
    with pytest.raises(ValidationError, match="cannot set the rate of trace arrivals"):
        load_workload(trace_with_intensity)


def test_network_order_puts_upstreams_first(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
        graph:
          c: {after: b}
          a:
          b: {after: a}
          d:
        arrivals: {kind: trace, times_ms: [0, 5]}
        """)
    workload = load_workload(path)
    assert workload.networks == ("a", "b", "c", "d")
    assert workload.downstreams("a") == ("b", "c")
    assert workload.arrivals.count == 2


def test_subset_composition_cannot_have_dependencies(tmp_path: Path) -> None:
    path = _write(tmp_path, """\
        graph: {a: , b: {after: a}}
        arrivals: {kind: periodic, interval_ms: 10, count: 2}
        composition: one
        """)
    with pytest.raises(ValidationError, match="'one' draws networks independently"):
        load_workload(path)


# ------------------------------------------------------------------ arrivals


def test_periodic_and_trace_arrivals_are_exact(tmp_path: Path) -> None:
    periodic = Arrival(kind="periodic", count=4, interval_us=2500, start_us=100)
    rng = np.random.default_rng(0)
    assert arrival_times_us(periodic, rng).tolist() == [100, 2600, 5100, 7600]
    path = _write(tmp_path, """\
        graph: [a]
        arrivals: {kind: trace, times_ms: [0, 1.5, 1.5, 40], count: 3}
        """)
    jobs = generate_jobs(load_workload(path))
    assert [job.arrival_us for job in jobs] == [0, 1500, 1500]
    assert [job.job_id for job in jobs] == [0, 1, 2]


def test_normal_arrivals_match_their_statistics_and_clip_at_zero() -> None:
    arrival = Arrival(kind="normal", count=20_001, mean_us=10_000, std_us=2_000, seed=3)
    gaps_us = np.diff(arrival_times_us(arrival, np.random.default_rng(3)))
    assert abs(gaps_us.mean() - 10_000) < 100  # standard error is 14 us
    assert abs(gaps_us.std() - 2_000) < 100
    # std far above the mean: about 46% of raw gaps are negative and become 0.
    wide = Arrival(kind="normal", count=10_001, mean_us=1_000, std_us=10_000)
    wide_gaps = np.diff(arrival_times_us(wide, np.random.default_rng(5)))
    assert wide_gaps.min() == 0
    assert 0.40 < np.mean(wide_gaps == 0) < 0.52


def test_poisson_arrivals_have_exponential_gaps() -> None:
    arrival = Arrival(kind="poisson", count=20_001, rate_per_s=50.0)
    gaps_us = np.diff(arrival_times_us(arrival, np.random.default_rng(11)))
    assert abs(gaps_us.mean() - 20_000) < 600  # 1/rate; standard error 141 us
    assert abs(gaps_us.std() / gaps_us.mean() - 1.0) < 0.05  # exponential: CV 1


def test_generation_is_deterministic_per_seed(tmp_path: Path) -> None:
    text = """\
        graph: [a, b, c, d]
        arrivals: {kind: poisson, rate_per_s: 10, count: 50, seed: SEED}
        composition: {kind: subset, min_size: 1, max_size: 3}
        """
    first = generate_jobs(load_workload(_write(tmp_path, text.replace("SEED", "7"), "a.yaml")))
    again = generate_jobs(load_workload(_write(tmp_path, text.replace("SEED", "7"), "b.yaml")))
    other = generate_jobs(load_workload(_write(tmp_path, text.replace("SEED", "8"), "c.yaml")))
    assert first == again
    assert [j.arrival_us for j in first] != [j.arrival_us for j in other]
    workload = load_workload(tmp_path / "a.yaml")
    assert generate_jobs(workload, np.random.default_rng(99)) == generate_jobs(
        workload, np.random.default_rng(99))


def test_composition_does_not_move_arrivals(tmp_path: Path) -> None:
    base = """\
        graph: [a, b, c]
        arrivals: {kind: normal, mean_ms: 20, std_ms: 5, count: 30, seed: 4}
        """
    all_jobs = generate_jobs(load_workload(_write(tmp_path, base, "all.yaml")))
    one_jobs = generate_jobs(load_workload(_write(tmp_path, base + "composition: one\n",
                                                  "one.yaml")))
    assert [j.arrival_us for j in all_jobs] == [j.arrival_us for j in one_jobs]
    assert all(j.networks == ("a", "b", "c") for j in all_jobs)
    assert all(len(j.networks) == 1 for j in one_jobs)


def test_one_and_subset_compositions_are_uniform() -> None:
    networks = ("a", "b", "c", "d", "e")
    rng = np.random.default_rng(1)
    picks = [draw_networks(Composition(kind="one"), networks, rng)[0] for _ in range(5000)]
    counts = np.array([picks.count(n) for n in networks])
    assert counts.min() > 900 and counts.max() < 1100  # expected 1000 each, sd 28

    subset = Composition(kind="subset", min_size=2, max_size=4)
    drawn = [draw_networks(subset, networks, rng) for _ in range(6000)]
    sizes = np.array([len(d) for d in drawn])
    assert set(sizes.tolist()) == {2, 3, 4}
    assert all(abs(np.mean(sizes == s) - 1 / 3) < 0.03 for s in (2, 3, 4))
    for chosen in drawn[:200]:
        assert len(set(chosen)) == len(chosen)
        assert list(chosen) == sorted(chosen, key=networks.index)
    membership = np.array([[n in d for n in networks] for d in drawn]).mean(axis=0)
    assert np.all(np.abs(membership - 3 / 5) < 0.03)  # mean size 3 of 5


# --------------------------------------------------------- traffic intensity


def test_traffic_intensity_from_manifests(tmp_path: Path, store: Path) -> None:
    manifests = {"detector": _manifest("detector", ("boxes", "scores"), 100_000, 100_000),
                 "classifier": _manifest("classifier", ("probs",), 300_000, 300_000)}
    # Mean network time (load + exec) = (0.2 s + 0.6 s) / 2 = 0.4 s.
    assert traffic_intensity(2.5, manifests) == pytest.approx(1.0)
    assert traffic_intensity(2.5, manifests, ["detector"]) == pytest.approx(0.5)
    assert traffic_intensity(2.5, manifests, include_load=False) == pytest.approx(0.5)
    assert rate_for_intensity(0.5, manifests) == pytest.approx(1.25)

    text = """\
        graph: [detector, classifier]
        intensity: 0.5
        arrivals: {kind: KIND, count: 3}
        """
    periodic = _write(tmp_path, text.replace("KIND", "periodic"), "p.yaml")
    resolved = load_workload(periodic, store_dir=store)
    assert resolved.arrivals.interval_us == 800_000  # 1 / 1.25 per second
    assert [j.arrival_us for j in generate_jobs(resolved)] == [0, 800_000, 1_600_000]
    unresolved = load_workload(periodic)
    with pytest.raises(UserError, match="at 'intensity': the arrival rate depends"):
        generate_jobs(unresolved)
    assert apply_intensity(unresolved, manifests).arrivals == resolved.arrivals

    normal = _write(tmp_path, text.replace("KIND", "normal").replace("count: 3",
                                                                    "count: 3, cv: 0.5"), "n.yaml")
    normal_arrivals = load_workload(normal, store_dir=store).arrivals
    assert (normal_arrivals.mean_us, normal_arrivals.std_us) == (800_000, 400_000)

    both = _write(tmp_path, text.replace("KIND", "poisson").replace("count: 3",
                                                                   "count: 3, rate_per_s: 2"))
    with pytest.raises(ValidationError, match="set either 'intensity' or this"):
        load_workload(both)


# ---------------------------------------------------------------- conditions


def test_tensor_predicates() -> None:
    outputs = {"det": {"scores": np.array([[0.1, 0.7, 0.65]]),
                       "rows": np.array([[1, 2, 3, 4, 0.2], [5, 6, 7, 8, 0.9]])}}

    def holds(**fields: object) -> bool:
        return evaluate_condition(Condition(network="det", **fields), outputs, seed=0, job_id=0)

    assert holds(kind="max_above", output="scores", threshold=0.6)
    assert not holds(kind="max_above", output="scores", threshold=0.7)
    assert holds(kind="any_above", output="scores", threshold=0.69)
    assert holds(kind="count_above", output="scores", threshold=0.6, min_count=2)
    assert not holds(kind="count_above", output="scores", threshold=0.6, min_count=3)
    assert holds(kind="argmax_in", output="scores", class_ids=(1, 5))
    assert not holds(kind="argmax_in", output="scores", class_ids=(0, 2))
    # column: only the score column of [N, 5] detection rows is compared.
    assert holds(kind="max_above", output="rows", column=4, threshold=0.8)
    assert not holds(kind="count_above", output="rows", column=4, threshold=0.8, min_count=2)
    with pytest.raises(KeyError, match="name one with 'output'"):
        holds(kind="max_above", threshold=0.5)


def test_probability_draws_are_seeded_and_shared_by_siblings() -> None:
    draws = np.array([condition_draw(seed=2, job_id=j, upstream="facenet") for j in range(4000)])
    assert 0.0 <= draws.min() and draws.max() < 1.0
    assert abs(np.mean(draws < 0.25) - 0.25) < 0.03
    assert condition_draw(2, 17, "facenet") == condition_draw(2, 17, "facenet")
    assert condition_draw(2, 17, "facenet") != condition_draw(2, 17, "tinyyolo")

    never = Condition(kind="probability", network="facenet", probability=0.0)
    always = Condition(kind="probability", network="facenet", probability=1.0)
    assert not any(evaluate_condition(never, {}, 2, j) for j in range(200))
    assert all(evaluate_condition(always, {}, 2, j) for j in range(200))

    light = load_workload(scenario_path("light"))
    for job_id in range(100):  # the same label decides both downstreams
        assert should_run(light, "agenet", job_id, {}) == should_run(light, "gendernet",
                                                                    job_id, {})
    runs = [should_run(light, "agenet", job_id, {}) for job_id in range(400)]
    assert 0.4 < np.mean(runs) < 0.6
    for probability, expected in ((0.0, False), (1.0, True)):
        swept = with_label_probability(load_workload(scenario_path("heavy")), probability)
        assert all(should_run(swept, name, job_id, {}) == expected
                   for name in ("facenet", "agenet", "emotionnet") for job_id in range(50))
        assert all(should_run(swept, "memnet", job_id, {}) for job_id in range(50))


def test_call_predicate_and_transform_receive_upstream_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: Path,
) -> None:
    (tmp_path / "my_rules.py").write_text(textwrap.dedent("""\
        import numpy as np

        def two_faces(outputs):
            return int((outputs["detector"]["scores"] > 0.5).sum()) >= 2

        def constant(job_input, outputs, tensor):
            return np.full(tensor.shape, outputs["detector"]["scores"].max(), np.float32)
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    load_plugin("my_rules")  # a module plugin (`masa --plugin my_rules`)
    path = _write(tmp_path, """\
        graph:
          detector:
          classifier:
            after: detector
            when: {call: "my_rules:two_faces"}
            input: {transform: "my_rules:constant"}
        arrivals: {kind: periodic, interval_ms: 10, count: 1}
        """)
    workload = load_workload(path, store_dir=store)
    assert should_run(workload, "classifier", 0, {"detector": {"scores": np.array([0.9, 0.6])}})
    assert not should_run(workload, "classifier", 0, {"detector": {"scores": np.array([0.9])}})
    classifier = _manifest("classifier", ("probs",), 1, 1)
    inputs = network_inputs(workload, classifier, 0, {"detector": {"scores": np.array([0.25])}})
    assert inputs["data"].shape == (1, 3, 8, 8)
    assert np.all(inputs["data"] == np.float32(0.25))


# ---------------------------------------------------------------- transforms


def test_crop_best_box_crops_the_highest_scoring_box() -> None:
    image = np.zeros((40, 60, 3), dtype=np.uint8)
    image[10:20, 30:50] = (200, 100, 50)  # the face
    image[0:5, 0:5] = 255  # a worse detection
    boxes = np.array([[[0, 0, 5, 5], [30, 10, 50, 20]]], dtype=np.float32)
    scores = np.array([[0.3, 0.9]], dtype=np.float32)
    nchw = TensorSpec("x", "float32", (1, 3, 6, 6), None)
    crop = crop_best_box(image, boxes, scores, nchw)
    assert crop.shape == (1, 3, 6, 6) and crop.dtype == np.float32
    assert np.allclose(crop[0, :, :, :].reshape(3, -1).T, [200, 100, 50])

    normalized = boxes / np.array([60, 40, 60, 40], dtype=np.float32)
    nhwc = TensorSpec("x", "float32", (1, 4, 4, 3), None)
    crop = crop_best_box(image, normalized, scores, nhwc, coords="normalized")
    assert np.allclose(crop.reshape(-1, 3), [200, 100, 50])

    # Rows with the score in column 4; no detections at all -> the whole image.
    rows = np.array([[30, 10, 50, 20, 0.8], [0, 0, 5, 5, 0.1]])
    assert np.allclose(crop_best_box(image, rows, None, nchw)[0, 0], 200)
    whole = crop_best_box(image, np.zeros((0, 4)), np.zeros(0), nchw)
    assert np.array_equal(whole, fit_to_input(image, nchw))


def test_fit_to_input_adapts_layout_channels_and_size() -> None:
    grey = np.arange(16, dtype=np.uint8).reshape(4, 4)
    rgb = fit_to_input(grey, TensorSpec("x", "float32", (1, 3, 2, 2), None))
    assert rgb.shape == (1, 3, 2, 2)
    assert np.array_equal(rgb[0, 0], rgb[0, 2])
    exact = np.ones((1, 3, 2, 2), dtype=np.float64)
    assert fit_to_input(exact, TensorSpec("x", "float32", (1, 3, 2, 2), 48)).dtype == np.float32
    colour = np.zeros((8, 8, 3))
    colour[..., 0] = 3.0
    mono = fit_to_input(colour, TensorSpec("x", "float32", (1, 8, 8, 1), None))
    assert mono.shape == (1, 8, 8, 1) and np.allclose(mono, 1.0)
    dynamic = fit_to_input(colour, TensorSpec("x", "float32", (1, 3, "h", "w"), None))
    assert dynamic.shape == (1, 3, 8, 8)


def test_input_files_and_random_inputs(tmp_path: Path) -> None:
    from PIL import Image

    image = np.zeros((16, 16, 3), dtype=np.uint8)
    image[:, :, 1] = 120
    (tmp_path / "data").mkdir()
    Image.fromarray(image).save(tmp_path / "data" / "photo.png")
    np.save(tmp_path / "data" / "tensor.npy", np.full((1, 3, 8, 8), 0.5, np.float32))
    net = _manifest("net", ("probs",), 1, 1)
    template = """\
        graph: [net]
        input: INPUT
        arrivals: {kind: periodic, interval_ms: 10, count: 2, seed: 3}
        """
    png = load_workload(_write(tmp_path, template.replace("INPUT", "data/photo.png"), "i.yaml"))
    assert np.allclose(network_inputs(png, net, 0)["data"][0, 1], 120)
    npy = load_workload(_write(tmp_path, template.replace("INPUT", "{file: data/tensor.npy}"),
                               "n.yaml"))
    assert np.all(network_inputs(npy, net, 1)["data"] == 0.5)
    rand = load_workload(_write(tmp_path, template.replace("INPUT", "random"), "r.yaml"))
    first = network_inputs(rand, net, 0)["data"]
    assert first.shape == (1, 3, 8, 8) and first.dtype == np.float32
    assert np.array_equal(first, network_inputs(rand, net, 0)["data"])
    assert not np.array_equal(first, network_inputs(rand, net, 1)["data"])
    with pytest.raises(ValidationError, match=r"at 'input': input file .*nope\.png does not"):
        load_workload(_write(tmp_path, template.replace("INPUT", "nope.png"), "x.yaml"))


# ----------------------------------------------------------------------- CLI


def test_cli_checks_files_and_exits_2_on_bad_input(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    from masa.cli.main import main

    assert main(["workload", "scenarios"]) == 0
    assert "stochastic1" in capsys.readouterr().out
    path = _write(tmp_path, """\
        graph: [detector, classifier]
        intensity: 0.5
        arrivals: {kind: periodic, count: 3}
        """)
    assert main(["workload", "check", str(path), "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "mean network time (load + exec): 400.0 ms" in out
    assert "traffic intensity: 0.500 at 1.250 jobs/s" in out
    assert main(["workload", "jobs", str(path), "--store", str(store), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[1].strip() for line in lines] == [
        '"arrival_us": 0', '"arrival_us": 800000', '"arrival_us": 1600000']
    # Without the store the intensity cannot be resolved: a user error, exit 2.
    assert main(["workload", "jobs", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("masa: error: ") and "at 'intensity'" in err
    assert len(err.strip().splitlines()) == 1
    assert main(["workload", "check", "light"]) == 0  # a packaged scenario by name
    assert "agenet after facenet when probability 0.5" in capsys.readouterr().out


def test_cli_json_reports_the_summary_or_every_problem(
    tmp_path: Path, store: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from masa.cli.main import main

    path = _write(tmp_path, """\
        graph:
          detector:
          classifier:
            after: detector
            when: {output: scores, count_above: {threshold: 0.5, min_count: 2}}
        intensity: 0.5
        arrivals: {kind: periodic, count: 3}
        """)
    assert main(["workload", "check", str(path), "--store", str(store), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True and report["source"] == str(path)
    assert [n["name"] for n in report["networks"]] == ["detector", "classifier"]
    (condition,) = report["networks"][1]["when"]
    assert condition["kind"] == "count_above" and condition["min_count"] == 2
    assert "class_ids" not in condition
    assert report["arrivals"]["interval_us"] == 800_000
    assert report["mean_network_time_ms"] == pytest.approx(400.0)
    assert report["traffic_intensity"] == pytest.approx(0.5)
    assert report["composition"] == {"kind": "all"}

    bad = _write(tmp_path, "graph: [a, a2]\narrivals: {kind: poisson, count: 0}\n", "bad.yaml")
    assert main(["workload", "check", str(bad), "--json"]) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["valid"] is False and len(report["problems"]) == 2
    assert all(problem.startswith(f"{bad}: at 'arrivals.") for problem in report["problems"])
    assert captured.err.startswith("masa: error: ")

    assert main(["workload", "scenarios", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in listing["scenarios"]] == list(list_scenarios())


def test_the_run_path_modules_import_neither_onnx_nor_ortools_nor_matplotlib() -> None:
    """What `masa run` imports from workloads stays light on a device (only zoo needs onnx)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import workloads.arrivals, workloads.conditions, workloads.generation\n"
        "import workloads.inputs, workloads.loader, workloads.model, workloads.workload_cli\n"
        "heavy = ('onnx', 'onnxruntime', 'google', 'ortools', 'matplotlib')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
