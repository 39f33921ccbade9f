"""Decoding canonical keyed rows for people: the serializers rebuilt from ``_metadata``, each
key, namespace, user key and value shown as text (strings as is, other values as JSON, bytes as
hex, a list element's user key as its position); and which files a request reads.

Shared by ``state show`` on Spark (:mod:`state_engine.jobs.state_inspect`) and without it
(:mod:`state_engine.maintenance.state_local`), so both print the same rows.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import pyarrow as pa

from state_engine.errors import InvalidJobParams, SerializationError
from state_engine.keygroups import assign_to_key_group
from state_engine.maintenance.inputs import InputSnapshot
from state_engine.serde import TypeSerializer, serializer_from_snapshot
from state_engine.snapshot.metadata import SnapshotFile, SnapshotMetadata

COLUMNS = (
    "operator",
    "key_group",
    "state",
    "key",
    "namespace",
    "user_key",
    "value",
    "expires_at",
)
ARROW_SCHEMA = pa.schema(
    [
        ("operator", pa.string()),
        ("key_group", pa.int32()),
        ("state", pa.string()),
        ("key", pa.string()),
        ("namespace", pa.string()),
        ("user_key", pa.string()),
        ("value", pa.string()),
        ("expires_at", pa.int64()),
    ]
)
POSITION = struct.Struct(">I")


def render(value: Any) -> str | None:
    """A decoded value as text: strings as is, bytes as hex, the void namespace as null."""
    if value is None or repr(value) == "VOID_NAMESPACE":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    return repr(value)


def parse_key(text: str, key_serializer: TypeSerializer) -> Any:
    """A key typed on the command line, as the job's key type (str, int, or JSON for others)."""
    name = key_serializer.snapshot().name
    if name == "str":
        return text
    try:
        if name == "int":
            return int(text)
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidJobParams(
            f"key {text!r} is not a {name} key ({exc}); keys of this job are {name}s: give an "
            'integer for int keys and JSON (e.g. ["a", 1]) for tuple keys'
        ) from None
    return tuple(value) if isinstance(value, list) else value


class StateDecoder:
    """Per operator, the key serializer; per state, its kind and serializers (rebuilt lazily)."""

    def __init__(self, specs: dict[str, dict[str, Any]]) -> None:
        import state_engine.state  # noqa: F401  (registers the namespace serializer)

        self.keys = {op: serializer_from_snapshot(s["key"]) for op, s in specs.items() if s["key"]}
        self.states: dict[tuple[str, str], tuple[str, dict[str, TypeSerializer]]] = {}
        for op, s in specs.items():
            for name, info in s["states"].items():
                sers = {
                    role: serializer_from_snapshot(snap)
                    for role, snap in (info.get("serializers") or {}).items()
                }
                self.states[(op, name)] = (str(info.get("kind", "")).upper(), sers)

    def columns(
        self,
        operator: str,
        state: list[str],
        key: list[bytes | None],
        namespace: list[bytes | None],
        user_key: list[bytes | None],
        value: list[bytes | None],
    ) -> dict[str, list[str | None]]:
        """The ``key``, ``namespace``, ``user_key`` and ``value`` columns of one operator's rows
        decoded as text, in plain Python (no Arrow array is built from Python lists here: that
        makes pyarrow import pandas)."""
        key_ser = self.keys.get(operator)
        out: dict[str, list[str | None]] = {
            c: [] for c in ("key", "namespace", "user_key", "value")
        }
        for k, ns, st, uk, v in zip(key, namespace, state, user_key, value, strict=True):
            kind, sers = self.states.get((operator, st), ("", {}))
            out["key"].append(decode(key_ser, k))
            out["namespace"].append(decode(sers.get("namespace"), ns))
            if uk is None:
                out["user_key"].append(None)
            elif kind == "LIST" and len(uk) == POSITION.size:
                out["user_key"].append(str(POSITION.unpack(uk)[0]))
            else:
                out["user_key"].append(decode(sers.get("user_key"), uk))
            out["value"].append(decode(sers.get("value"), v))
        return out

    def batch(self, operator: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A canonical batch of ``operator`` decoded, in :data:`COLUMNS` order."""
        out = self.columns(
            operator,
            *(
                batch.column(n).to_pylist()
                for n in ("state", "key", "namespace", "user_key", "value")
            ),
        )
        n = batch.num_rows
        return pa.RecordBatch.from_arrays(
            [
                pa.array([operator] * n, pa.string()),
                batch.column("key_group").cast(pa.int32()),
                batch.column("state").cast(pa.string()),
                pa.array(out["key"], pa.string()),
                pa.array(out["namespace"], pa.string()),
                pa.array(out["user_key"], pa.string()),
                pa.array(out["value"], pa.string()),
                batch.column("expires_at").cast(pa.int64()),
            ],
            schema=ARROW_SCHEMA,
        )


def decode(serializer: TypeSerializer | None, data: bytes | None) -> str | None:
    if data is None:
        return None
    if serializer is None:
        return bytes(data).hex()
    try:
        return render(serializer.deserialize(bytes(data)))
    except SerializationError:
        return "0x" + bytes(data).hex()  # shown, not fatal: one odd row must not hide the rest


def decoder_specs(meta: SnapshotMetadata) -> dict[str, dict[str, Any]]:
    """The serializer snapshots the decoder needs, as plain JSON (cheap to ship to tasks)."""
    return {
        op.operator_id: {"key": op.key_serializer, "states": op.states}
        for op in meta.operators
        if op.subtasks
    }


def operators_to_read(
    snapshot_id: int, specs: dict[str, dict[str, Any]], operator: str | None, state: str | None
) -> list[str]:
    """The keyed operators a request reads; an unknown operator or state is refused."""
    operators = list(specs) if operator is None else [operator]
    for op in operators:
        if op not in specs:
            raise InvalidJobParams(
                f"snapshot {snapshot_id} has no keyed operator {op!r}; it has "
                f"{', '.join(specs) or 'none'}"
            )
    if state is not None and not any(state in specs[op]["states"] for op in operators):
        known = sorted({s for op in operators for s in specs[op]["states"]})
        raise InvalidJobParams(
            f"snapshot {snapshot_id} has no state {state!r}; it has {', '.join(known) or 'none'}"
        )
    return operators


def read_plan(
    inp: InputSnapshot, op: str, specs: dict[str, dict[str, Any]], key: str | None
) -> tuple[list[SnapshotFile], tuple[int, int], bytes | None]:
    """The keyed files of ``op`` to read, the key-group range within them, the serialized key.

    With a key, only the files whose key-group index holds the key's key group.
    """
    files = inp.keyed_files(op)
    if key is None:
        return files, (0, inp.meta.max_parallelism - 1), None
    key_ser = serializer_from_snapshot(specs[op]["key"])
    typed = parse_key(key, key_ser)
    kg = assign_to_key_group(typed, inp.meta.max_parallelism)
    return [f for f in files if f.row_groups_for(kg, kg)], (kg, kg), key_ser.serialize(typed)
