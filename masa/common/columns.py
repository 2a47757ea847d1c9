"""Compact append-only records for long runs: rows of integers held in columns.

A run that keeps one tuple or dataclass per ended task or memory sample for its
report holds a few hundred bytes for each (the object, its boxed ints, the pools
around them): `masa run` grew by about 480 bytes per ended task for its records
(`benchmarks/bench_device.py --measure-run-records`, docs/scheduling.md), memory
its measured budget paid for. `IntRows` keeps each column in an `array('q')`, 8
bytes a value, and builds a row's tuple only when it is read.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

# Stands for None in a column (no measured value); never a real figure (bytes, us).
_NONE = -(1 << 63)


class IntRows(Sequence[tuple[int | None, ...]]):
    """Rows of `width` integers (or None) in `width` int64 columns; a sequence of tuples."""

    __slots__ = ("_columns",)

    def __init__(self, width: int, rows: Iterable[Sequence[int | None]] = ()) -> None:
        self._columns = tuple(array("q") for _ in range(width))
        for row in rows:
            self.append(row)

    def append(self, row: Sequence[int | None]) -> None:
        if len(row) != len(self._columns):
            raise ValueError(f"a row of {len(self._columns)} values expected, got {len(row)}")
        for column, value in zip(self._columns, row, strict=True):
            column.append(_NONE if value is None else value)

    def clear(self) -> None:
        for column in self._columns:
            del column[:]

    def __len__(self) -> int:
        return len(self._columns[0]) if self._columns else 0

    @overload
    def __getitem__(self, index: int) -> tuple[int | None, ...]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[int | None, ...]]: ...

    def __getitem__(self, index: int | slice) -> tuple[int | None, ...] | list[
            tuple[int | None, ...]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return tuple(None if column[index] == _NONE else column[index]
                     for column in self._columns)

    def __iter__(self) -> Iterator[tuple[int | None, ...]]:
        for values in zip(*self._columns, strict=True):
            yield tuple(None if value == _NONE else value for value in values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IntRows | list | tuple):
            return len(self) == len(other) and all(
                a == tuple(b) for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __sizeof__(self) -> int:
        return object.__sizeof__(self) + sum(sys.getsizeof(column) for column in self._columns)

    def __repr__(self) -> str:
        return f"IntRows({len(self._columns)} columns, {len(self)} rows)"
