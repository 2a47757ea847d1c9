"""`masa serve` over real HTTP: a real daemon process on a free loopback port, a real client.

The daemon runs as `python -m masa serve` (the shipped command) on tiny
networks built with onnx.helper and prepared into a temporary store; the
tests talk to it with urllib. Outputs are checked against ONNX Runtime on the
whole original models (an independent oracle), not against the daemon.
The helpers here (store, config, server process) are also used by
tests/test_serve_crash.py.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import models
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from PIL import Image

from masa.common.errors import UserError
from masa.serve.config import Preprocess, load_config
from masa.serve.inputs import (
    BadInput,
    Limits,
    TooLarge,
    decode_body,
    encode_npz,
    preprocess_image,
)
from model_prep.manifest import TensorSpec, load_store_network
from model_prep.prepare_cli import prepare_network

ROOT = Path(__file__).resolve().parent.parent
PREPROCESS = {"scale": 0.00392, "mean": [0.5, 0.4, 0.3], "std": [0.25, 0.2, 0.3]}
SLOW_SIDE = 384  # the slow network's matrices: each weightless MatMul ~100 MFLOP


def slow_chain(rng: np.random.Generator, stages: int = 6, squarings: int = 10):
    """Stages of MatMul(x, W) followed by weightless Tanh(MatMul(h, h)) squarings:
    long EXECs made of many nodes, so a cancel stops one between nodes."""
    side = SLOW_SIDE
    inits, nodes = [], []
    current = "x"
    for stage in range(stages):
        weight = f"w{stage}"
        inits.append(models._weights(rng, weight, side, side, scale=0.05))
        nodes.append(helper.make_node("MatMul", [current, weight], [f"m{stage}"]))
        current = f"m{stage}"
        for index in range(squarings):
            nodes.append(helper.make_node("MatMul", [current, current], [f"s{stage}_{index}"]))
            nodes.append(helper.make_node("Tanh", [f"s{stage}_{index}"], [f"t{stage}_{index}"]))
            current = f"t{stage}_{index}"
    nodes.append(helper.make_node("ReduceMean", [current], ["y"], keepdims=0))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [side, side])]
    return models._model(nodes, inputs, [models._float_out("y")], inits, "slow_chain")


@dataclass(frozen=True)
class Store:
    path: Path
    model_files: dict[str, Path]


def build_store(root: Path) -> Store:
    rng = np.random.default_rng(7)
    files = {}
    for name, builder in (("convnet", models.conv_chain), ("resnet", models.residual_branches),
                          ("slow", slow_chain)):
        files[name] = models.save(builder(rng), root / "models", name)
        prepare_network(files[name], root / "store", name, profile=False, show_progress=False)
    return Store(root / "store", files)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return build_store(tmp_path_factory.mktemp("serve-store"))


def write_config(directory: Path, store: Store, **overrides: Any) -> Path:
    config: dict[str, Any] = {
        "store": str(store.path), "memory": "256MiB", "workers": 2, "context": "wait",
        "listen": "127.0.0.1:0", "journal": str(directory / "journal.sqlite"),
        "shutdown_grace_s": 20,
        "limits": {"max_queued_jobs": 6, "max_body_bytes": 1_000_000,
                   "max_image_pixels": 100_000},
        "graphs": {
            "both": {"graph": ["convnet", "resnet"]},
            "photo": {"graph": {"convnet": None,
                                "resnet": {"after": "convnet", "when": {"max_above": -1e9}}},
                      "preprocess": {"convnet": PREPROCESS}},
            "slow": {"graph": ["slow"]},
        },
    }
    config.update(overrides)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "device.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


class Server:
    """`python -m masa serve` in a child process; its URL read from its first stdout line."""

    def __init__(self, config: Path, token: str | None = None,
                 plugins: tuple[Path, ...] = ()) -> None:
        self.config = config
        self.token = token
        plugin_args = [arg for plugin in plugins for arg in ("--plugin", str(plugin))]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "masa", "-q", *plugin_args, "serve", "--config",
             str(config)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise AssertionError(f"server did not start: {line}{self.process.stderr.read()}")
        self.url = line.split("listening on ", 1)[1].strip()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, token: str | None = None
                ) -> tuple[int, dict[str, str], bytes]:
        all_headers = dict(headers or {})
        bearer = token if token is not None else self.token
        if bearer is not None:
            all_headers["Authorization"] = f"Bearer {bearer}"
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), error.read()

    def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        status, _, data = self.request(method, path, **kwargs)
        return status, json.loads(data)

    def submit(self, graph: str, body: bytes, content_type: str) -> int:
        status, document = self.json("POST", f"/v1/jobs?graph={graph}", body=body,
                                     headers={"Content-Type": content_type})
        assert status == 202, document
        return int(document["id"])

    def wait(self, job_id: int, timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status, document = self.json("GET", f"/v1/jobs/{job_id}?wait=10")
            assert status == 200, document
            if document["state"] in ("done", "failed", "cancelled"):
                return document
        raise AssertionError(f"job {job_id} did not end in {timeout_s} s")

    def outputs(self, job_id: int) -> dict[str, np.ndarray]:
        status, _, data = self.request("GET", f"/v1/jobs/{job_id}/outputs.npz")
        assert status == 200, data
        return dict(np.load(io.BytesIO(data)))

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            for stream in (self.process.stdout, self.process.stderr):
                if stream is not None:
                    stream.close()


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def png_bytes(height: int, width: int, seed: int = 0) -> bytes:
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def whole_model(path: Path, feed: np.ndarray) -> np.ndarray:
    """The oracle: ONNX Runtime on the original, unsplit model."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (name,) = [i.name for i in session.get_inputs()]
    return session.run(None, {name: feed})[0]


