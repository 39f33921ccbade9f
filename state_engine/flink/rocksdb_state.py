"""Keyed state of RocksDB incremental checkpoints and native savepoints (SST snapshots).

A subtask's ``IncrementalRemoteKeyedStateHandle`` lists every file of its RocksDB instance by local
name (SSTs, ``MANIFEST-*``, ``CURRENT``, ``OPTIONS-*``), some inline in ``_metadata``. We rebuild
that directory in a temporary place and open it read-only with rocksdict **using the options of the
snapshot's own OPTIONS file**: Flink sets ``StringAppendTESTOperator`` as merge operator and
``ListState.add`` writes merge operands, which RocksDB only folds back into lists when the operator
is configured (with default options list state silently comes back nearly empty). Each registered
state is a column family named like the state; records are RocksDB-shaped (see
:class:`~state_engine.flink.keyed_state.StateDecoder`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from state_engine.errors import FlinkStateError
from state_engine.flink.keyed_state import (
    Entry,
    ProxyHeader,
    StateDecoder,
    read_proxy_header,
)

if TYPE_CHECKING:
    from state_engine.flink.metadata import KeyedStateHandle


def _materialize(handle: KeyedStateHandle, directory: str, where: str) -> None:
    for lf in (*handle.shared, *handle.private):
        name = lf.local_path
        if not name or "/" in name or name in (".", ".."):
            raise FlinkStateError(
                f"{where}: RocksDB file name {name!r} is not a plain file name; the handle is not "
                "one Flink writes"
            )
        h = lf.handle
        if not h.inline and h.exists is False:
            raise FlinkStateError(
                f"{where}: RocksDB file {name} ({h.location or h.name}) is missing; restore the "
                "snapshot's files (statectl verify lists what is gone)"
            )
        data = h.read_bytes()
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def raw_records(
    handle: KeyedStateHandle, max_parallelism: int, where: str
) -> Iterator[tuple[str, bytes, bytes]]:
    """``(column family, key, value)`` of every record in the key-group range of ``handle``."""
    from rocksdict import AccessType, Options, Rdict

    if handle.meta is None:
        raise FlinkStateError(f"{where}: incremental handle without its meta-data handle")
    with tempfile.TemporaryDirectory(prefix="flink-rocksdb-") as tmp:
        _materialize(handle, tmp, where)
        if not any(n.startswith("OPTIONS-") for n in os.listdir(tmp)):
            raise FlinkStateError(
                f"{where}: no OPTIONS file among the RocksDB files: the merge operator Flink "
                "uses for list state cannot be configured, so the state is not readable"
            )
        try:
            _, column_families = Options.load_latest(tmp, ignore_unknown_options=True)
            db = Rdict(
                tmp,
                Options(raw_mode=True),
                column_families=column_families,
                access_type=AccessType.read_only(),
            )
        except Exception as exc:  # rocksdict raises plain Exceptions
            raise FlinkStateError(
                f"{where}: RocksDB cannot open the rebuilt instance: {exc}"
            ) from None
        try:
            start, end = handle.key_groups.start, handle.key_groups.end
            two = max_parallelism > 128
            for name in column_families:
                if name == "default":
                    continue
                cf = db.get_column_family(name)
                it = cf.iter()
                it.seek_to_first()
                while it.valid():
                    key = it.key()
                    # after a rescale an SST can hold key groups of other subtasks
                    kg = ((key[0] << 8) | key[1]) if two else key[0]
                    if start <= kg <= end:
                        yield name, key, it.value()
                    it.next()
                try:
                    # an iterator stops at the first error (a corrupt block, a missing merge
                    # operator) as if the data ended: only status() tells the two apart
                    it.status()
                except Exception as exc:
                    raise FlinkStateError(
                        f"{where}: RocksDB stopped reading column family {name!r}: {exc}"
                    ) from None
                del cf, it
        finally:
            db.close()


def rocksdb_entries(handle: KeyedStateHandle, max_parallelism: int, where: str) -> Iterator[Entry]:
    """Decoded entries of one subtask's RocksDB snapshot."""
    assert handle.meta is not None
    header = read_proxy_header(handle.meta.read_bytes(), f"{where} meta data")
    yield from _decode(header, handle, max_parallelism, where)


def _decode(
    header: ProxyHeader, handle: KeyedStateHandle, max_parallelism: int, where: str
) -> Iterator[Entry]:
    decoder = StateDecoder(header, max_parallelism, where)
    states = header.by_name()
    for cf, key, value in raw_records(handle, max_parallelism, where):
        state = states.get(cf)
        if state is None or state.is_timers:
            continue
        yield decoder.decode(state, key, value)
