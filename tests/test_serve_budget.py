"""The memory budget holds in the daemon as it holds in `masa run` (tests/test_fidelity.py).

A `masa serve` process on profiled manifests (test_fidelity's zoo networks and scale),
with a budget far below what the networks need loaded together (the demo's budget rule),
takes six jobs at once over HTTP, each a tensor of the networks' input shape, as `masa
run` makes them. By the process's own measure since it started (anonymous memory above
the baseline plus the loaded stages' weights in memory, GET /v1/status), it holds no more
than the budget plus the same 5% as `masa run`: the daemon's own memory (HTTP, the queued
jobs' inputs, the journal) counts against the budget too, and only progress-rule
over-commits are allowed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_fidelity import SLACK
from test_serve import Server, npy_bytes

from masa.cli.demo import demo_budget_bytes, network_need_bytes
from masa.runtime.runner import prepare_run
from workloads.zoo import write_zoo

NETWORKS = ("agenet", "gendernet", "facenet")  # one 1x3x227x227 input feeds all three
JOBS = 6


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.profile
def test_the_daemon_holds_its_budget_in_the_process(tmp_path: Path) -> None:
    store = tmp_path / "store"
    manifests = write_zoo(store, list(NETWORKS), scale=0.4, profile=True, profile_runs=2)
    workload = tmp_path / "pair.yaml"  # for the demo's budget rule, as test_fidelity
    workload.write_text(f"graph: [{', '.join(NETWORKS)}]\ninput: random\n"
                        f"arrivals: {{kind: periodic, interval_ms: 20, count: {JOBS}}}\n")
    need_bytes = sum(network_need_bytes(m) for m in manifests)
    budget_bytes = demo_budget_bytes(prepare_run(workload, store), need_bytes)
    assert need_bytes > 1.5 * budget_bytes  # the budget binds
    config = tmp_path / "device.yaml"
    config.write_text(json.dumps({
        "store": str(store), "memory": str(budget_bytes), "workers": 2, "policy": "masa",
        "listen": "127.0.0.1:0", "journal": str(tmp_path / "journal.sqlite"),
        "limits": {"max_queued_jobs": JOBS},
        "graphs": {"pair": {"graph": list(NETWORKS)}}}))
    (tensor,) = manifests[0].inputs
    assert all(m.inputs == manifests[0].inputs for m in manifests)
    rng = np.random.default_rng(31)
    bodies = [npy_bytes(rng.random(tuple(tensor.shape)).astype(np.float32))
              for _ in range(JOBS)]
    server = Server(config)
    try:
        job_ids = [server.submit("pair", body, "application/x-npy") for body in bodies]
        results = [server.wait(job_id, timeout_s=120) for job_id in job_ids]
        status = server.json("GET", "/v1/status?wait=30")[1]
        metrics = server.request("GET", "/metrics")[2].decode()
    finally:
        assert server.stop() == 0
    assert {result["state"] for result in results} == {"done"}
    assert status["memory_budget_bytes"] == budget_bytes
    measured_bytes = status["peak_measured_bytes"]
    assert 0 < measured_bytes <= SLACK * budget_bytes, (
        f"measured {measured_bytes} B, budget {budget_bytes} B: "
        f"{measured_bytes / budget_bytes:.3f}x")
    assert status["peak_reserved_bytes"] > 0 and status["reserved_bytes"] == 0
    assert status["over_budget_violations"] == 0
    reasons = {line.split('reason="', 1)[1].split('"', 1)[0]
               for line in metrics.splitlines()
               if line.startswith("masa_over_commits_total{")}
    assert reasons <= {"progress"}