def assert_like_whole_model(actual: Any, expected: np.ndarray) -> None:
    """The stage chain's output equals the whole model's up to float32 rounding. ONNX
    Runtime fuses the whole graph's operators differently from the stages', so sums
    are rounded in another order; an element near zero beside large ones carries
    their rounding, hence an absolute bound scaled by the output's largest magnitude
    (seen: 1.9e-5 on an element of -0.013 beside 17.9, onnxruntime 1.32)."""
    scale = max(1.0, float(np.max(np.abs(expected))))
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float32), expected,
                               rtol=1e-4, atol=1e-5 * scale)


@pytest.fixture(scope="module")
def server(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(write_config(tmp_path_factory.mktemp("serve"), store))
    yield running
    assert running.stop() == 0


def _image_tensor(png: bytes) -> np.ndarray:
    """What the daemon's preprocess should give convnet (1x3x16x16), by hand in numpy."""
    with Image.open(io.BytesIO(png)) as image:
        resized = image.convert("RGB").resize((16, 16), Image.Resampling.BILINEAR)
    pixels = np.asarray(resized, dtype=np.float32) * np.float32(PREPROCESS["scale"])
    pixels = (pixels - np.float32(PREPROCESS["mean"])) / np.float32(PREPROCESS["std"])
    return np.ascontiguousarray(pixels.transpose(2, 0, 1)[None]).astype(np.float32)


# ---------------------------------------------------------------- the API


def test_an_image_and_a_npy_poll_long_poll_and_outputs(server: Server, store: Store) -> None:
    png = png_bytes(40, 50)
    image_job = server.submit("photo", png, "image/png")
    x = np.random.default_rng(1).random((1, 3, 16, 16)).astype(np.float32)
    npy_job = server.submit("both", npy_bytes(x), "application/x-npy")
    status, polled = server.json("GET", f"/v1/jobs/{npy_job}")
    assert status == 200 and polled["state"] in ("queued", "running", "done")
    assert set(polled["networks"]) == {"convnet", "resnet"}

    done = server.wait(image_job)
    assert done["state"] == "done" and done["attempts"] == 1
    assert {n: r["status"] for n, r in done["networks"].items()} == {
        "convnet": "done", "resnet": "done"}
    assert done["networks"]["convnet"]["load_ms"] > 0
    outputs = server.outputs(image_job)
    expected = whole_model(store.model_files["convnet"], _image_tensor(png))
    assert_like_whole_model(outputs["convnet/y"], expected)
    inline = np.asarray(done["networks"]["convnet"]["outputs"]["y"]["data"], dtype=np.float32)
    np.testing.assert_allclose(inline, expected, rtol=1e-6, atol=1e-6)

    assert server.wait(npy_job)["state"] == "done"
    outputs = server.outputs(npy_job)
    for network in ("convnet", "resnet"):
        assert_like_whole_model(outputs[f"{network}/y"],
                                whole_model(store.model_files[network], x))


def test_json_and_npz_inputs_are_accepted(server: Server, store: Store) -> None:
    x = np.random.default_rng(2).random((1, 3, 16, 16)).astype(np.float32)
    body = json.dumps({"inputs": {"x": {"data": x.ravel().tolist(), "shape": list(x.shape)}}})
    json_job = server.submit("both", body.encode(), "application/json")
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=x)
    npz_job = server.submit("both", buffer.getvalue(), "application/x-npz")
    expected = whole_model(store.model_files["resnet"], x)
    for job_id in (json_job, npz_job):
        assert server.wait(job_id)["state"] == "done"
        assert_like_whole_model(server.outputs(job_id)["resnet/y"], expected)


