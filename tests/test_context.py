"""Context-aware execution (CA-wait, CA-preempt) on real split networks and in simulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from masa.common.procmem import rss_bytes
from masa.runtime.runner import RunSettings, execute, prepare_run
from masa.sched.checker import check_schedule
from model_prep.session import release_memory

pytestmark = [pytest.mark.real, pytest.mark.slow]

MIB = 2**20
SETTINGS = RunSettings(policy="masa", workers=2, memory_budget_bytes=16 * MIB)


def _chain(tmp_path: Path, p_age: float, p_gender: float, count: int = 4) -> Path:
    """googlenet -> agenet -> gendernet: a three-level chain."""
    path = tmp_path / f"chain-{p_age}-{p_gender}.yaml"
    path.write_text(
        "graph:\n"
        "  googlenet:\n"
        f"  agenet: {{after: googlenet, when: {{probability: {p_age}}}}}\n"
        f"  gendernet: {{after: agenet, when: {{probability: {p_gender}}}}}\n"
        f"arrivals: {{kind: periodic, interval_ms: 2, count: {count}, seed: 3}}\n")
    return path


def _statuses(outcome, network: str) -> set[str]:
    return {status for group, status in outcome.network_status.items()
            if group.endswith("/" + network)}


def _ran(outcome, network: str) -> int:
    return sum(1 for entry in outcome.schedule
               if entry.worker >= 0 and f"/{network}/" in entry.task_id)


def _check_clean(outcome) -> None:
    assert outcome.final_reserved_bytes == 0
    assert outcome.live_sessions_after == 0
    allowed = [o.task_id for o in outcome.over_commits]
    assert check_schedule(outcome.graph, outcome.schedule, workers=SETTINGS.workers,
                          memory_budget_bytes=SETTINGS.memory_budget_bytes,
                          allowed_over_commits=allowed) == []


@pytest.mark.parametrize("simulate", [False, True])
def test_wait_skips_downstreams_transitively_at_probability_0(small_zoo_store, tmp_path,
                                                              simulate):
    prepared = prepare_run(_chain(tmp_path, 0, 1), small_zoo_store, "wait")
    outcome = execute(prepared, SETTINGS, simulate=simulate)
    assert _statuses(outcome, "googlenet") == {"done"}
    assert _statuses(outcome, "agenet") == {"skipped"}
    assert _statuses(outcome, "gendernet") == {"skipped"}  # transitively
    assert _ran(outcome, "agenet") == _ran(outcome, "gendernet") == 0  # not even loaded
    _check_clean(outcome)


@pytest.mark.parametrize("context", ["wait", "preempt"])
@pytest.mark.parametrize("simulate", [False, True])
def test_probability_1_runs_every_network(small_zoo_store, tmp_path, context, simulate):
    prepared = prepare_run(_chain(tmp_path, 1, 1), small_zoo_store, context)
    outcome = execute(prepared, SETTINGS, simulate=simulate)
    assert set(outcome.network_status.values()) == {"done"}
    _check_clean(outcome)


@pytest.mark.parametrize("simulate", [False, True])
def test_preempt_aborts_downstreams_transitively_at_probability_0(small_zoo_store, tmp_path,
                                                                  simulate):
    prepared = prepare_run(_chain(tmp_path, 0, 1), small_zoo_store, "preempt")
    outcome = execute(prepared, SETTINGS, simulate=simulate)
    assert _statuses(outcome, "googlenet") == {"done"}
    assert _statuses(outcome, "agenet") == {"aborted"}
    assert _statuses(outcome, "gendernet") == {"aborted"}
    # Preempt starts downstream work early: some of it ran and was wasted.
    assert _ran(outcome, "agenet") > 0
    assert not any(group.endswith(("/agenet", "/gendernet")) for group in outcome.outputs)
    _check_clean(outcome)


def test_preempt_never_starts_downstream_exec_before_upstream_exec(small_zoo_store, tmp_path):
    prepared = prepare_run(_chain(tmp_path, 1, 1), small_zoo_store, "preempt")
    outcome = execute(prepared, SETTINGS, simulate=False)
    starts = {entry.task_id: entry.start_us for entry in outcome.schedule if entry.worker >= 0}
    for job in prepared.jobs:
        first_up = min(t for i, t in starts.items()
                       if i.startswith(f"j{job.job_id}/googlenet/") and i.endswith("/exec"))
        first_down = min(t for i, t in starts.items()
                         if i.startswith(f"j{job.job_id}/agenet/") and i.endswith("/exec"))
        assert first_down >= first_up


@pytest.mark.parametrize("p_age, expected", [(1, "done"), (0, "skipped")])
def test_network_with_two_upstreams_needs_both(small_zoo_store, tmp_path, p_age, expected):
    path = tmp_path / "two.yaml"
    path.write_text(
        "graph:\n"
        "  googlenet:\n"
        f"  agenet: {{after: googlenet, when: {{probability: {p_age}}}}}\n"
        "  gendernet: {after: [googlenet, agenet]}\n"
        "arrivals: {kind: periodic, interval_ms: 2, count: 3, seed: 5}\n")
    outcome = execute(prepare_run(path, small_zoo_store, "wait"), SETTINGS, simulate=False)
    assert _statuses(outcome, "gendernet") == {expected}
    if expected == "done":
        ends = {e.task_id: e.end_us for e in outcome.schedule if e.worker >= 0}
        starts = {e.task_id: e.start_us for e in outcome.schedule if e.worker >= 0}
        for job in range(3):
            gender_start = min(t for i, t in starts.items() if i.startswith(f"j{job}/gendernet/"))
            for upstream in ("googlenet", "agenet"):
                prefix = f"j{job}/{upstream}/"
                upstream_end = max(t for i, t in ends.items() if i.startswith(prefix))
                assert gender_start >= upstream_end
    _check_clean(outcome)


@pytest.mark.parametrize("context", ["wait", "preempt"])
def test_simulated_and_real_agree_on_skips_and_aborts(small_zoo_store, tmp_path, context):
    prepared = prepare_run(_chain(tmp_path, 0.5, 0.5, count=12), small_zoo_store, context)
    real = execute(prepared, SETTINGS, simulate=False)
    simulated = execute(prepared, SETTINGS, simulate=True)
    assert real.network_status == simulated.network_status
    # The seed gives a mix, so the comparison is not trivial.
    assert {"done", "skipped" if context == "wait" else "aborted"} <= set(
        real.network_status.values())


def test_many_jobs_with_aborts_leave_no_memory_behind(small_zoo_store, tmp_path):
    one = prepare_run(_chain(tmp_path, 0.5, 0.5, count=1), small_zoo_store, "preempt")
    execute(one, SETTINGS, simulate=False)
    release_memory()
    after_first_bytes = rss_bytes()
    many = prepare_run(_chain(tmp_path, 0.5, 0.5, count=30), small_zoo_store, "preempt")
    outcome = execute(many, SETTINGS, simulate=False)
    assert "aborted" in outcome.network_status.values()
    _check_clean(outcome)
    release_memory()
    assert rss_bytes() <= after_first_bytes * 1.05


class _RecordingControl:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def open(self, group: str) -> None:
        self.calls.append(("open", group))

    def cancel(self, group: str, reason: str) -> None:
        self.calls.append(("cancel", group))


def test_preempt_aborts_a_downstream_that_finished_before_the_verdict():
    from masa.sched.context import ContextController
    from masa.sched.core import GroupStatus

    controller = ContextController(
        "preempt", {"age": ("face",), "emotion": ("age",)},
        decide=lambda job_id, network, outputs: network != "age")
    control = _RecordingControl()
    controller.register_job(0, ("face", "age", "emotion"))
    # CA-preempt ran age and emotion early: both finished before face did.
    assert controller.group_ended("j0/age", GroupStatus.DONE, control) == []
    assert controller.group_ended("j0/emotion", GroupStatus.DONE, control) == []
    doomed = controller.group_ended("j0/face", GroupStatus.DONE, control)
    assert doomed == ["j0/age", "j0/emotion"]  # transitively, finished or not
    assert controller.network_status("j0/age", "done") == "aborted"
    assert controller.network_status("j0/emotion", "done") == "aborted"
    assert controller.network_status("j0/face", "done") == "done"
    # Only the open of emotion when age ended (age's own verdict); nothing was
    # running any more when face ended, so nothing to cancel.
    assert control.calls == [("open", "j0/emotion")]

