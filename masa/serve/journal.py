"""The job journal: every accepted job in SQLite (standard library, WAL), through crashes.

Owns the `jobs` and `events` tables of the daemon's journal file and the
request bodies in the directory beside it (`JOURNAL.bodies/ID.body`):

- `write` applies a batch of `NewJob`, `Started` and `Final` records in one
  transaction. A new job's body is first written to its own file (a
  temporary name, then a rename; with `synchronous=FULL` the file and the
  directory are fsynced), then its row is committed: a row never names a
  body that is not on disk. Keeping bodies out of SQLite keeps the WAL
  small (a 600 KB body used to go through the WAL and a checkpoint) and one
  commit covers every record written at once. `synchronous=FULL` (the
  default) makes a commit survive a power cut, `NORMAL` only a crash of the
  process (WAL: a kill -9 loses nothing either way);
- job ids come from `allocate_id` (above every id ever journaled, also after
  pruning), so a job can be handed to the scheduler while its row is being
  written; the daemon answers 202 only after the commit;
- `unfinished` lists, at start, every accepted job not yet in a final state,
  oldest first, with its body, to be run again (`begin_attempt` counts the
  attempts); `drop_orphan_bodies` removes the files of jobs that ended or
  were never committed (a crash between a rename and its commit);
- a `Final` moves a job to its final state once, guarded by the state it is
  in, and appends the one `final` event of that job; writing it again does
  nothing. Results (per-network status, timings, small outputs as JSON, all
  outputs as one .npz) are kept until `prune` drops jobs ended more than the
  retention time ago. The body file is removed when the job ends.

One connection, shared by the HTTP threads and the journal writer, behind a
lock. Times are Unix seconds.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FINAL_STATES = ("done", "failed", "cancelled")
_FINAL_PLACEHOLDERS = ", ".join("?" * len(FINAL_STATES))
_BODY_SUFFIX = ".body"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, also after pruning
    graph TEXT NOT NULL,
    state TEXT NOT NULL,                   -- queued, running, done, failed, cancelled
    content_type TEXT NOT NULL,
    body BLOB NOT NULL,                    -- empty: the body is in JOURNAL.bodies/ID.body
    accepted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    result TEXT,                           -- JSON
    outputs BLOB                           -- .npz
);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
CREATE TABLE IF NOT EXISTS events (
    job_id INTEGER NOT NULL,
    event TEXT NOT NULL,                   -- accepted, attempt, final
    detail TEXT,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_job ON events (job_id);
"""


@dataclass(frozen=True)
class JournaledJob:
    job_id: int
    graph: str
    state: str
    content_type: str
    body: bytes  # only filled by `unfinished`
    accepted_at: float
    started_at: float | None
    ended_at: float | None
    attempts: int
    cancel_requested: bool
    result: dict[str, Any] | None


@dataclass(frozen=True)
class NewJob:
    """An accepted job (attempt 1), its id from `allocate_id`."""

    job_id: int
    graph: str
    content_type: str
    body: bytes
    accepted_at: float


@dataclass(frozen=True)
class Started:
    """A job's first task was dispatched (informative: queued and running jobs both resume)."""

    job_id: int
    started_at: float


@dataclass(frozen=True)
class Final:
    """A job's end: its state, the result document as JSON text, all outputs as .npz."""

    job_id: int
    state: str
    result_json: str
    outputs_npz: bytes | None


Write = NewJob | Started | Final