def test_a_post_with_wait_answers_with_the_result(server: Server, store: Store) -> None:
    x = np.random.default_rng(4).random((1, 3, 16, 16)).astype(np.float32)
    status, headers, data = server.request("POST", "/v1/jobs?graph=both&wait=30",
                                           body=npy_bytes(x),
                                           headers={"Content-Type": "application/x-npy"})
    ended = json.loads(data)
    assert status == 200 and ended["state"] == "done", ended
    assert headers["Location"] == f"/v1/jobs/{ended['id']}"
    assert server.json("GET", headers["Location"])[1] == ended  # the journaled result
    inline = np.asarray(ended["networks"]["resnet"]["outputs"]["y"]["data"], dtype=np.float32)
    assert_like_whole_model(inline, whole_model(store.model_files["resnet"], x))
    # A job that cannot end within the wait (seconds of MatMuls against 10 ms): a 202.
    status, document = server.json("POST", "/v1/jobs?graph=slow&wait=0.01",
                                   body=_slow_input(),
                                   headers={"Content-Type": "application/x-npy"})
    assert status == 202 and document["state"] in ("queued", "running"), document
    assert server.json("DELETE", document["url"])[0] == 202
    assert server.wait(document["id"])["state"] == "cancelled"
    status, document = server.json("POST", "/v1/jobs?graph=both&wait=soon",
                                   body=npy_bytes(x),
                                   headers={"Content-Type": "application/x-npy"})
    assert status == 400 and "?wait= expects seconds, got 'soon'" in document["error"]
    _assert_idle_and_flat(server)


def _slow_input() -> bytes:
    return npy_bytes(np.random.default_rng(3).random((SLOW_SIDE, SLOW_SIDE))
                     .astype(np.float32))


def test_cancel_a_running_job_returns_its_memory(server: Server) -> None:
    job_id = server.submit("slow", _slow_input(), "application/x-npy")
    # Long-polls while the job is queued: the service wakes it when the job starts.
    assert server.json("GET", f"/v1/jobs/{job_id}?wait=30&while=queued")[1]["state"] \
        == "running"
    status, answer = server.json("DELETE", f"/v1/jobs/{job_id}")
    assert status == 202 and answer["state"] == "cancelling"
    ended = server.wait(job_id)
    assert ended["state"] == "cancelled"
    assert ended["networks"]["slow"]["status"] == "cancelled"
    assert "cancelled by the client" in ended["networks"]["slow"]["reason"]
    status, answer = server.json("DELETE", f"/v1/jobs/{job_id}")
    assert status == 409 and "already ended (cancelled)" in answer["error"]
    status, answer = server.json("GET", f"/v1/jobs/{job_id}/outputs.npz")
    assert status == 404 and "no outputs" in answer["error"]
    _assert_idle_and_flat(server)


