"""Structural checks of a Flink ``_metadata`` that reads: offsets and ranges that cannot be right.

A ``_metadata`` with a few flipped bytes often still parses; what it says is then impossible: an
offset past the end of its stream, offsets going backwards, a key-group range outside the max
parallelism. :func:`structural_problems` finds those, one line per handle (the rules:
docs/flink-format.md, "Structural checks").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from state_engine.flink.metadata import (
    INLINE,
    KEY_GROUPS,
    SAVEPOINT_KEY_GROUPS,
    FlinkSnapshotMetadata,
    KeyedStateHandle,
    OperatorState,
    OperatorStateHandle,
    StreamHandle,
)

#: problems reported per snapshot before the rest are counted only
MAX_PROBLEMS = 20


def _stream_size(h: StreamHandle) -> int:
    return len(h.data or b"") if h.type == INLINE else h.size


def _handle_name(h: StreamHandle) -> str:
    if h.type == INLINE:  # its name is the file it would have been, in its _metadata
        return f"{h.name} (inline, {_stream_size(h)} B)"
    return h.name


def _operator_label(op: OperatorState) -> str:
    label = op.uid or op.operator_id
    if op.name and op.name != label:
        label += f" ({op.name})"
    return label


def _offsets_problem(offsets: Sequence[int], size: int, *, zero_is_empty: bool) -> str | None:
    """What is wrong with ``offsets`` into a stream of ``size`` bytes (None: nothing)."""
    last = -1
    for i, off in enumerate(offsets):
        if zero_is_empty and off == 0:
            continue
        if off < 0 or off > size:
            return f"offset {off} (entry {i}) lies outside its stream of {size} bytes"
        if off <= last:
            return f"offset {off} (entry {i}) does not increase on the one before ({last})"
        last = off
    return None


def _keyed(h: KeyedStateHandle, max_parallelism: int) -> Iterator[str]:
    kg = h.key_groups
    if kg.start <= kg.end and kg.end >= max_parallelism:
        yield (
            f"{h.type} handle of key groups {kg.start}-{kg.end}: the range lies outside the "
            f"max parallelism {max_parallelism}"
        )
    if h.type in (KEY_GROUPS, SAVEPOINT_KEY_GROUPS) and h.delegate is not None:
        groups = max(kg.end - kg.start + 1, 0)
        name = _handle_name(h.delegate)
        if len(h.offsets) != groups:
            yield (
                f"{h.type} handle {name}: {len(h.offsets)} offsets for the {groups} key groups "
                f"{kg.start}-{kg.end}"
            )
        problem = _offsets_problem(h.offsets, _stream_size(h.delegate), zero_is_empty=True)
        if problem is not None:
            yield f"{h.type} handle {name} of key groups {kg.start}-{kg.end}: {problem}"
    for nested in h.nested:
        yield from _keyed(nested, max_parallelism)


def _operator_state(what: str, h: OperatorStateHandle) -> Iterator[str]:
    if h.delegate is None:
        return
    size = _stream_size(h.delegate)
    for entry in h.states:
        problem = _offsets_problem(entry.offsets, size, zero_is_empty=False)
        if problem is not None:
            yield (
                f"{what} {entry.name!r} ({entry.mode}) in handle {_handle_name(h.delegate)}: "
                f"{problem}"
            )


def _segments(handles: Sequence[StreamHandle]) -> Iterator[str]:
    for h in handles:
        if h.start_pos < 0 or h.size < 0:
            yield f"segment of {h.name}: start {h.start_pos}, length {h.size}"


def structural_problems(meta: FlinkSnapshotMetadata) -> list[str]:
    """Every impossible offset or range of ``meta``, one line each naming its operator, subtask
    and handle; at most :data:`MAX_PROBLEMS` lines, then one that counts the rest."""
    out: list[str] = []
    for op in meta.operators:
        max_p = op.max_parallelism if op.max_parallelism > 0 else meta.max_parallelism
        for st in op.subtasks:
            where = f"operator {_operator_label(op)} subtask {st.index}"
            found: list[str] = []
            for kh in st.keyed_handles:
                found.extend(_keyed(kh, max_p))
            if st.managed_operator_state is not None:
                found.extend(_operator_state("operator state", st.managed_operator_state))
            if st.raw_operator_state is not None:
                found.extend(_operator_state("raw operator state", st.raw_operator_state))
            out.extend(f"{where}: {p}" for p in found)
    for run in meta.handle_runs():
        if run.files is None:  # RocksDB files come as columns: plain files, no ranges
            out.extend(_segments([h for h in run.handles if h.type == "segment"]))
    if len(out) > MAX_PROBLEMS:
        rest = len(out) - MAX_PROBLEMS
        out = [*out[:MAX_PROBLEMS], f"... and {rest} more such problem(s)"]
    return out
