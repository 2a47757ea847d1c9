"""Gantt charts of solver and heuristic schedules, with the memory held under them (PNG).

Owns the drawing only; the memory curve is masa.sched.checker's memory
profile, the same one every schedule is checked against. matplotlib is an
optional dependency (the `plot` extra), imported when a chart is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from masa.common.atomic import atomic_save_png
from masa.common.errors import UserError
from masa.sched.checker import memory_profile
from masa.sched.taskgraph import ScheduledTask
from solver.instance import Instance

_COLOURS = {"load": "tab:blue", "exec": "tab:orange", "unload": "tab:green"}


def write_gantt(instance: Instance, schedule: Sequence[ScheduledTask], path: str | Path,
                title: str = "") -> None:
    """Gantt chart of the schedule per worker, with the memory profile under it (PNG).

    UserError when matplotlib is not installed or the file cannot be written.
    """
    try:
        import matplotlib  # heavy and optional: only drawing needs it
    except ImportError:
        raise UserError("--gantt needs matplotlib (pip install 'masa[plot]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (gantt, memory) = plt.subplots(
        2, 1, figsize=(11, 2.2 + 0.45 * instance.workers), sharex=True,
        gridspec_kw={"height_ratios": [max(1, instance.workers), 2]})
    for item in schedule:
        task = instance.graph.by_id[item.task_id]
        gantt.barh(item.worker, item.end_us - item.start_us, left=item.start_us, height=0.8,
                   color=_COLOURS.get(task.kind.value, "grey"), edgecolor="black",
                   linewidth=0.4)
        if item.end_us - item.start_us > 0:
            gantt.text((item.start_us + item.end_us) / 2, item.worker,
                       task.group or task.task_id, ha="center", va="center", fontsize=6)
    gantt.set_yticks(range(instance.workers))
    gantt.set_yticklabels([f"worker {w}" for w in range(instance.workers)])
    gantt.invert_yaxis()
    gantt.set_title(title or instance.name)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in _COLOURS.values()]
    gantt.legend(handles, list(_COLOURS), loc="upper right", fontsize=7)
    steps = memory_profile(instance.graph, schedule)
    if steps:
        memory.step([t for t, _ in steps], [held for _, held in steps], where="post",
                    label="held")
    memory.axhline(instance.memory, color="red", linestyle="--", label="budget")
    memory.set_ylabel(f"memory ({instance.memory_unit})")
    memory.set_xlabel(f"time ({instance.time_unit})")
    memory.legend(loc="upper right", fontsize=7)
    figure.tight_layout()
    try:
        atomic_save_png(figure, path)
    except OSError as error:
        raise UserError(f"{path}: cannot write the Gantt chart: {error.strerror}") from None
    finally:
        plt.close(figure)
