"""The daemon's HTTP API on aiohttp, and the server around it (signals, shutdown).

Owns the routes of masa.serve.openapi, the token check (bearer token, compared
in constant time; /healthz and /readyz stay open), the request size limit
(413 before the body is read when Content-Length says so), the one-line JSON
errors, long-polling (`?wait=`, woken by the service when a job starts
running and when its result is journaled; `&while=STATE` waits only while the
job is in that state, so a client can wait for a job to start; a POST with
`?wait=` answers with the result itself, 200, when the job ends in time: one
request instead of two) and `serve`:
listen, print the address, run until SIGTERM or SIGINT, then refuse new jobs
(503), let accepted ones finish within the grace time and stop; jobs still
unfinished stay queued in the journal.

Blocking work (decoding, the journal) runs in the event loop's default
executor, never on the loop itself; the one exception is a `.npy` tensor the
job's networks take as it is, whose decoding is a view of the body and whose
check is a comparison of shapes: it is submitted from the loop, without a
hand-over to a thread before the job starts (Service.begin_accept). The 202
waits for the job's journal commit without holding a thread.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aiohttp import web

from masa.sched.jobs import stage_costs
from masa.serve.journal import FINAL_STATES
from masa.serve.metrics import CONTENT_TYPE
from masa.serve.openapi import openapi_document
from masa.serve.service import (
    ServeError,
    Service,
    largest_task_bytes,
    read_token,
    readiness,
    token_matches,
)

log = logging.getLogger(__name__)

MAX_WAIT_S = 60.0
READ_BUFFER_BYTES = 2**20
_OPEN_PATHS = ("/healthz", "/readyz")
_SERVICE = web.AppKey("service", Service)
_WAITERS = web.AppKey("waiters", dict)
_TOKEN = web.AppKey("token", object)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The token, then the handler, with ServeError and aiohttp's own errors as JSON."""
    service = request.app[_SERVICE]
    token = request.app[_TOKEN]
    if token is not None and request.path not in _OPEN_PATHS:
        header = request.headers.get("Authorization", "")
        offered = header[len("Bearer "):] if header.startswith("Bearer ") else None
        if not token_matches(token, offered):
            service.metrics.jobs_rejected.labels("unauthorized").inc()
            return _error(401, "missing or wrong token: send 'Authorization: Bearer TOKEN'",
                          {"WWW-Authenticate": "Bearer"})
    try:
        return await handler(request)
    except ServeError as error:
        if request.method == "POST":
            service.metrics.jobs_rejected.labels(error.reason).inc()
        headers = ({"Retry-After": str(error.retry_after_s)}
                   if error.retry_after_s is not None else None)
        return _error(error.status, str(error), headers)
    except web.HTTPRequestEntityTooLarge as error:
        service.metrics.jobs_rejected.labels("too_large").inc()
        return _error(413, f"body larger than the limit of {error.max_size} bytes")
    except web.HTTPException as error:
        if error.status >= 400:
            return _error(error.status, error.reason)
        raise


def _job_id(request: web.Request) -> int:
    text = request.match_info["id"]
    if not text.isdigit():
        raise ServeError(404, f"no job {text!r}", "not_found")
    return int(text)


async def _run(function: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, function, *args)


