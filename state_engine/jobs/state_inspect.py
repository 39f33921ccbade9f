"""Any COMPLETED canonical snapshot (checkpoint or savepoint) as a readable Spark DataFrame.

One Spark task per keyed Parquet file reads it through the snapshot's own storage (fsspec, as every
other job does: no Hadoop file system, so ``s3://`` needs no Hadoop jars) and rebuilds the key and
state serializers from their snapshots in ``_metadata`` to decode every row. Columns: ``operator``,
``key_group``, ``state``, ``key``, ``namespace``, ``user_key``, ``value``, ``expires_at``. A
decoded string is shown as is, any other value as JSON (bytes as hex); the void namespace is null;
a list element's ``user_key`` is its position.

A key filter turns the key into its key group first: only the files and row groups whose index
holds that key group are read.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from state_engine.catalog import Catalog
from state_engine.checkpoint.canonical import read_key_groups
from state_engine.checkpoint.metadata import SnapshotFile, SnapshotMetadata
from state_engine.errors import InvalidJobParams, SerializationError
from state_engine.jobs.inputs import InputSnapshot, load_input
from state_engine.jobs.snapshot_read import open_source
from state_engine.keygroups import assign_to_key_group
from state_engine.serde import TypeSerializer, serializer_from_snapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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
SCHEMA = (
    "operator string, key_group int, state string, key string, namespace string, "
    "user_key string, value string, expires_at long"
)
_ARROW_SCHEMA = pa.schema(
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
_POSITION = struct.Struct(">I")


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


class _Decoder:
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

    def batch(self, operator: str, batch: pa.RecordBatch) -> pa.RecordBatch:
        key_ser = self.keys.get(operator)
        cols = {n: batch.column(n).to_pylist() for n in ("key", "namespace", "state")}
        user_keys = batch.column("user_key").to_pylist()
        values = batch.column("value").to_pylist()
        out: dict[str, list[Any]] = {c: [] for c in ("key", "namespace", "user_key", "value")}
        for key, ns, state, uk, value in zip(
            cols["key"], cols["namespace"], cols["state"], user_keys, values, strict=True
        ):
            kind, sers = self.states.get((operator, state), ("", {}))
            out["key"].append(_decode(key_ser, key))
            out["namespace"].append(_decode(sers.get("namespace"), ns))
            if uk is None:
                out["user_key"].append(None)
            elif kind == "LIST" and len(uk) == _POSITION.size:
                out["user_key"].append(str(_POSITION.unpack(uk)[0]))
            else:
                out["user_key"].append(_decode(sers.get("user_key"), uk))
            out["value"].append(_decode(sers.get("value"), value))
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
            schema=_ARROW_SCHEMA,
        )


def _decode(serializer: TypeSerializer | None, data: bytes | None) -> str | None:
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


def snapshot_frame(
    spark: SparkSession,
    catalog: Catalog,
    snapshot_id: int,
    *,
    state: str | None = None,
    key: str | None = None,
    operator: str | None = None,
) -> DataFrame:
    """The decoded keyed state of a COMPLETED canonical snapshot (see the module docstring)."""
    from pyspark.sql import functions as F

    inp = load_input(catalog, snapshot_id)
    specs = decoder_specs(inp.meta)
    operators = operators_to_read(snapshot_id, specs, operator, state)
    frames = []
    for op in operators:
        frame = _operator_frame(spark, inp, op, specs, state, key)
        if frame is not None:
            frames.append(frame)
    if not frames:
        return spark.createDataFrame([], SCHEMA)
    result = frames[0]
    for f in frames[1:]:
        result = result.unionByName(f)
    return result.orderBy(F.col("operator"), F.col("key_group"), F.col("key"), F.col("state"))


def _operator_frame(
    spark: SparkSession,
    inp: InputSnapshot,
    op: str,
    specs: dict[str, dict[str, Any]],
    state: str | None,
    key: str | None,
) -> DataFrame | None:
    files, key_groups, key_bytes = read_plan(inp, op, specs, key)
    if not files:
        return None
    url, kind, meta = inp.url, inp.record.kind, inp.meta

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        decoder = _Decoder(specs)
        snapshot = open_source(url, kind)
        for batch in batches:
            for i in batch.column(0).to_pylist():
                for rows in read_key_groups(snapshot, meta, key_groups, files=[files[i]]):
                    rows = _matching(rows, state, key_bytes)
                    if rows.num_rows:
                        yield decoder.batch(op, rows)

    return spark.range(0, len(files), 1, len(files)).mapInArrow(decode, SCHEMA)


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


def _matching(batch: pa.RecordBatch, state: str | None, key: bytes | None) -> pa.RecordBatch:
    mask = None
    if state is not None:
        mask = pc.equal(batch.column("state"), state)
    if key is not None:
        by_key = pc.equal(batch.column("key"), pa.scalar(key, pa.binary()))
        mask = by_key if mask is None else pc.and_(mask, by_key)
    return batch if mask is None else batch.filter(mask)


def show_rows(
    spark: SparkSession,
    catalog: Catalog,
    snapshot_id: int,
    *,
    state: str | None = None,
    key: str | None = None,
    operator: str | None = None,
    limit: int | None = 100,
) -> list[dict[str, Any]]:
    """The first ``limit`` decoded rows, as dicts in :data:`COLUMNS` order."""
    df = snapshot_frame(spark, catalog, snapshot_id, state=state, key=key, operator=operator)
    if limit is not None:
        df = df.limit(limit)
    return [{c: row[c] for c in COLUMNS} for row in df.collect()]
