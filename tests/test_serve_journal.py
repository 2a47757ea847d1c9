"""The daemon's journal on its own: bodies in files beside the SQLite file, records written
in one transaction, ids never reused, orphan bodies removed, old journals still read."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from masa.serve.journal import Final, Journal, NewJob, Started


def _journal(tmp_path: Path, now: list[float]) -> Journal:
    return Journal(tmp_path / "journal.sqlite", synchronous="normal", clock=lambda: now[0])


def test_bodies_live_in_files_until_the_job_ends(tmp_path: Path) -> None:
    now = [1000.0]
    journal = _journal(tmp_path, now)
    first, second = journal.allocate_id(), journal.allocate_id()
    changed = journal.write([NewJob(first, "g", "application/x-npy", b"one", 1.0),
                             NewJob(second, "g", "image/png", b"two", 2.0),
                             Started(first, 3.0)])
    assert changed == [True, True, True]
    assert sorted(p.name for p in journal.bodies.iterdir()) == [f"{first}.body",
                                                                 f"{second}.body"]
    row_bodies = sqlite3.connect(str(journal.path)).execute("SELECT body FROM jobs").fetchall()
    assert row_bodies == [(b"",), (b"",)]  # nothing of the bodies goes through SQLite
    unfinished = journal.unfinished()
    assert [(j.job_id, j.state, j.body) for j in unfinished] == [
        (first, "running", b"one"), (second, "queued", b"two")]
    assert journal.get(first).body == b""  # reads other than the resume skip the body

    result = json.dumps({"id": first, "state": "done"})
    assert journal.write([Final(first, "done", result, b"npz")]) == [True]
    assert journal.write([Final(first, "failed", result, None)]) == [False]  # once only
    assert not (journal.bodies / f"{first}.body").exists()
    assert journal.get(first).result == {"id": first, "state": "done"}
    assert journal.outputs(first) == b"npz"
    assert journal.final_events() == {first: 1}
    journal.close()


def test_a_failed_transaction_leaves_no_body_and_ids_are_never_reused(tmp_path: Path) -> None:
    now = [1000.0]
    journal = _journal(tmp_path, now)
    job_id = journal.accept("g", "application/x-npy", b"body")
    new_id = journal.allocate_id()
    with pytest.raises(ValueError, match="not a final state"):  # the batch rolls back
        journal.write([NewJob(new_id, "g", "x", b"new", 1.0),
                       Final(job_id, "bogus", "{}", None)])
    assert [p.name for p in journal.bodies.iterdir()] == [f"{job_id}.body"]
    assert [(j.job_id, j.state) for j in journal.unfinished()] == [(job_id, "queued")]
    journal.finish(job_id, "done", {"state": "done"}, None)
    now[0] += 10
    assert journal.prune(retention_s=5) == 1
    journal.close()

    reopened = _journal(tmp_path, now)
    # Above every id committed, the pruned one too; an id never committed was never
    # given to a client (its accept failed), so it may come again.
    assert reopened.allocate_id() == job_id + 1
    reopened.close()


def test_orphan_bodies_go_and_an_old_journal_body_in_its_row_is_read(tmp_path: Path) -> None:
    journal = _journal(tmp_path, [1000.0])
    kept = journal.accept("g", "x", b"kept")
    (journal.bodies / "99.body").write_bytes(b"a crash between rename and commit")
    (journal.bodies / f".{kept + 1}.body.tmp").write_bytes(b"a crash mid-write")
    assert journal.drop_orphan_bodies({j.job_id for j in journal.unfinished()}) == 2
    assert [p.name for p in journal.bodies.iterdir()] == [f"{kept}.body"]
    # A journal written before bodies moved to files kept the body in the row.
    connection = sqlite3.connect(str(journal.path))
    with connection:
        connection.execute("INSERT INTO jobs (id, graph, state, content_type, body, "
                           "accepted_at, attempts) VALUES (50, 'g', 'queued', 'x', "
                           "x'6f6c64', 1.0, 1)")
    connection.close()
    assert {j.job_id: j.body for j in journal.unfinished()} == {kept: b"kept", 50: b"old"}
    journal.close()
