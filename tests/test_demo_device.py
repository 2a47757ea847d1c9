"""`masa demo` on an emulated device (issue 12, part 6).

The demo runs each policy on a demo-sized emulated board when root and cgroups
allow it; elsewhere it says why in one line and runs in its own process. The
emulated test needs root and writable cgroups and skips elsewhere with the
reason; it asserts on the report's fields (status, budget, jobs), not on time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_device import _why_no_emulation

from masa.cli.demo import DEVICE_HEADROOM_MIN_BYTES, demo_board, demo_cap_bytes
from masa.cli.main import main
from masa.runtime.emulation import GROUP_PREFIX, cgroup_layout

MIB = 2**20


def test_the_demo_board_is_a_pi_4s_storage_with_a_cap_from_the_demos_needs() -> None:
    cap = demo_cap_bytes(30 * MIB, 16 * MIB)
    assert cap == 30 * MIB + 16 * MIB + max(8 * MIB, DEVICE_HEADROOM_MIN_BYTES)
    board = demo_board(cap)
    assert board.memory_cap_bytes == cap and board.read_bytes_per_s == 44_000_000
    assert board.cold_cache and board.swap_bytes == 0


def test_without_root_the_demo_says_why_in_one_line_and_runs_as_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    report = tmp_path / "r.json"
    assert main(["-q", "demo", "--store", str(tmp_path / "s"), "--scale", "0.05",
                 "--jobs", "2", "--interval-ms", "5", "--report", str(report)]) == 0
    out = capsys.readouterr().out.splitlines()
    why = [line for line in out if line.startswith("Not emulating a small device")]
    assert len(why) == 1 and "needs root" in why[0]
    document = json.loads(report.read_text())
    assert document["device"] is None
    assert all("emulation" not in r for r in document["reports"].values())
    assert main(["-q", "demo", "--store", str(tmp_path / "s"), "--device", "demo"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs root" in err[0]


@pytest.mark.skipif(_why_no_emulation() is not None, reason=str(_why_no_emulation()))
@pytest.mark.slow
def test_on_the_demo_board_a_baseline_is_killed_and_masa_finishes_within_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.json"
    assert main(["-q", "demo", "--store", str(tmp_path / "s"), "--jobs", "4",
                 "--report", str(report)]) == 0
    document = json.loads(report.read_text())
    budget = document["memory_budget_bytes"]
    device = document["device"]
    assert device["name"] == "demo" and device["cold_cache"]
    reports = document["reports"]
    masa = reports["masa"]
    assert masa["status"] == "finished" and masa["emulation"]["oom_kills"] == 0
    assert masa["summary"]["jobs_failed"] == 0
    assert masa["summary"]["progress_rule_violations"] == 0
    assert masa["summary"]["peak_reserved_bytes"] <= budget
    assert masa["emulation"]["peak_cgroup_bytes"] <= device["memory_cap_bytes"]
    baselines = [reports[p] for p in ("bulk", "deepeye")]
    assert any(r["status"] == "killed" and r["emulation"]["oom_kills"] >= 1
               or (r["summary"]["peak_reserved_bytes"] or 0) > budget for r in baselines)
    killed = [r for r in baselines if r["status"] == "killed"]
    for r in killed:  # a kill says when and what finished before it
        assert r["summary"]["ended_at_s"] is not None
        assert r["summary"]["jobs_finished_before_end"] < r["summary"]["jobs"]
    out = capsys.readouterr().out
    assert "Not emulated: the CPU's speed" in out
    layout = cgroup_layout()
    assert layout is not None
    assert not [g for parent in set(layout.parents.values())
                for g in parent.glob(f"{GROUP_PREFIX}{os.getpid()}-*")]
