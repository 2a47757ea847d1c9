"""`masa serve` soak and overhead: jobs over real HTTP on loopback (issue 15).

Owns the daemon's two benchmarks, written to docs/bench-serve.md:

- soak: JOBS real jobs (AgeNet + GenderNet replicas of the zoo, scale 0.05,
  each job both networks) POSTed as .npy at a steady rate to a `masa serve`
  child process; each result is long-polled. The rate must be below what
  the device sustains (the capacity line of the report: jobs POSTed all at
  once), or the queue, and with it memory, grows with time whatever the
  daemon does. It reports throughput and the p50/p90/p99 response (the
  daemon's own accept-to-end time, and the client's POST-to-result time),
  the daemon's resident memory (VmRSS) and the scheduler state's entries
  (GET /v1/status) after the first 100 jobs and at the end, both taken with
  no job in the daemon (the submissions pause after job 100 until it is
  idle, then resume at the same rate);
- overhead: jobs one at a time (no queueing), asked for in turn in one
  request (POST ?wait=) and as a POST then a long-poll; the daemon's added
  latency per job is the client's POST-to-result time less the scheduler's
  time for the job (submission to the scheduler until its last network
  ended), i.e. HTTP, decoding, the journal's commits, the wake-up of the
  waiting request. Next to it: `masa run`'s response on the same networks,
  jobs 300 ms apart.

Every phase records the machine's 1-minute load average when it ends (the
machine is shared: figures taken under load are marked so).

Run:  python benchmarks/bench_serve.py [--jobs 1000] [--rate 8] [--sequential 200]
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import numpy as np

from masa.common.argtypes import memory_size
from masa.common.atomic import atomic_write_text
from masa.runtime.registry import keep_loaded_for
from masa.runtime.runner import RunSettings, execute, prepare_run
from workloads.zoo import write_zoo

ROOT = Path(__file__).resolve().parent.parent
NETWORKS = ("agenet", "gendernet")
SCALE = 0.05
# The two ways a client waits for a result: the POST itself (?wait=), or a 202 and a
# long-poll (GET ?wait=).
WAYS = {"one request": True, "POST + long-poll": False}


_CONNECTIONS = threading.local()  # each client thread keeps its connection, as clients do


def _request(url: str, method: str = "GET", body: bytes | None = None) -> dict[str, Any]:
    """One request on this thread's kept-alive HTTP/1.1 connection; its JSON answer."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    if not hasattr(_CONNECTIONS, "by_server"):
        _CONNECTIONS.by_server = {}
    connection = _CONNECTIONS.by_server.get(parts.netloc)
    reused = connection is not None
    if connection is None:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        _CONNECTIONS.by_server[parts.netloc] = connection
    try:
        connection.request(method, path, body=body)
        response = connection.getresponse()
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        connection.close()
        del _CONNECTIONS.by_server[parts.netloc]
        if not reused:
            raise
        return _request(url, method, body)  # the server had closed the idle connection
    data = response.read()
    if response.status >= 400:
        raise RuntimeError(f"{method} {path}: {response.status} {data[:200]!r}")
    return json.loads(data)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _start(directory: Path, store: Path, sync: str,
           keep_loaded: int | None = None) -> tuple[subprocess.Popen, str]:
    config = directory / f"device-{sync}.yaml"
    config.write_text(json.dumps({
        "store": str(store), "memory": "256MiB", "workers": 2, "listen": "127.0.0.1:0",
        **({} if keep_loaded is None else {"keep_loaded": keep_loaded}),
        "journal": str(directory / f"journal-{sync}.sqlite"), "journal_sync": sync,
        "limits": {"max_queued_jobs": 1000},
        "graphs": {"pair": {"graph": list(NETWORKS)}}}))
    process = subprocess.Popen([sys.executable, "-m", "masa", "-q", "serve", "--config",
                                str(config)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout is not None
    line = process.stdout.readline()
    return process, line.split("listening on ", 1)[1].strip()


def _body(index: int) -> bytes:
    x = np.random.default_rng(index).random((1, 3, 227, 227)).astype(np.float32)
    buffer = io.BytesIO()
    np.save(buffer, x)
    return buffer.getvalue()


def _one_job(url: str, body: bytes, *, one_request: bool = False
             ) -> tuple[float, dict[str, Any]]:
    """POST, then long-poll until the end (`one_request`: the POST itself waits, ?wait=):
    (client seconds, the job document)."""
    start = time.perf_counter()
    wait = "&wait=30" if one_request else ""
    document = _request(f"{url}/v1/jobs?graph=pair{wait}", "POST", body)
    while document["state"] not in ("done", "failed", "cancelled"):
        document = _request(f"{url}/v1/jobs/{document['id']}?wait=30")
    return time.perf_counter() - start, document


def _percentiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=np.float64)
    return {f"p{q}": float(np.percentile(array, q)) for q in (50, 90, 99)} | {
        "mean": float(array.mean())}


def _load_1min() -> float:
    return os.getloadavg()[0]


def _idle_mark(url: str, pid: int) -> dict[str, Any]:
    """RSS and scheduler state once no job is in the daemon."""
    status = _request(f"{url}/v1/status?wait=60")
    assert status["active_jobs"] == 0, status
    return {"rss_bytes": _rss_bytes(pid), "state": status["scheduler_state"],
            "reserved_bytes": status["reserved_bytes"]}


def capacity(url: str, jobs: int) -> dict[str, Any]:
    """Jobs POSTed all at once: how many per second the device ends (its capacity)."""
    bodies = [_body(i % 16) for i in range(16)]
    threads = [threading.Thread(target=_one_job, args=(url, bodies[i % 16]))
               for i in range(jobs)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed_s = time.perf_counter() - start
    return {"jobs": jobs, "jobs_per_s": jobs / elapsed_s, "load_1min": _load_1min()}


def soak(url: str, pid: int, jobs: int, rate_per_s: float) -> dict[str, Any]:
    bodies = [_body(i % 16) for i in range(16)]
    results: list[tuple[float, dict[str, Any]] | None] = [None] * jobs
    marks: dict[str, Any] = {}

    def run(index: int) -> None:
        results[index] = _one_job(url, bodies[index % 16])

    threads: list[threading.Thread] = []
    start = time.perf_counter()
    paused_s = 0.0
    for index in range(jobs):
        if index == 100:  # the first 100 ended and the daemon is idle: the first mark
            pause = time.perf_counter()
            for thread in threads:
                thread.join()
            marks["after_100"] = _idle_mark(url, pid)
            paused_s = time.perf_counter() - pause
            start += paused_s
        delay = start + index / rate_per_s - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        thread = threading.Thread(target=run, args=(index,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    elapsed_s = time.perf_counter() - start
    marks["end"] = _idle_mark(url, pid)
    finished = [r for r in results if r is not None]
    states = {doc["state"] for _, doc in finished}
    return {"jobs": jobs, "rate_per_s": rate_per_s, "elapsed_s": elapsed_s,
            "throughput_per_s": jobs / elapsed_s, "states": sorted(states),
            "server_response_ms": _percentiles([d["response_ms"] for _, d in finished]),
            "client_response_ms": _percentiles([s * 1000 for s, _ in finished]),
            "load_1min": _load_1min(), **marks}


def overhead(url: str, jobs: int) -> dict[str, Any]:
    """Jobs one at a time, each way of asking in turn (so both see the same machine):
    per way, the added, client and scheduler milliseconds."""
    samples: dict[str, dict[str, list[float]]] = {
        way: {"added_ms": [], "client_ms": [], "scheduler_ms": []} for way in WAYS}
    for index in range(jobs):
        for way, one_request in WAYS.items():
            seconds, document = _one_job(url, _body(index % 16), one_request=one_request)
            in_scheduler = max(r["ended_ms"] for r in document["networks"].values())
            samples[way]["client_ms"].append(seconds * 1000)
            samples[way]["scheduler_ms"].append(in_scheduler)
            samples[way]["added_ms"].append(seconds * 1000 - in_scheduler)
    return {"jobs": jobs, "load_1min": _load_1min()} | {
        way: {key: _percentiles(values) for key, values in by_key.items()}
        for way, by_key in samples.items()}


def masa_run_response(store: Path, directory: Path, jobs: int,
                      keep_loaded: int | None = None) -> dict[str, float]:
    workload = directory / "pair.yaml"
    workload.write_text(f"graph: {list(NETWORKS)}\ninput: random\n"
                        f"arrivals: {{kind: periodic, interval_ms: 300, count: {jobs}}}\n")
    budget_bytes = 256 * 2**20  # as the daemon's config; stages kept as `masa run` does
    outcome = execute(prepare_run(workload, store),
                      RunSettings(workers=2, memory_budget_bytes=budget_bytes,
                                  keep_loaded_bytes=keep_loaded_for(
                                      "masa", keep_loaded, budget_bytes)),
                      simulate=False)
    ends: dict[int, int] = {}
    for record in outcome.schedule:
        job = int(record.task_id.split("/", 1)[0][1:])
        ends[job] = max(ends.get(job, 0), record.end_us)
    return _percentiles([(ends[job.job_id] - job.arrival_us) / 1000
                         for job in outcome.jobs]) | {"load_1min": _load_1min()}


def _report(results: dict[str, Any], command: str) -> str:
    soak_result = results["soak"]
    rss_100 = soak_result["after_100"]["rss_bytes"]
    rss_end = soak_result["end"]["rss_bytes"]
    lines = [
        "# `masa serve`: soak and overhead", "",
        f"Measured by `{command}` on this project's shared 2-core x86-64 machine "
        "(other agents' jobs ran at the same time); AgeNet + GenderNet zoo replicas at "
        f"scale {SCALE}, both networks per job, a 1x3x227x227 float32 `.npy` per request, "
        "2 workers, budget 256 MiB, journal `synchronous=FULL`, loopback HTTP; "
        + ("loaded stages kept between jobs within the budget (the default since "
           "2026-11-28; the ledger's idle reservation below is those stages)."
           if results["keep_loaded"] is None
           else f"loaded stages kept between jobs: at most {results['keep_loaded']} bytes."), "",
        "## Soak", "",
        f"Capacity: {results['capacity']['jobs']} jobs POSTed at once end at "
        f"{results['capacity']['jobs_per_s']:.1f} jobs/s (load average "
        f"{results['capacity']['load_1min']:.2f}); the soak offers "
        f"{soak_result['rate_per_s']:g} jobs/s, below it, so the queue stays short.", "",
        f"{soak_result['jobs']} jobs at {soak_result['rate_per_s']:g} jobs/s: "
        f"states {', '.join(soak_result['states'])}; throughput "
        f"{soak_result['throughput_per_s']:.1f} jobs/s over {soak_result['elapsed_s']:.1f} s "
        f"(load average {soak_result['load_1min']:.2f} at the end).",
        "", "| response (ms) | p50 | p90 | p99 | mean |", "|---|---|---|---|---|"]
    for key, label in (("server_response_ms", "daemon: accept to end"),
                       ("client_response_ms", "client: POST to result")):
        stats = soak_result[key]
        lines.append(f"| {label} | {stats['p50']:.1f} | {stats['p90']:.1f} | "
                     f"{stats['p99']:.1f} | {stats['mean']:.1f} |")
    after_100, end = soak_result["after_100"], soak_result["end"]
    lines += ["", "Both marks are taken with no job in the daemon.", "",
              "| | resident memory | scheduler state entries | ledger reserved |",
              "|---|---|---|---|",
              f"| after the first 100 jobs | {rss_100 / 2**20:.1f} MiB | "
              f"{sum(after_100['state'].values())} | {after_100['reserved_bytes']} B |",
              f"| after all {soak_result['jobs']} | {rss_end / 2**20:.1f} MiB | "
              f"{sum(end['state'].values())} | {end['reserved_bytes']} B |",
              f"| change | {100 * (rss_end - rss_100) / rss_100:+.1f}% | | |", "",
              "## Added latency per job", ""]
    lines += ["| journal | client asks | jobs | added p50 (ms) | added p90 | client p50 | "
              "scheduler p50 | load average |", "|---|---|---|---|---|---|---|---|"]
    for sync, result in results["overhead"].items():
        for way in WAYS:
            added, client = result[way]["added_ms"], result[way]["client_ms"]
            lines.append(f"| `{sync}` | {way} | {result['jobs']} | {added['p50']:.2f} | "
                         f"{added['p90']:.2f} | {client['p50']:.1f} | "
                         f"{result[way]['scheduler_ms']['p50']:.1f} | "
                         f"{result['load_1min']:.2f} |")
    run = results["masa_run_ms"]
    lines += ["", f"`masa run` on the same networks, jobs 300 ms apart: response p50 "
              f"{run['p50']:.1f} ms, p90 {run['p90']:.1f} ms (load average "
              f"{run['load_1min']:.2f}); the daemon's client p50 (one request) less it: "
              + ", ".join(f"{result['one request']['client_ms']['p50'] - run['p50']:+.1f} ms "
                          f"(`{sync}`)" for sync, result in results["overhead"].items())
              + ".", "",
              "Added latency = the client's POST-to-result time less the scheduler's time "
              "for the job (its submission to the driver until its last network ended): "
              "HTTP on loopback (each client thread keeps its connection open), decoding the "
              "`.npy`, the journal's commit of the result, and the wake-up of the request "
              "that waits for it (the POST itself with `?wait=`, else a long-poll GET after "
              "the 202). "
              "The job's own journaling (its body to a file, its row) runs while the job "
              "starts, and the 202 waits for its commit; under `synchronous=FULL` each "
              "commit also waits for the disk (fsync).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=8.0,
                        help="soak jobs per second, below the capacity")
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--capacity-jobs", type=int, default=100)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench-serve.md")
    parser.add_argument("--keep-loaded", type=memory_size, default=None, metavar="SIZE",
                        help="the daemon's keep_loaded and masa run's --keep-loaded (default: "
                             "theirs, the budget; 0: every job loads its stages)")
    args = parser.parse_args(argv)
    command = "python benchmarks/bench_serve.py " + " ".join(argv or sys.argv[1:])
    results: dict[str, Any] = {"overhead": {}, "keep_loaded": args.keep_loaded}
    with tempfile.TemporaryDirectory(prefix="masa-bench-serve-") as scratch:
        directory = Path(scratch)
        store = directory / "store"
        write_zoo(store, list(NETWORKS), scale=SCALE, profile=False)
        for sync in ("normal", "full"):
            process, url = _start(directory, store, sync, args.keep_loaded)
            try:
                if sync == "normal":  # its own daemon: the soak's marks see none of it
                    results["capacity"] = capacity(url, args.capacity_jobs)
                else:
                    results["soak"] = soak(url, process.pid, args.jobs, args.rate)
                results["overhead"][sync] = overhead(url, args.sequential)
            finally:
                process.terminate()
                process.wait(timeout=120)
        results["masa_run_ms"] = masa_run_response(store, directory, min(args.sequential, 50),
                                                   args.keep_loaded)
    print(json.dumps(results, indent=1))
    atomic_write_text(args.out, _report(results, command.strip()))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