def _assert_idle_and_flat(server: Server) -> None:
    status = server.json("GET", "/v1/status?wait=30")[1]  # answers once no job is left
    assert status["active_jobs"] == 0
    # Idle, the ledger holds the stages kept loaded between jobs (the default) and nothing
    # else.
    assert status["reserved_bytes"] == status["kept_loaded_bytes"]
    assert status["over_budget_violations"] == 0
    assert set(status["scheduler_state"].values()) == {0}, status["scheduler_state"]


def test_every_refusal_has_its_status_and_a_one_line_reason(server: Server) -> None:
    x = npy_bytes(np.zeros((1, 3, 16, 16), dtype=np.float32))
    cases = [
        ("/v1/jobs?graph=nope", x, 400, "unknown graph 'nope'"),
        ("/v1/jobs", x, 400, "missing ?graph=NAME"),
        ("/v1/jobs?graph=both", b"not an image", 400, "expected a JPEG or PNG image"),
        ("/v1/jobs?graph=both", b"\x89PNG\r\n\x1a\nbroken", 400, "cannot decode the image"),
        ("/v1/jobs?graph=photo", x, 400, "network 'convnet': preprocess expects a photo"),
        ("/v1/jobs?graph=both", b"\0" * 1_100_000, 413, "more than the limit of 1000000"),
        ("/v1/jobs?graph=both", png_bytes(400, 300), 413, "120000 pixels"),
    ]
    for path, body, expected_status, message in cases:
        status, document = server.json("POST", path, body=body,
                                       headers={"Content-Type": "application/octet-stream"})
        assert status == expected_status, (path, document)
        assert message in document["error"] and "\n" not in document["error"]
    for method, path in (("GET", "/v1/jobs/999999"), ("DELETE", "/v1/jobs/999999"),
                         ("GET", "/v1/jobs/abc"), ("GET", "/v1/jobs/999999/outputs.npz")):
        status, document = server.json(method, path)
        assert status == 404 and "no job" in document["error"]
    metrics = server.request("GET", "/metrics")[2].decode()
    assert 'masa_jobs_rejected_total{reason="unknown_graph"} 2.0' in metrics
    assert 'masa_jobs_rejected_total{reason="too_large"} 2.0' in metrics


def test_a_full_queue_answers_429_with_retry_after(server: Server) -> None:
    body = _slow_input()
    jobs: list[int] = []
    for _ in range(12):  # jobs of ~0.5 s each: the limit of 6 is reached well before
        status, headers, data = server.request("POST", "/v1/jobs?graph=slow", body=body)
        if status != 202:
            break
        jobs.append(json.loads(data)["id"])
    assert status == 429 and headers["Retry-After"] == "1" and len(jobs) >= 6
    assert "6 jobs are waiting or running (the limit is 6)" in json.loads(data)["error"]
    for job_id in jobs:
        server.request("DELETE", f"/v1/jobs/{job_id}")
    assert {server.wait(job_id)["state"] for job_id in jobs} <= {"cancelled", "done"}
    _assert_idle_and_flat(server)


def test_graphs_networks_health_readiness_metrics_openapi(server: Server) -> None:
    status, graphs = server.json("GET", "/v1/graphs")
    assert status == 200 and set(graphs["graphs"]) == {"both", "photo", "slow"}
    assert graphs["graphs"]["photo"]["networks"]["resnet"]["after"] == ["convnet"]
    assert graphs["graphs"]["photo"]["networks"]["convnet"]["input"] == "preprocess"
    status, networks = server.json("GET", "/v1/networks")
    assert networks["networks"]["convnet"]["stages"] == 3
    assert networks["networks"]["slow"]["weight_bytes"] >= 4 * SLOW_SIDE**2 * 4
    assert server.request("GET", "/healthz")[0] == 200
    status, ready = server.json("GET", "/readyz")
    assert status == 200 and ready["ready"] and all(ready["checks"].values())
    status, headers, body = server.request("GET", "/metrics")
    text = body.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    for name in ("masa_jobs_accepted_total", "masa_queue_jobs", "masa_ledger_reserved_bytes",
                 "masa_memory_budget_bytes 2.68435456e+08", "process_resident_memory_bytes",
                 "masa_job_response_seconds_bucket", "masa_over_commits",
                 "masa_task_seconds_total"):
        assert name in text
    status, document = server.json("GET", "/openapi.json")
    assert status == 200 and document["openapi"].startswith("3.")
    for path, operations in document["paths"].items():
        concrete = path.replace("{id}", "1")
        for method in operations:
            if method == "get":
                assert server.request("GET", concrete)[0] not in (405, 500), path


