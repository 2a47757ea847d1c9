"""The compact run records: IntRows and ScheduleLog read back what was appended."""

from __future__ import annotations

import sys

import pytest

from masa.common.columns import IntRows
from masa.sched.taskgraph import ScheduledTask, ScheduleLog


def test_int_rows_read_back_their_rows_with_none_and_negative_values() -> None:
    rows = [(0, 0, None), (5, -7, 3), (1 << 40, 2, -(1 << 62))]
    table = IntRows(3, rows)
    table.append((9, 9, None))
    assert len(table) == 4
    assert list(table) == [*rows, (9, 9, None)]
    assert table[-1] == (9, 9, None) and table[1] == (5, -7, 3)
    assert table[1:3] == rows[1:3]
    assert table == [*rows, (9, 9, None)] and table != rows
    table.clear()
    assert len(table) == 0 and list(table) == [] and not table


def test_int_rows_refuse_a_row_of_the_wrong_width() -> None:
    with pytest.raises(ValueError, match="a row of 3 values expected, got 2"):
        IntRows(3).append((1, 2))


def test_a_schedule_log_is_the_list_of_records_it_was_given() -> None:
    records = [ScheduledTask(f"j{i}/n/s{i}/load", i % 2, 10 * i, 10 * i + 7,
                             "cancelled" if i == 3 else "done") for i in range(6)]
    log = ScheduleLog(records[:4])
    for record in records[4:]:
        log.append(record)
    assert list(log) == records and log == records and log == tuple(records)
    assert log[3].status == "cancelled" and log[-1] == records[-1]
    assert log[1:3] == records[1:3]
    assert [entry.end_us for entry in log if entry.worker >= 0] == [r.end_us for r in records]


def test_a_schedule_log_holds_far_less_than_a_list_of_records() -> None:
    count = 20_000
    records = [ScheduledTask(f"j{i}/agenet/s003/exec", i % 2, 1_000_000 + i, 2_000_000 + i)
               for i in range(count)]
    log = ScheduleLog(records)
    # The task ids are the graph's own strings, shared: what each record adds is
    # its slots in the columns, against an object and two large ints each.
    log_bytes = sys.getsizeof(log)
    list_bytes = sys.getsizeof(records) + sum(
        sys.getsizeof(r) + sys.getsizeof(r.__dict__) + sys.getsizeof(r.start_us)
        + sys.getsizeof(r.end_us) for r in records)
    assert log_bytes / count < 50
    assert log_bytes * 4 < list_bytes
