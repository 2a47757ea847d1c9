"""`masa submit --url URL --graph NAME FILE...`: send files to a running daemon.

A small client on the standard library's urllib (nothing heavy to import on
the machine that sends photos): each FILE is POSTed as one job, with its
Content-Type from its suffix; with `--wait` it long-polls until the job
ends (a single file: the POST itself waits, one request) and prints one
line per job (id, state, each network's status), or one JSON document
with `--json`; `--out DIR` saves each job's outputs.npz.
Exit 0 when every job ended done, 1 when one failed or was cancelled (or the
daemon could not be reached or refused for lack of room), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from masa.common.atomic import atomic_write_bytes
from masa.common.errors import EXIT_FAILED, EXIT_OK, RunFailed, UserError
from masa.common.output import add_json_flag, print_json

CONTENT_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png",
                 ".npy": "application/x-npy", ".npz": "application/x-npz",
                 ".json": "application/json"}
FINAL_STATES = ("done", "failed", "cancelled")
_POLL_S = 30  # one long-poll; repeated until the job ends or --timeout


def register(subparsers: argparse._SubParsersAction) -> None:
    submit = subparsers.add_parser(
        "submit", help="send images or tensors to a running `masa serve`",
        description="POST each FILE (JPEG, PNG, .npy, .npz or JSON) as one job of the graph "
                    "NAME; print the job ids, or with --wait each job's result. Exit 1 if a "
                    "job failed.")
    submit.add_argument("files", nargs="+", type=Path, metavar="FILE")
    submit.add_argument("--url", default="http://127.0.0.1:8080",
                        help="the daemon (default http://127.0.0.1:8080)")
    submit.add_argument("--graph", required=True, help="job graph offered by the daemon")
    submit.add_argument("--wait", action="store_true", help="wait for each job to end")
    submit.add_argument("--timeout", type=float, default=600.0,
                        help="with --wait: give up on a job after this many seconds")
    submit.add_argument("--out", type=Path, help="with --wait: save each job's outputs "
                        "here as FILESTEM-JOBID.npz")
    submit.add_argument("--token-file", type=Path, help="file holding the bearer token")
    add_json_flag(submit, "the jobs")
    submit.set_defaults(handler=submit_command)


class _Client:
    def __init__(self, url: str, token: str | None) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str | None = None, timeout_s: float = 60.0
                ) -> tuple[int, bytes]:
        headers = dict(self.headers)
        if content_type:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise RunFailed(f"cannot reach {self.url}: {reason}") from None

    def json(self, method: str, path: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
        status, data = self.request(method, path, **kwargs)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, {"error": data.decode(errors="replace").strip()}


def _refused(file: Path, status: int, document: dict[str, Any]) -> Exception:
    message = f"{file}: the daemon answered {status}: {document.get('error', document)}"
    return RunFailed(message) if status in (429, 503) or status >= 500 else UserError(message)


def submit_command(args: argparse.Namespace) -> int:
    token = None
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as error:
            raise UserError(f"--token-file {args.token_file}: {error.strerror}") from None
    client = _Client(args.url, token)
    parameters: dict[str, Any] = {"graph": args.graph}
    if args.wait and len(args.files) == 1:  # one request: the POST waits for the result
        parameters["wait"] = f"{min(_POLL_S, args.timeout):.1f}"
    query = urllib.parse.urlencode(parameters)
    submitted = []
    ended: dict[int, dict[str, Any]] = {}  # job id -> its result, when the POST had it
    for file in args.files:
        try:
            body = file.read_bytes()
        except OSError as error:
            raise UserError(f"{file}: {error.strerror}") from None
        content_type = CONTENT_TYPES.get(file.suffix.lower(), "application/octet-stream")
        status, document = client.json("POST", f"/v1/jobs?{query}", body=body,
                                       content_type=content_type)
        if status == 200 and "wait" in parameters:
            ended[int(document["id"])] = document
        elif status != 202:
            raise _refused(file, status, document)
        submitted.append((file, int(document["id"])))
    if not args.wait:
        if args.json:
            print_json({"jobs": [{"file": str(f), "id": i} for f, i in submitted]})
        else:
            for file, job_id in submitted:
                print(f"{file}: job {job_id} accepted")
        return EXIT_OK
    results = [(file, ended.get(job_id) or _wait(client, job_id, args.timeout))
               for file, job_id in submitted]
    if args.out is not None:
        for file, result in results:
            _save_outputs(client, args.out, file, result)
    if args.json:
        print_json({"jobs": [{"file": str(file), **result} for file, result in results]})
    else:
        for file, result in results:
            print(_line(file, result))
    return EXIT_OK if all(r.get("state") == "done" for _, r in results) else EXIT_FAILED


def _wait(client: _Client, job_id: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        poll_s = max(0.0, min(_POLL_S, deadline - time.monotonic()))
        status, document = client.json("GET", f"/v1/jobs/{job_id}?wait={poll_s:.1f}",
                                       timeout_s=poll_s + 30)
        if status != 200:
            raise RunFailed(f"job {job_id}: the daemon answered {status}: "
                            f"{document.get('error', document)}")
        if document.get("state") in FINAL_STATES or time.monotonic() >= deadline:
            return document


def _save_outputs(client: _Client, out: Path, file: Path, result: dict[str, Any]) -> None:
    if result.get("state") not in FINAL_STATES:
        return
    status, data = client.request("GET", f"/v1/jobs/{result['id']}/outputs.npz")
    if status == 200:
        atomic_write_bytes(out / f"{file.stem}-{result['id']}.npz", data)


def _line(file: Path, result: dict[str, Any]) -> str:
    networks = result.get("networks", {})
    parts = []
    for name, record in networks.items():
        part = f"{name} {record.get('status')}"
        if record.get("error"):
            part += f" ({record['error']})"
        parts.append(part)
    response = result.get("response_ms")
    timing = f" in {response:.0f} ms" if isinstance(response, int | float) else ""
    return (f"{file}: job {result.get('id')} {result.get('state')}{timing}: "
            f"{', '.join(parts) or result.get('reason', '')}")