class Journal:
    """The journal file and its bodies; every method is safe to call from any thread."""

    def __init__(self, path: Path, *, synchronous: str = "full",
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.bodies = path.parent / f"{path.name}.bodies"
        self.bodies.mkdir(parents=True, exist_ok=True)
        self._durable = synchronous.lower() in ("full", "extra")
        self._lock = threading.Lock()
        self._connection = sqlite3.connect(str(path), check_same_thread=False,
                                           isolation_level=None)  # explicit transactions
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._connection.execute("PRAGMA busy_timeout=5000")
        # Reads are by key and rare (a result after the in-memory ones aged out): a
        # small page cache, so the daemon's memory does not grow with the journal
        # (SQLite's default, 2 MiB, filled as results accumulated).
        self._connection.execute("PRAGMA cache_size=-256")
        self._connection.executescript(_SCHEMA)
        self._id_lock = threading.Lock()
        self._last_id = int(self._connection.execute(
            "SELECT MAX(m) FROM (SELECT MAX(id) AS m FROM jobs UNION ALL "
            "SELECT seq FROM sqlite_sequence WHERE name = 'jobs')").fetchone()[0] or 0)

    @property
    def durable(self) -> bool:
        """Whether every commit waits for the disk (synchronous FULL or EXTRA)."""
        return self._durable

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def _transaction(self, statements: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            connection = self._connection
            connection.execute("BEGIN IMMEDIATE")
            try:
                value = statements(connection)
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")
            return value

    # ------------------------------------------------------------ writes

    def allocate_id(self) -> int:
        """A new job's id: above every id journaled or allocated before."""
        with self._id_lock:
            self._last_id += 1
            return self._last_id

    def write(self, writes: Sequence[Write]) -> list[bool]:
        """Apply the records in one transaction, new jobs' bodies on disk first. For each
        record, whether it changed the journal (a Final of an ended job does not)."""
        new_jobs = [record for record in writes if isinstance(record, NewJob)]
        for job in new_jobs:
            self._write_body(job.job_id, job.body)
        if new_jobs and self._durable:
            _fsync_directory(self.bodies)
        try:
            changed = self._transaction(
                lambda connection: [self._apply(connection, record) for record in writes])
        except BaseException:
            for job in new_jobs:
                self._body_path(job.job_id).unlink(missing_ok=True)
            raise
        for record, did in zip(writes, changed, strict=True):
            if isinstance(record, Final) and did:
                self._body_path(record.job_id).unlink(missing_ok=True)
        return changed

    def _apply(self, connection: sqlite3.Connection, record: Write) -> bool:
        if isinstance(record, NewJob):
            connection.execute(
                "INSERT INTO jobs (id, graph, state, content_type, body, accepted_at, attempts) "
                "VALUES (?, ?, 'queued', ?, x'', ?, 1)",
                (record.job_id, record.graph, record.content_type, record.accepted_at))
            connection.execute("INSERT INTO events VALUES (?, 'accepted', ?, ?)",
                               (record.job_id, record.graph, record.accepted_at))
            return True
        if isinstance(record, Started):
            return bool(connection.execute(
                "UPDATE jobs SET state = 'running', started_at = ? "
                "WHERE id = ? AND state = 'queued'", (record.started_at, record.job_id)).rowcount)
        if record.state not in FINAL_STATES:
            raise ValueError(f"not a final state: {record.state!r}")
        now = self.clock()
        changed = connection.execute(
            f"UPDATE jobs SET state = ?, ended_at = ?, result = ?, outputs = ?, body = x'' "
            f"WHERE id = ? AND state NOT IN ({_FINAL_PLACEHOLDERS})",
            (record.state, now, record.result_json, record.outputs_npz, record.job_id,
             *FINAL_STATES)).rowcount
        if changed:
            connection.execute("INSERT INTO events VALUES (?, 'final', ?, ?)",
                               (record.job_id, record.state, now))
        return bool(changed)

    def _body_path(self, job_id: int) -> Path:
        return self.bodies / f"{job_id}{_BODY_SUFFIX}"

    def _write_body(self, job_id: int, body: bytes) -> None:
        """The body under a temporary name, then renamed: never half a body under its name."""
        target = self._body_path(job_id)
        temporary = self.bodies / f".{target.name}.tmp"
        handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(body)
                if self._durable:
                    file.flush()
                    os.fsync(file.fileno())
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

    def accept(self, graph: str, content_type: str, body: bytes) -> int:
        """Journal a new job (attempt 1) on its own; its id once committed."""
        job_id = self.allocate_id()
        self.write([NewJob(job_id, graph, content_type, body, self.clock())])
        return job_id

    def finish(self, job_id: int, state: str, result: dict[str, Any],
               outputs_npz: bytes | None) -> bool:
        """Move a job to its final state, once: False when it was already final."""
        return self.write([Final(job_id, state, json.dumps(result), outputs_npz)])[0]

    def begin_attempt(self, job_id: int) -> int:
        """A journaled job is run again after a restart; returns its attempt number."""
        now = self.clock()

        def update(connection: sqlite3.Connection) -> int:
            connection.execute("UPDATE jobs SET attempts = attempts + 1, state = 'queued', "
                               "started_at = NULL WHERE id = ?", (job_id,))
            (attempts,) = connection.execute("SELECT attempts FROM jobs WHERE id = ?",
                                             (job_id,)).fetchone()
            connection.execute("INSERT INTO events VALUES (?, 'attempt', ?, ?)",
                               (job_id, str(attempts), now))
            return int(attempts)

        return int(self._transaction(update))

    def request_cancel(self, job_id: int) -> bool:
        """Record a client's cancel (a restart then ends the job instead of running it);
        False when the job is unknown or already ended."""
        return bool(self._transaction(lambda c: c.execute(
            f"UPDATE jobs SET cancel_requested = 1 WHERE id = ? "
            f"AND state NOT IN ({_FINAL_PLACEHOLDERS})", (job_id, *FINAL_STATES)).rowcount))

    def prune(self, retention_s: float) -> int:
        """Drop jobs that ended more than retention_s ago, with their events."""
        cutoff = self.clock() - retention_s

        def delete(connection: sqlite3.Connection) -> int:
            connection.execute("DELETE FROM events WHERE job_id IN (SELECT id FROM jobs "
                               "WHERE ended_at IS NOT NULL AND ended_at < ?)", (cutoff,))
            return int(connection.execute(
                "DELETE FROM jobs WHERE ended_at IS NOT NULL AND ended_at < ?",
                (cutoff,)).rowcount)

        return int(self._transaction(delete))

    def drop_orphan_bodies(self, keep: set[int]) -> int:
        """Remove body files of jobs not in `keep` (ended, or never committed); how many."""
        dropped = 0
        for file in self.bodies.iterdir():
            stem = file.name[:-len(_BODY_SUFFIX)] if file.name.endswith(_BODY_SUFFIX) else ""
            if not (stem.isdigit() and int(stem) in keep):
                file.unlink(missing_ok=True)
                dropped += 1
        return dropped

    # ------------------------------------------------------------ reads

    _COLUMNS = ("id, graph, state, content_type, body, accepted_at, started_at, ended_at, "
                "attempts, cancel_requested, result")

    def _job(self, row: tuple[Any, ...], body: bytes = b"") -> JournaledJob:
        return JournaledJob(row[0], row[1], row[2], row[3], body, row[5], row[6],
                            row[7], row[8], bool(row[9]),
                            None if row[10] is None else json.loads(row[10]))

    def get(self, job_id: int) -> JournaledJob | None:
        """A job without its body."""
        with self._lock:
            row = self._connection.execute(f"SELECT {self._COLUMNS} FROM jobs WHERE id = ?",
                                           (job_id,)).fetchone()
        return None if row is None else self._job(row)

    def outputs(self, job_id: int) -> bytes | None:
        with self._lock:
            row = self._connection.execute("SELECT outputs FROM jobs WHERE id = ?",
                                           (job_id,)).fetchone()
        return None if row is None or row[0] is None else bytes(row[0])

    def unfinished(self) -> list[JournaledJob]:
        """Every job not in a final state, oldest first, with its body (from its file; a
        journal written before bodies moved to files has it in the row)."""
        with self._lock:
            rows = self._connection.execute(
                f"SELECT {self._COLUMNS} FROM jobs WHERE state NOT IN ({_FINAL_PLACEHOLDERS}) "
                "ORDER BY id", FINAL_STATES).fetchall()
        jobs = []
        for row in rows:
            path = self._body_path(row[0])
            body = path.read_bytes() if path.exists() else bytes(row[4])
            jobs.append(self._job(row, body))
        return jobs

    def final_events(self) -> dict[int, int]:
        """job id -> how many final events it has (exactly one per ended job)."""
        with self._lock:
            rows = self._connection.execute(
                "SELECT job_id, COUNT(*) FROM events WHERE event = 'final' GROUP BY job_id"
            ).fetchall()
        return {int(job_id): int(count) for job_id, count in rows}

    def writable(self) -> bool:
        """Whether the write lock can be taken now and bodies can be written (/readyz)."""
        try:
            with self._lock:
                self._connection.execute("BEGIN IMMEDIATE")
                self._connection.execute("ROLLBACK")
        except sqlite3.Error:
            return False
        return os.access(self.bodies, os.W_OK)


def _fsync_directory(directory: Path) -> None:
    """Make the renames in a directory durable (a power cut keeps the new names)."""
    handle = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
