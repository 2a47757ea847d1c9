"""`masa serve` under faults and on a Unix socket: a network that fails at run time fails
its job alone (the other jobs finish, the daemon keeps serving, every reserved byte comes
back), and the daemon answers the same API on `listen: unix:/PATH`.

The daemon runs as `python -m masa serve` on the tiny networks of tests/test_serve.py;
outputs are checked against ONNX Runtime on the whole original models.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from test_serve import Server, Store, assert_like_whole_model, npy_bytes, whole_model, write_config
from test_serve import store as store  # noqa: F401  (the module's fixture)

from model_prep.manifest import load_store_network


def _metric(text: str, line_start: str) -> float:
    """The value of the one sample whose line starts with `line_start`."""
    (value,) = [line.rsplit(" ", 1)[1] for line in text.splitlines()
                if line.startswith(line_start)]
    return float(value)


@pytest.mark.real
def test_a_network_that_fails_fails_its_job_alone(store: Store, tmp_path: Path) -> None:
    # A private copy of the store: the corruption cannot leak into other tests.
    copy = Store(tmp_path / "store", store.model_files)
    shutil.copytree(store.path, copy.path)
    config = write_config(tmp_path / "device", copy, graphs={
        "conv": {"graph": ["convnet"]}, "both": {"graph": ["convnet", "resnet"]}})
    server = Server(config)
    try:
        # After the daemon checked the store at start: every LOAD of that stage fails.
        stage = load_store_network(copy.path, "resnet").stages[0]
        (copy.path / "resnet" / stage.file).write_bytes(b"not an onnx model")
        rng = np.random.default_rng(21)
        inputs = [rng.random((1, 3, 16, 16)).astype(np.float32) for _ in range(6)]
        graphs = ["conv", "both"] * 3
        job_ids = [server.submit(graph, npy_bytes(x), "application/x-npy")
                   for graph, x in zip(graphs, inputs, strict=True)]
        results = [server.wait(job_id) for job_id in job_ids]
        # The daemon keeps serving after the failures.
        later_input = rng.random((1, 3, 16, 16)).astype(np.float32)
        later = server.wait(server.submit("conv", npy_bytes(later_input),
                                          "application/x-npy"))
        later_outputs = server.outputs(later["id"])
        status = server.json("GET", "/v1/status?wait=30")[1]
        metrics = server.request("GET", "/metrics")[2].decode()
        health = server.request("GET", "/healthz")[0]
    finally:
        assert server.stop() == 0

    for graph, x, result in zip(graphs, inputs, results, strict=True):
        convnet = result["networks"]["convnet"]
        assert convnet["status"] == "done"
        assert_like_whole_model(
            np.asarray(convnet["outputs"]["y"]["data"], dtype=np.float32),
            whole_model(store.model_files["convnet"], x))
        if graph == "conv":
            assert result["state"] == "done"
        else:  # its own job fails; convnet in the same job still ends done
            assert result["state"] == "failed"
            resnet = result["networks"]["resnet"]
            assert resnet["status"] == "failed"
            assert stage.stage_id in resnet["error"]
    assert later["state"] == "done" and health == 200
    assert_like_whole_model(later_outputs["convnet/y"],
                            whole_model(store.model_files["convnet"], later_input))
    # Every reserved byte released but the stages kept loaded between jobs (the default),
    # none of them the failed network's; nothing left in the scheduler.
    assert status["active_jobs"] == 0
    assert status["reserved_bytes"] == status["kept_loaded_bytes"] > 0
    assert status["kept_stages"] == len(load_store_network(store.path, "convnet").stages)
    assert set(status["scheduler_state"].values()) == {0}, status["scheduler_state"]
    assert _metric(metrics, "masa_ledger_reserved_bytes ") == status["kept_loaded_bytes"]
    assert _metric(metrics, "masa_ledger_kept_loaded_bytes ") == status["kept_loaded_bytes"]
    assert _metric(metrics, 'masa_jobs_finished_total{graph="both",state="failed"}') == 3
    assert _metric(metrics, 'masa_jobs_finished_total{graph="conv",state="done"}') == 4
    assert _metric(metrics,
                   'masa_networks_finished_total{network="resnet",status="failed"}') == 3


async def _over_unix_socket(socket_path: Path, body: bytes) -> dict[str, Any]:
    """Submit, long-poll, fetch outputs, health: aiohttp's client on the socket."""
    connector = aiohttp.UnixConnector(path=str(socket_path))
    async with aiohttp.ClientSession(connector=connector) as session:
        base = "http://masa"  # the host is not used on a Unix socket
        async with session.post(f"{base}/v1/jobs?graph=both", data=body,
                                headers={"Content-Type": "application/x-npy"}) as response:
            assert response.status == 202, await response.text()
            job = await response.json()
        async with session.get(f"{base}/v1/jobs/{job['id']}?wait=30") as response:
            assert response.status == 200
            document = await response.json()
        async with session.get(f"{base}/v1/jobs/{job['id']}/outputs.npz") as response:
            assert response.status == 200
            outputs = dict(np.load(io.BytesIO(await response.read())))
        async with session.get(f"{base}/readyz") as response:
            ready = await response.json()
    return {"document": document, "outputs": outputs, "ready": ready}


def test_the_daemon_serves_on_a_unix_socket(store: Store) -> None:
    # A short directory: a socket's path is limited to about 100 bytes.
    directory = Path(tempfile.mkdtemp(prefix="masa-sock-"))
    try:
        socket_path = directory / "masa.sock"
        config = write_config(directory, store, listen=f"unix:{socket_path}")
        server = Server(config)
        try:
            assert server.url == f"unix:{socket_path}"
            assert socket_path.is_socket()
            x = np.random.default_rng(22).random((1, 3, 16, 16)).astype(np.float32)
            answer = asyncio.run(_over_unix_socket(socket_path, npy_bytes(x)))
        finally:
            assert server.stop() == 0
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    assert answer["document"]["state"] == "done"
    assert answer["ready"]["ready"] is True
    for network in ("convnet", "resnet"):
        assert_like_whole_model(answer["outputs"][f"{network}/y"],
                                whole_model(store.model_files[network], x))
