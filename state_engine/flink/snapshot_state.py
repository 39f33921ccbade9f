"""The keyed state of a whole Flink snapshot, read handle by handle.

Each keyed state handle goes to the reader of its format: canonical and heap key-group streams
(:mod:`state_engine.flink.keyed_state`), RocksDB incremental handles
(:mod:`state_engine.flink.rocksdb_state`); PyFlink jobs' entries are decoded as PyFlink does
(:mod:`state_engine.flink.pyflink`); canonical files are decoded a whole state at a time into
Arrow columns where that is faster (:mod:`state_engine.flink.columnar`). The readers depend on
the stream primitives of ``keyed_state``; this module depends on all of them (imports go one way).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from state_engine.errors import FlinkStateError
from state_engine.flink.keyed_state import (
    Entry,
    canonical_entries,
    canonical_records,
    entry_rows,
    heap_entries,
    operator_label,
    read_proxy_header,
)

if TYPE_CHECKING:
    from state_engine.flink.metadata import FlinkSnapshotMetadata, KeyedStateHandle, OperatorState


def snapshot_entries(
    meta: FlinkSnapshotMetadata, operator: str | None = None, *, by_state: bool = False
) -> Iterator[tuple[OperatorState, int, Entry]]:
    """``(operator, subtask, entry)`` for every keyed entry of the snapshot (timers left out).

    Operators in the ``_metadata``'s order, subtasks by index, each handle's entries in stream
    order; ``by_state``: a canonical file's entries state by state (a key group's in stream order),
    decoded a whole state at a time (:mod:`state_engine.flink.columnar`, much faster).
    """
    from state_engine.flink import metadata as md

    for op in _operators(meta, operator):
        for st in op.subtasks:
            for kh in st.keyed_handles:
                where = f"{meta.metadata_path} operator {operator_label(op)} subtask {st.index}"
                entries = _handle_entries(md, kh, op, where, by_state)
                yield from ((op, st.index, e) for e in entries)


def _operators(meta: FlinkSnapshotMetadata, operator: str | None) -> list[OperatorState]:
    if operator is None:
        return list(meta.operators)
    try:
        return [meta.operator(operator)]
    except KeyError as exc:
        from state_engine.errors import InvalidJobParams

        raise InvalidJobParams(str(exc.args[0])) from None


def _handle_entries(
    md: Any, kh: KeyedStateHandle, op: OperatorState, where: str, by_state: bool = False
) -> Iterator[Entry]:
    if kh.type in (md.KEY_GROUPS, md.SAVEPOINT_KEY_GROUPS):
        if kh.delegate is None:
            return
        data = kh.delegate.read_bytes()
        where = f"{where} file {kh.delegate.location or kh.delegate.name}"
        if kh.type == md.SAVEPOINT_KEY_GROUPS and by_state:
            from state_engine.flink.columnar import canonical_columns

            for columns in canonical_columns(data, list(kh.offsets), op.max_parallelism, where):
                yield from columns.entries()
        elif kh.type == md.SAVEPOINT_KEY_GROUPS:
            yield from canonical_entries(data, list(kh.offsets), op.max_parallelism, where)
        else:
            yield from heap_entries(data, list(kh.offsets), kh.key_groups.start, where)
    elif kh.type == md.INCREMENTAL:
        from state_engine.flink.rocksdb_state import rocksdb_entries

        yield from rocksdb_entries(kh, op.max_parallelism, where)
    else:
        raise FlinkStateError(
            f"{where}: keyed state handle type {kh.type!r} (changelog state backend) is not "
            "decoded; take a canonical savepoint of the job and read that"
        )


def snapshot_raw_rows(
    meta: FlinkSnapshotMetadata, operator: str | None = None
) -> Iterator[dict[str, Any]]:
    """Undecoded rows: the RocksDB-shaped key and value as base64 (canonical and RocksDB only).

    ``state`` is the state name where the header can be read, else ``#<state id>``.
    """
    from state_engine.flink import metadata as md

    b64 = base64.b64encode
    for op in _operators(meta, operator):
        prefix = 1 if op.max_parallelism <= 128 else 2
        for st in op.subtasks:
            for kh in st.keyed_handles:
                where = f"{meta.metadata_path} operator {operator_label(op)} subtask {st.index}"
                if kh.type == md.SAVEPOINT_KEY_GROUPS and kh.delegate is not None:
                    data = kh.delegate.read_bytes()
                    names, compressed = _names_if_readable(data, where)
                    records: Iterator[tuple[str, bytes, bytes]] = (
                        (names.get(sid, f"#{sid}"), k, v)
                        for sid, k, v in canonical_records(
                            data, list(kh.offsets), where, compressed
                        )
                    )
                elif kh.type == md.INCREMENTAL:
                    from state_engine.flink.rocksdb_state import raw_records

                    records = raw_records(kh, op.max_parallelism, where)
                elif kh.type == md.KEY_GROUPS and kh.delegate is not None:
                    # a heap snapshot has no record boundaries without its serializers: one row
                    # per key group holding the key group's bytes
                    yield from _raw_key_groups(kh, operator_label(op))
                    continue
                else:
                    raise FlinkStateError(
                        f"{where}: --raw reads canonical, heap and RocksDB snapshots, not a "
                        f"{kh.type} handle"
                    )
                for name, k, v in records:
                    kg = k[0] if prefix == 1 else (k[0] << 8) | k[1]
                    yield {
                        "operator": operator_label(op),
                        "key_group": kg,
                        "state": name,
                        "key": b64(k).decode("ascii"),
                        "namespace": None,
                        "user_key": None,
                        "value": b64(v).decode("ascii"),
                        "expires_at": None,
                    }


def _raw_key_groups(kh: KeyedStateHandle, operator: str) -> Iterator[dict[str, Any]]:
    assert kh.delegate is not None
    data = kh.delegate.read_bytes()
    offsets = list(kh.offsets)
    for i, off in enumerate(offsets):
        end = offsets[i + 1] if i + 1 < len(offsets) else len(data)
        yield {
            "operator": operator,
            "key_group": kh.key_groups.start + i,
            "state": "(key group)",
            "key": None,
            "namespace": None,
            "user_key": None,
            "value": base64.b64encode(data[off:end]).decode("ascii"),
            "expires_at": None,
        }


def _names_if_readable(data: bytes, where: str) -> tuple[dict[int, str], bool]:
    """State names by id and the compression flag; ({}, flag byte) when the header is unreadable."""
    try:
        header = read_proxy_header(data, where)
    except FlinkStateError:
        # the flag is byte 4, right after the version, whatever follows
        return {}, len(data) > 4 and data[4] == 1
    return {s.state_id: s.name for s in header.states}, header.compression


def snapshot_rows(
    meta: FlinkSnapshotMetadata,
    *,
    operator: str | None = None,
    state: str | None = None,
    key: str | None = None,
    limit: int | None = None,
    raw: bool = False,
    pyflink_types: Any = None,
) -> list[dict[str, Any]]:
    """``statectl state show`` rows of a Flink snapshot, sorted by operator, key group, key, state.

    ``limit`` None or 0 means every row. PyFlink jobs' states are decoded as PyFlink does
    (:mod:`state_engine.flink.pyflink`). With a ``limit``, canonical and heap snapshots are
    decoded only up to the last key group the first ``limit`` rows need.
    """
    if raw:
        rows = list(snapshot_raw_rows(meta, operator))
    elif limit:
        rows, names = _first_rows(meta, operator, state, key, limit, pyflink_types)
        return _filtered(meta, rows, names, state, key)[:limit]
    else:
        from state_engine.flink.pyflink import is_pyflink_entry, pyflink_entry

        rows = []
        for op, _subtask, e in snapshot_entries(meta, operator, by_state=True):
            if is_pyflink_entry(e):
                e = pyflink_entry(e, pyflink_types)
            rows.extend(entry_rows(operator_label(op), e))
    rows = _filtered(meta, rows, {r["state"] for r in rows}, state, key)
    return rows[:limit] if limit else rows


def _filtered(
    meta: FlinkSnapshotMetadata,
    rows: list[dict[str, Any]],
    names: set[str],
    state: str | None,
    key: str | None,
) -> list[dict[str, Any]]:
    """Rows of ``state`` and ``key`` (None: any), sorted; ``names``: the states with rows."""
    if state is not None:
        rows = [r for r in rows if r["state"] == state]
        if not rows:
            from state_engine.errors import InvalidJobParams

            raise InvalidJobParams(
                f"{meta.metadata_path} has no rows of state {state!r}; states with rows: "
                f"{', '.join(sorted(names)) or 'none'}"
            )
    if key is not None:
        rows = [r for r in rows if r["key"] == key]
    rows.sort(key=lambda r: (r["operator"], r["key_group"], r["key"] or "", r["state"]))
    return rows


def _first_rows(
    meta: FlinkSnapshotMetadata,
    operator: str | None,
    state: str | None,
    key: str | None,
    limit: int,
    pyflink_types: Any,
) -> tuple[list[dict[str, Any]], set[str]]:
    """Enough rows for the first ``limit`` in sort order (operator, key group, ...), and the
    states seen. Operators go in label order; a canonical or heap handle yields its entries key
    group by key group (subtasks in key-group order), so once ``limit`` matching rows are in,
    every row still needed is in a key group not past the current one. RocksDB handles (state by
    state, not key group by key group) are read whole."""
    from state_engine.flink import metadata as md
    from state_engine.flink.pyflink import is_pyflink_entry, pyflink_entry

    rows: list[dict[str, Any]] = []
    names: set[str] = set()
    matching = 0
    for op in sorted(_operators(meta, operator), key=operator_label):
        label = operator_label(op)
        handles = sorted(
            ((kh.key_groups.start, st.index, kh) for st in op.subtasks for kh in st.keyed_handles),
            key=lambda t: (t[0], t[1]),
        )
        by_key_group = all(
            kh.type in (md.KEY_GROUPS, md.SAVEPOINT_KEY_GROUPS) for *_, kh in handles
        )
        last_needed: int | None = None
        for start, index, kh in handles:
            if last_needed is not None and start > last_needed:
                break
            where = f"{meta.metadata_path} operator {label} subtask {index}"
            if kh.type == md.SAVEPOINT_KEY_GROUPS and kh.delegate is not None and key is None:
                # decoded into Arrow tables; Python rows made only up to the last key group
                # the first ``limit`` matching rows need
                found, last_needed = _columnar_rows(
                    kh,
                    op,
                    label,
                    where,
                    state,
                    limit - matching if by_key_group else 0,
                    last_needed,
                    pyflink_types,
                )
                for r in found:
                    rows.append(r)
                    names.add(r["state"])
                    matching += state is None or r["state"] == state
                continue
            for e in _handle_entries(md, kh, op, where):
                if last_needed is not None and e.key_group > last_needed:
                    break
                if is_pyflink_entry(e):
                    e = pyflink_entry(e, pyflink_types)
                for r in entry_rows(label, e):
                    rows.append(r)
                    names.add(r["state"])
                    if (state is None or r["state"] == state) and (key is None or r["key"] == key):
                        matching += 1
                if by_key_group and last_needed is None and matching >= limit:
                    last_needed = e.key_group
        if matching >= limit:
            break  # later operators' rows sort after these
    return rows, names


def _columnar_rows(
    kh: KeyedStateHandle,
    op: OperatorState,
    label: str,
    where: str,
    state: str | None,
    needed: int,
    last_needed: int | None,
    pyflink_types: Any,
) -> tuple[list[dict[str, Any]], int | None]:
    """Rows of one canonical handle's key groups up to the one its first ``needed`` rows of
    ``state`` (None: any) reach (or up to ``last_needed`` if already known), and that key
    group. The handle is decoded into Arrow tables; rows are made for those key groups only."""
    import numpy as np

    from state_engine.flink.columnar import canonical_columns
    from state_engine.flink.pyflink import STATE_PREFIX, is_pyflink_entry, pyflink_entry

    assert kh.delegate is not None
    data = kh.delegate.read_bytes()
    where = f"{where} file {kh.delegate.location or kh.delegate.name}"
    columns = list(canonical_columns(data, list(kh.offsets), op.max_parallelism, where))

    def shown(name: str) -> str:
        return name[len(STATE_PREFIX) :] if name.startswith(STATE_PREFIX) else name

    if last_needed is None:
        groups = [c.key_groups() for c in columns if state is None or shown(c.state.name) == state]
        matching = np.sort(np.concatenate(groups)) if groups else np.zeros(0, dtype=np.int64)
        if needed > 0 and len(matching) >= needed:
            last_needed = int(matching[needed - 1])
    rows: list[dict[str, Any]] = []
    for c in columns:
        for e in c.entries_up_to(last_needed):
            if is_pyflink_entry(e):
                e = pyflink_entry(e, pyflink_types)
            rows.extend(entry_rows(label, e))
    return rows, last_needed
