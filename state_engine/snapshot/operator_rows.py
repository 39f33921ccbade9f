"""The canonical row of operator state (the keyed row is ``state.meta.StateEntry``).

A leaf: the operator-state backend builds these rows without loading the snapshot formats.
"""

from __future__ import annotations

from typing import NamedTuple


class OperatorStateRow(NamedTuple):
    """One element of one operator state of one subtask: the canonical snapshot row."""

    state: str
    mode: str
    subtask: int
    index: int  # type: ignore[assignment]  # the column's name; shadows tuple.index (unused)
    value: bytes
