"""Nothing accepted is lost: 50 jobs, `kill -9` of the daemon mid-run, a restart on the
same journal; every job ends exactly once, with the outputs of the unsplit models."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from test_serve import (
    SLOW_SIDE,
    Server,
    assert_like_whole_model,
    build_store,
    npy_bytes,
    whole_model,
    write_config,
)

JOBS = 50


@pytest.mark.slow
@pytest.mark.real
@pytest.mark.parametrize("journal_sync", ["full", "normal"])
def test_kill_9_mid_run_then_restart_ends_every_accepted_job_exactly_once(
        tmp_path: Path, journal_sync: str) -> None:
    """Both journal modes: `normal` commits results on the scheduler's thread, `full` on
    the journal writer's; a kill -9 (not a power cut) loses nothing in either."""
    store = build_store(tmp_path / "models")
    config = write_config(tmp_path / "device", store, journal_sync=journal_sync,
                          limits={"max_queued_jobs": JOBS, "max_body_bytes": 1_000_000})
    rng = np.random.default_rng(11)
    inputs = [rng.random((1, 3, 16, 16)).astype(np.float32) for _ in range(JOBS - 1)]
    server = Server(config)
    job_ids = [server.submit("both", npy_bytes(x), "application/x-npy") for x in inputs]
    # The last job's EXECs take seconds: whenever job 10 ends, it is still running or
    # queued, so the kill always finds an unfinished job, however fast the others are.
    slow_input = rng.random((SLOW_SIDE, SLOW_SIDE)).astype(np.float32)
    slow_id = server.submit("slow", npy_bytes(slow_input), "application/x-npy")
    assert len(set(job_ids + [slow_id])) == JOBS
    server.wait(job_ids[JOBS // 5])  # some jobs are done, the later ones still pending
    active = server.json("GET", "/v1/status")[1]["active_jobs"]
    assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    assert active > 0, "the kill came after every job had ended: nothing was tested"

    restarted = Server(config)
    try:
        results = {job_id: restarted.wait(job_id) for job_id in job_ids + [slow_id]}
        outputs = {job_id: restarted.outputs(job_id) for job_id in job_ids + [slow_id]}
        status = restarted.json("GET", "/v1/status")[1]
        metrics = restarted.request("GET", "/metrics")[2].decode()
    finally:
        assert restarted.stop() == 0
    assert {r["state"] for r in results.values()} == {"done"}
    attempts = [results[job_id]["attempts"] for job_id in job_ids + [slow_id]]
    assert attempts[0] == 1 and attempts[-1] == 2  # finished before the kill / resumed
    resumed = sum(1 for count in attempts if count == 2)
    assert f"masa_jobs_resumed_total {float(resumed)}" in metrics
    assert status["reserved_bytes"] == status["kept_loaded_bytes"]  # idle: kept stages only
    assert status["over_budget_violations"] == 0

    journal = sqlite3.connect(str(tmp_path / "device" / "journal.sqlite"))
    try:
        finals = dict(journal.execute(
            "SELECT job_id, COUNT(*) FROM events WHERE event = 'final' GROUP BY job_id"))
        unfinished = journal.execute(
            "SELECT COUNT(*) FROM jobs WHERE state NOT IN ('done', 'failed', 'cancelled')"
        ).fetchone()[0]
    finally:
        journal.close()
    assert finals == dict.fromkeys(job_ids + [slow_id], 1)  # every job ended once, none twice
    assert unfinished == 0
    for job_id, x in zip(job_ids, inputs, strict=True):
        for network in ("convnet", "resnet"):
            assert_like_whole_model(outputs[job_id][f"{network}/y"],
                                    whole_model(store.model_files[network], x))
    # Repeated squarings amplify rounding (thread counts differ): the slow job must simply
    # have produced its one output.
    assert outputs[slow_id]["slow/y"].shape == () and np.isfinite(outputs[slow_id]["slow/y"])


def test_a_job_killed_right_after_its_202_runs_after_the_restart(tmp_path: Path) -> None:
    """The 202 comes after the journal's commit: a kill right after it loses nothing."""
    store = build_store(tmp_path / "models")
    config = write_config(tmp_path / "device", store, workers=1)
    server = Server(config)
    x = np.random.default_rng(5).random((384, 384)).astype(np.float32)
    job_id = server.submit("slow", npy_bytes(x), "application/x-npy")
    assert server.stop(signal.SIGKILL) == -signal.SIGKILL
    restarted = Server(config)
    try:
        document = restarted.wait(job_id)
        outputs = restarted.outputs(job_id)
    finally:
        assert restarted.stop() == 0
    assert document["state"] == "done" and document["attempts"] == 2
    # Repeated squarings amplify rounding (thread counts differ): the crash test above
    # compares outputs; here the job must simply have produced its one.
    assert outputs["slow/y"].shape == () and np.isfinite(outputs["slow/y"])