async def submit_job(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    if not service.accepting:  # before reading a body that would be refused anyway
        raise ServeError(503, "the daemon is shutting down", "shutting_down")
    graph = request.query.get("graph")
    if not graph:
        raise ServeError(400, "missing ?graph=NAME (see GET /v1/graphs)", "unknown_graph")
    wait_s = _wait_seconds(request)
    limit = service.config.limits["max_body_bytes"]
    if request.content_length is not None and request.content_length > limit:
        raise ServeError(413, f"body of {request.content_length} bytes, more than the limit "
                         f"of {limit}", "too_large")
    body = await request.read()
    content_type = request.content_type or ""
    # A tensor the networks take as it is is decoded and submitted here, on the loop
    # (no hand-over to a thread before the job starts); anything else in a thread.
    started = service.begin_accept(graph, body, content_type, on_loop=True)
    if started is None:
        started = await _run(partial(service.begin_accept, graph, body, content_type))
    job_id, committed = started
    try:  # the job already runs; the 202 waits for its journal record's commit
        await asyncio.wrap_future(committed)
        error = None
    except Exception as failure:
        error = failure
    service.end_accept(job_id, graph, error)
    url = f"/v1/jobs/{job_id}"
    state = "queued"
    if wait_s > 0:  # ?wait=S: the result itself when the job ends within S seconds
        found = await _wait_for_job(request, job_id, wait_s, _until_final)
        if found is not None and found[0] in FINAL_STATES:
            return web.Response(body=found[1], content_type="application/json",
                                headers={"Location": url})
        state = found[0] if found is not None else state
    return web.json_response({"id": job_id, "state": state, "url": url}, status=202,
                             headers={"Location": url})


def _wait_seconds(request: web.Request) -> float:
    """`?wait=` in seconds, within [0, MAX_WAIT_S]; 0 when absent."""
    try:
        return min(MAX_WAIT_S, max(0.0, float(request.query.get("wait", "0"))))
    except ValueError:
        raise ServeError(400, f"?wait= expects seconds, got {request.query['wait']!r}",
                         "bad_input") from None


def _until_final(state: str) -> bool:
    return state not in FINAL_STATES


async def _wait_for_job(request: web.Request, job_id: int, wait_s: float,
                        waiting: Callable[[str], bool]) -> tuple[str, bytes] | None:
    """The job's (state, JSON) once `waiting(state)` is false or wait_s has passed;
    None when there is no such job. Woken by the service's start and final events."""
    service = request.app[_SERVICE]

    async def view() -> tuple[str, bytes] | None:
        # From memory on the loop while the job runs or just ended; else the journal.
        return service.cached_view(job_id) or await _run(service.job_view, job_id)

    if wait_s <= 0:
        return await view()
    event = asyncio.Event()
    waiters: dict[int, set[asyncio.Event]] = request.app[_WAITERS]
    # Registered before the first read: a change cannot slip between.
    waiters.setdefault(job_id, set()).add(event)
    try:
        found = await view()
        deadline_s = asyncio.get_running_loop().time() + wait_s
        while found is not None and waiting(found[0]):
            remaining_s = deadline_s - asyncio.get_running_loop().time()
            if remaining_s <= 0:
                break
            event.clear()
            try:  # asyncio.timeout, unlike wait_for, wraps no task: one wake-up less
                async with asyncio.timeout(remaining_s):
                    await event.wait()
            except TimeoutError:
                pass
            found = await view()
    finally:
        events = waiters.get(job_id)
        if events is not None:
            events.discard(event)
            if not events:
                del waiters[job_id]
    return found


async def get_job(request: web.Request) -> web.Response:
    job_id = _job_id(request)
    wait_s = _wait_seconds(request)
    while_state = request.query.get("while")  # None: wait while the job has not ended
    found = await _wait_for_job(request, job_id, wait_s, _until_final if while_state is None
                                else lambda state: state == while_state)
    if found is None:
        raise ServeError(404, f"no job {job_id}", "not_found")
    return web.Response(body=found[1], content_type="application/json")


async def get_outputs(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    job_id = _job_id(request)
    document = await _run(service.job_document, job_id)
    if document is None:
        raise ServeError(404, f"no job {job_id}", "not_found")
    if not service.is_final(document):
        raise ServeError(409, f"job {job_id} has not ended (it is {document['state']})",
                         "not_ended")
    data = await _run(service.outputs_npz, job_id)
    if data is None:
        raise ServeError(404, f"job {job_id} has no outputs (it ended {document['state']})",
                         "no_outputs")
    return web.Response(body=data, content_type="application/x-npz",
                        headers={"Content-Disposition":
                                 f'attachment; filename="job-{job_id}-outputs.npz"'})


async def cancel_job(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    job_id = _job_id(request)
    state = await _run(service.cancel, job_id)
    if state != "cancelling":
        raise ServeError(409, f"job {job_id} already ended ({state})", "ended")
    return web.json_response({"id": job_id, "state": "cancelling",
                              "url": f"/v1/jobs/{job_id}"}, status=202)


async def list_graphs(request: web.Request) -> web.Response:
    config = request.app[_SERVICE].config
    graphs = {}
    for name, graph in config.graphs.items():
        graphs[name] = {
            "description": graph.description,
            "networks": {node.name: {"after": list(node.after),
                                     "conditional": bool(node.when),
                                     "input": ("transform" if node.transform is not None
                                               else "preprocess" if node.name in graph.preprocess
                                               else "job input")}
                         for node in graph.workload.nodes}}
    return web.json_response({"context": config.context, "graphs": graphs})


async def list_networks(request: web.Request) -> web.Response:
    config = request.app[_SERVICE].config
    networks = {}
    for name, manifest in config.manifests.items():
        costs = [stage_costs(stage) for stage in manifest.stages]
        networks[name] = {
            "stages": len(manifest.stages),
            "weight_bytes": sum(stage.weight_bytes for stage in manifest.stages),
            "resident_bytes": sum(cost.resident_bytes for cost in costs),
            "largest_task_bytes": largest_task_bytes(manifest),
            "profiled": not any(cost.estimated for cost in costs),
            "inputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
                       for t in manifest.inputs],
            "outputs": [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
                        for t in manifest.outputs],
        }
    return web.json_response({"networks": networks})


async def status(request: web.Request) -> web.Response:
    service = request.app[_SERVICE]
    wait_s = _wait_seconds(request)
    if wait_s > 0:  # ?wait=S: until no accepted job is unfinished, or S seconds
        await _run(service.wait_idle, wait_s)
    return web.json_response({
        "accepting": service.accepting, "active_jobs": service.active_jobs(),
        "memory_budget_bytes": service.budget_bytes, "budget": service.budget_how,
        "reserved_bytes": service.state.ledger.reserved_bytes,
        # Of those, what stages kept loaded between jobs hold (`keep_loaded`), and how
        # many LOADs took a kept stage instead of loading it.
        "kept_loaded_bytes": service.state.ledger.kept_bytes,
        "kept_stages": len(service.state.kept),
        "loads_reused": service.state.loads_reused,
        "peak_reserved_bytes": service.peak_reserved_bytes,
        # The process's own measure since start, as `masa run` reports it: anonymous
        # memory above the baseline plus the loaded stages' weights in memory.
        "peak_measured_bytes": service.backend.meter.peak_measured_bytes,
        "over_budget_violations": service.violations,
        "scheduler_state": service.state_sizes(),
        "policy": service.config.policy, "context": service.config.context,
        "workers": service.config.workers})


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    document = await _run(readiness, request.app[_SERVICE])
    return web.json_response(document, status=200 if document["ready"] else 503)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[_SERVICE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def make_app(service: Service) -> web.Application:
    """The application; long-poll waiters are woken from the service's journal thread."""
    app = web.Application(middlewares=[_guard],
                          client_max_size=service.config.limits["max_body_bytes"])
    app[_SERVICE] = service
    app[_TOKEN] = read_token(service.config)
    waiters: dict[int, set[asyncio.Event]] = {}
    app[_WAITERS] = waiters

    async def wire_waiters(app: web.Application) -> None:
        loop = asyncio.get_running_loop()

        def wake(job_id: int) -> None:
            for event in list(waiters.get(job_id, ())):
                event.set()

        def wake_soon(job_id: int) -> None:
            loop.call_soon_threadsafe(wake, job_id)

        service.on_final.append(wake_soon)
        service.on_started.append(wake_soon)

    app.on_startup.append(wire_waiters)
    app.add_routes([
        web.post("/v1/jobs", submit_job),
        web.get("/v1/jobs/{id}", get_job),
        web.delete("/v1/jobs/{id}", cancel_job),
        web.get("/v1/jobs/{id}/outputs.npz", get_outputs),
        web.get("/v1/graphs", list_graphs),
        web.get("/v1/networks", list_networks),
        web.get("/v1/status", status),
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/metrics", metrics),
        web.get("/openapi.json", openapi),
    ])
    return app


async def _serve(service: Service) -> None:
    config = service.config
    # A body is read in large pieces: with aiohttp's 64 KiB buffer a 600 KB tensor
    # pauses and resumes the socket several times before the job can start.
    runner = web.AppRunner(make_app(service), access_log=None,
                           read_bufsize=min(READ_BUFFER_BYTES,
                                            config.limits["max_body_bytes"]))
    await runner.setup()
    if config.unix_socket is not None:
        site: web.BaseSite = web.UnixSite(runner, str(config.unix_socket))
    else:
        site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise OSError(f"cannot listen on {config.url}: {error.strerror}") from None
    url = config.url
    if config.unix_socket is None:
        host, port = runner.addresses[0][:2]
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    # One line on stdout that scripts and tests read for the bound address.
    print(f"masa serve: listening on {url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("stopping: no new jobs; waiting up to %.0f s for %d accepted job(s)",
             config.shutdown_grace_s, service.active_jobs())
    service.stop_accepting()
    finished = await _run(service.drain, config.shutdown_grace_s)
    if not finished:
        log.warning("%d job(s) still unfinished: they stay queued in the journal and run "
                    "at the next start", service.active_jobs())
    await runner.cleanup()


def serve(service: Service) -> int:
    """Run the HTTP server until SIGTERM or SIGINT; 0 after a clean stop."""
    try:
        asyncio.run(_serve(service))
    finally:
        service.close()
    print("masa serve: stopped", file=sys.stderr, flush=True)
    return 0