# ---------------------------------------------------------------- security


def test_a_token_protected_server(store: Store, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    config = write_config(tmp_path, store, token_file=str(token_file))
    server = Server(config, token="s3cret-token")
    try:
        x = npy_bytes(np.zeros((1, 3, 16, 16), dtype=np.float32))
        for token in ("", "wrong", "s3cret-token-and-more"):
            status, headers, data = server.request("POST", "/v1/jobs?graph=both", body=x,
                                                   token=token)
            assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
            assert "missing or wrong token" in json.loads(data)["error"]
        assert server.request("GET", "/v1/graphs", token="wrong")[0] == 401
        assert server.request("GET", "/healthz", token="wrong")[0] == 200
        job_id = server.submit("both", x, "application/x-npy")
        assert server.wait(job_id)["state"] == "done"
    finally:
        assert server.stop() == 0


def test_a_non_loopback_address_needs_a_token_file(store: Store, tmp_path: Path) -> None:
    config = write_config(tmp_path, store, listen="0.0.0.0:8080")
    with pytest.raises(UserError, match="0.0.0.0 is not a loopback address: set token_file"):
        load_config(config)
    result = subprocess.run([sys.executable, "-m", "masa", "serve", "--config", str(config)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_the_read_ahead_window_reaches_the_daemons_policy(store: Store, tmp_path: Path) -> None:
    from masa.serve.service import Service

    assert load_config(write_config(tmp_path, store)).read_ahead_bytes is None
    config = load_config(write_config(tmp_path, store, read_ahead="8MiB"))
    assert config.read_ahead_bytes == 8 * 2**20
    service = Service(config)
    try:
        assert service.state.policy.read_ahead_bytes == 8 * 2**20  # type: ignore[attr-defined]
    finally:
        service.close()


def test_keep_cached_reaches_the_daemons_executor(store: Store, tmp_path: Path) -> None:
    from masa.serve.service import Service

    assert load_config(write_config(tmp_path, store)).keep_cached_bytes is None
    config = load_config(write_config(tmp_path, store, keep_cached="4MiB"))
    service = Service(config)
    try:
        kept = service.backend.stages.kept_files
        assert kept is not None and kept.keep_bytes == 4 * 2**20
    finally:
        service.close()


def test_the_daemon_keeps_loaded_stages_between_jobs(store: Store, tmp_path: Path) -> None:
    assert load_config(write_config(tmp_path, store)).keep_loaded_bytes is None  # the budget
    assert load_config(write_config(tmp_path, store, keep_loaded="0")).keep_loaded_bytes == 0
    with pytest.raises(UserError, match="at 'keep_loaded': policy 'bulk' does not keep"):
        load_config(write_config(tmp_path, store, keep_loaded="8MiB", policy="bulk"))
    x = npy_bytes(np.random.default_rng(3).standard_normal((1, 3, 16, 16), np.float32))
    stages = sum(len(load_store_network(store.path, name).stages)
                 for name in ("convnet", "resnet"))

    def two_jobs(keep_loaded: str) -> dict:
        server = Server(write_config(tmp_path / keep_loaded, store, keep_loaded=keep_loaded))
        try:
            for _ in range(2):
                assert server.wait(server.submit("both", x, "application/x-npy"))["state"] \
                    == "done"
            status = server.json("GET", "/v1/status?wait=30")[1]
        finally:
            server.stop()
        assert status["reserved_bytes"] == status["kept_loaded_bytes"]
        assert status["over_budget_violations"] == 0
        assert set(status["scheduler_state"].values()) == {0}, status["scheduler_state"]
        return status

    # Keeping, the second job loaded nothing and, idle, the ledger holds the kept
    # stages alone; with keep_loaded: 0 every job loads and idle holds nothing.
    kept_all = two_jobs("64MiB")
    assert kept_all["loads_reused"] == kept_all["kept_stages"] == stages
    nothing = two_jobs("0")
    assert nothing["loads_reused"] == nothing["kept_stages"] == nothing["reserved_bytes"] == 0
    # A bound of half the stages' bytes: the daemon keeps its pinned stages only.
    half_bytes = kept_all["kept_loaded_bytes"] // 2
    pinned = two_jobs(str(half_bytes))
    assert 0 < pinned["kept_stages"] < stages
    assert pinned["loads_reused"] == pinned["kept_stages"]
    assert 0 < pinned["kept_loaded_bytes"] <= half_bytes


def test_a_bad_config_lists_every_problem_with_its_path(store: Store, tmp_path: Path) -> None:
    config = write_config(
        tmp_path, store, workers=0, policy="fastest", memory="lots", listen="nowhere",
        read_ahead="a little", keep_cached="-1MiB",
        limits={"max_queued_jobs": 0, "bogus": 1},
        graphs={"g": {"graph": {"convnet": None, "resnet": {"after": "convnet"}},
                      "preprocess": {"convnet": {"layout": "chw"}, "ghost": {}}},
                "k": {"graph": {"convnet": None, "resnet": {"after": "convnet2"}}},
                "h": {"graph": ["missing"]}, "i": {"workload": "nope.yaml"}})
    result = subprocess.run([sys.executable, "-m", "masa", "serve", "--config", str(config)],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr
    message = result.stderr.strip()
    assert "\n" not in message and "Traceback" not in message
    for expected in ("at 'workers': expected a positive number, got 0",
                     "at 'policy': expected one of", "at 'memory': expected 'auto' or",
                     "at 'read_ahead': expected a size such as 512MiB",
                     "at 'keep_cached': expected a size such as 512MiB",
                     "at 'listen': expected HOST:PORT",
                     "at 'limits.max_queued_jobs': expected an integer >= 1",
                     "at 'limits.bogus': unknown field",
                     "at 'graphs.k.graph.resnet.after': unknown network 'convnet2'",
                     "at 'graphs.g.preprocess.convnet.layout': expected one of nchw, nhwc",
                     "at 'graphs.g.preprocess.ghost': unknown network 'ghost'",
                     "at 'graphs.h.graph.missing': unknown network 'missing'",
                     "nope.yaml: no such workload file"):
        assert expected in message, expected


# ---------------------------------------------------------------- shutdown


def test_sigterm_refuses_new_jobs_and_keeps_unfinished_ones_for_the_next_start(
        store: Store, tmp_path: Path) -> None:
    config = write_config(tmp_path, store, shutdown_grace_s=0.2, workers=1)
    server = Server(config)
    jobs = [server.submit("slow", _slow_input(), "application/x-npy") for _ in range(3)]
    server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    refused = None
    while refused is None and time.monotonic() < deadline:
        try:
            status, document = server.json("POST", "/v1/jobs?graph=slow", body=_slow_input())
        except (urllib.error.URLError, ConnectionError):
            break  # already stopped: the grace time is short
        if status == 503:
            refused = document
    assert refused is None or "shutting down" in refused["error"]
    assert server.stop() == 0
    restarted = Server(config)
    try:
        states = [restarted.wait(job_id)["state"] for job_id in jobs]
        assert states == ["done"] * 3
        status = restarted.json("GET", "/v1/status")[1]
        assert status["active_jobs"] == 0
    finally:
        assert restarted.stop() == 0


# ---------------------------------------------------------------- the client


def test_masa_submit_waits_prints_results_and_saves_outputs(server: Server,
                                                            tmp_path: Path) -> None:
    photo = tmp_path / "photo.png"
    photo.write_bytes(png_bytes(30, 20, seed=5))
    result = subprocess.run(
        [sys.executable, "-m", "masa", "submit", "--url", server.url, "--graph", "photo",
         str(photo), "--wait", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout and "convnet done, resnet done" in result.stdout
    (saved,) = (tmp_path / "out").glob("photo-*.npz")
    assert set(np.load(saved)) == {"convnet/y", "resnet/y"}
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"garbage")
    result = subprocess.run(
        [sys.executable, "-m", "masa", "submit", "--url", server.url, "--graph", "both",
         str(bad)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2 and "answered 400" in result.stderr


# ---------------------------------------------------------------- decoding, preprocessing

LIMITS = Limits(max_image_pixels=10_000, max_decoded_bytes=1_000_000)


def test_a_small_npz_that_expands_past_the_limit_is_refused_unread() -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.zeros(2_000_000, dtype=np.float32))  # 8 MB of zeros
    assert len(buffer.getvalue()) < 100_000
    with pytest.raises(TooLarge, match="expands to"):
        decode_body(buffer.getvalue(), "application/x-npz", LIMITS)
    with pytest.raises(BadInput, match="object arrays"):
        decode_body(npy_bytes(np.array([{}], dtype=object)), "", LIMITS)
    with pytest.raises(TooLarge, match="array of shape"):
        decode_body(json.dumps({"inputs": {"x": {"data": [0.0] * 300_000}}}).encode(),
                    "application/json", LIMITS)


def test_npy_bodies_are_read_in_place_and_outputs_round_trip_through_npz() -> None:
    rng = np.random.default_rng(7)
    tensor = rng.random((1, 3, 8, 8)).astype(np.float32)
    body = npy_bytes(tensor)
    (decoded,) = decode_body(body, "", LIMITS).arrays.values()
    assert np.array_equal(decoded, tensor)
    assert decoded.base is not None and not decoded.flags.writeable  # a view of the body
    fortran = np.asfortranarray(rng.random((3, 5)))
    (decoded_fortran,) = decode_body(npy_bytes(fortran), "", LIMITS).arrays.values()
    assert np.array_equal(decoded_fortran, fortran)
    outputs = {"agenet/prob": tensor[0, 0], "gendernet/label": np.arange(6).reshape(2, 3),
               "f": fortran, "empty": np.zeros((0, 4), dtype=np.int8)}
    archive = encode_npz(outputs)
    assert zipfile.ZipFile(io.BytesIO(archive)).testzip() is None  # every CRC matches
    with np.load(io.BytesIO(archive)) as loaded:
        assert sorted(loaded.files) == sorted(outputs)
        for name, value in outputs.items():
            assert loaded[name].dtype == value.dtype and np.array_equal(loaded[name], value)
    assert decode_body(archive, "application/x-npz", LIMITS).arrays.keys() == outputs.keys()


def test_preprocess_resize_crop_bgr_mean_std_layout_dtype() -> None:
    photo = (np.random.default_rng(4).random((30, 40, 3)) * 255).astype(np.uint8)
    spec = Preprocess(resize=20, crop=(16, 16), channels="bgr", scale=1 / 255,
                      mean=(0.1, 0.2, 0.3), std=(0.5, 0.5, 0.5), layout="nhwc")
    tensor = TensorSpec("x", "float32", (1, 16, 16, 3), None)
    result = preprocess_image(photo, spec, tensor)
    resized = Image.fromarray(photo).resize((27, 20), Image.Resampling.BILINEAR)
    expected = np.asarray(resized, dtype=np.float32)[2:18, 5:21, ::-1] * np.float32(1 / 255)
    expected = (expected - np.float32([0.1, 0.2, 0.3])) / np.float32([0.5, 0.5, 0.5])
    assert result.shape == (1, 16, 16, 3) and result.dtype == np.float32
    np.testing.assert_allclose(result[0], expected, rtol=1e-6)
    as_bytes = preprocess_image(photo, Preprocess(dtype="uint8", channels="gray"),
                                TensorSpec("x", "float32", (1, 1, 8, 8), None))
    assert as_bytes.shape == (1, 1, 8, 8) and as_bytes.dtype == np.uint8
