"""The job journal: every accepted job in SQLite (standard library, WAL), through crashes.

Owns the `jobs` and `events` tables of the daemon's journal file:

- `accept` writes a job (its graph and the request body as received) in one
  transaction before the daemon answers 202; `synchronous=FULL` (the
  default) makes that survive a power cut, `NORMAL` only a crash of the
  process (WAL: a kill -9 loses nothing either way);
- `unfinished` lists, at start, every accepted job not yet in a final state,
  oldest first, to be run again (`begin_attempt` counts the attempts);
- `finish` moves a job to its final state once, guarded by the state it is
  in, and appends the one `final` event of that job; calling it again does
  nothing. Results (per-network status, timings, small outputs as JSON, all
  outputs as one .npz) are kept until `prune` drops jobs ended more than the
  retention time ago. The input body is dropped when a job ends.

One connection, shared by the HTTP thread and the journal writer, behind a
lock. Times are Unix seconds.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FINAL_STATES = ("done", "failed", "cancelled")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused, also after pruning
    graph TEXT NOT NULL,
    state TEXT NOT NULL,                   -- queued, running, done, failed, cancelled
    content_type TEXT NOT NULL,
    body BLOB NOT NULL,                    -- the request body; emptied when the job ends
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
    body: bytes
    accepted_at: float
    started_at: float | None
    ended_at: float | None
    attempts: int
    cancel_requested: bool
    result: dict[str, Any] | None


class Journal:
    """The journal file; every method is safe to call from any thread."""

    def __init__(self, path: Path, *, synchronous: str = "full",
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._connection = sqlite3.connect(str(path), check_same_thread=False,
                                           isolation_level=None)  # explicit transactions
        self._connection.execute("PRAGMA journal_mode=WAL")
        self._connection.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._connection.execute("PRAGMA busy_timeout=5000")
        self._connection.executescript(_SCHEMA)

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

    def accept(self, graph: str, content_type: str, body: bytes) -> int:
        """Journal a new job (attempt 1); its id once the transaction is committed."""
        now = self.clock()

        def insert(connection: sqlite3.Connection) -> int:
            cursor = connection.execute(
                "INSERT INTO jobs (graph, state, content_type, body, accepted_at, attempts) "
                "VALUES (?, 'queued', ?, ?, ?, 1)", (graph, content_type, body, now))
            job_id = int(cursor.lastrowid or 0)
            connection.execute("INSERT INTO events VALUES (?, 'accepted', ?, ?)",
                               (job_id, graph, now))
            return job_id

        return int(self._transaction(insert))

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

    def mark_running(self, job_id: int, started_at: float) -> None:
        self._transaction(lambda c: c.execute(
            "UPDATE jobs SET state = 'running', started_at = ? WHERE id = ? AND state = 'queued'",
            (started_at, job_id)))

    def request_cancel(self, job_id: int) -> bool:
        """Record a client's cancel (a restart then ends the job instead of running it);
        False when the job is unknown or already ended."""
        placeholders = ", ".join("?" * len(FINAL_STATES))
        return bool(self._transaction(lambda c: c.execute(
            f"UPDATE jobs SET cancel_requested = 1 WHERE id = ? AND state NOT IN ({placeholders})",
            (job_id, *FINAL_STATES)).rowcount))

    def finish(self, job_id: int, state: str, result: dict[str, Any],
               outputs_npz: bytes | None) -> bool:
        """Move a job to its final state, once: False when it was already final."""
        if state not in FINAL_STATES:
            raise ValueError(f"not a final state: {state!r}")
        now = self.clock()
        placeholders = ", ".join("?" * len(FINAL_STATES))

        def update(connection: sqlite3.Connection) -> bool:
            changed = connection.execute(
                f"UPDATE jobs SET state = ?, ended_at = ?, result = ?, outputs = ?, body = x'' "
                f"WHERE id = ? AND state NOT IN ({placeholders})",
                (state, now, json.dumps(result), outputs_npz, job_id, *FINAL_STATES)).rowcount
            if changed:
                connection.execute("INSERT INTO events VALUES (?, 'final', ?, ?)",
                                   (job_id, state, now))
            return bool(changed)

        return bool(self._transaction(update))

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

    # ------------------------------------------------------------ reads

    _COLUMNS = ("id, graph, state, content_type, body, accepted_at, started_at, ended_at, "
                "attempts, cancel_requested, result")

    def _job(self, row: tuple[Any, ...]) -> JournaledJob:
        return JournaledJob(row[0], row[1], row[2], row[3], bytes(row[4]), row[5], row[6],
                            row[7], row[8], bool(row[9]),
                            None if row[10] is None else json.loads(row[10]))

    def get(self, job_id: int) -> JournaledJob | None:
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
        placeholders = ", ".join("?" * len(FINAL_STATES))
        with self._lock:
            rows = self._connection.execute(
                f"SELECT {self._COLUMNS} FROM jobs WHERE state NOT IN ({placeholders}) "
                "ORDER BY id", FINAL_STATES).fetchall()
        return [self._job(row) for row in rows]

    def final_events(self) -> dict[int, int]:
        """job id -> how many final events it has (exactly one per ended job)."""
        with self._lock:
            rows = self._connection.execute(
                "SELECT job_id, COUNT(*) FROM events WHERE event = 'final' GROUP BY job_id"
            ).fetchall()
        return {int(job_id): int(count) for job_id, count in rows}

    def writable(self) -> bool:
        """Whether the write lock can be taken now (for /readyz)."""
        try:
            with self._lock:
                self._connection.execute("BEGIN IMMEDIATE")
                self._connection.execute("ROLLBACK")
        except sqlite3.Error:
            return False
        return True
