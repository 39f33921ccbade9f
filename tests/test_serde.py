"""Serializers: round trips, determinism, snapshots, compatibility and every refusal."""

from __future__ import annotations

import json
import math
import pickle
import struct
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from state_engine.errors import (
    IncompatibleSerializer,
    SerializationError,
    SerializerRegistrationConflict,
    UnknownSerializer,
)
from state_engine.serde import (
    ArrowRecordSerializer,
    BoolSerializer,
    BytesSerializer,
    Compatibility,
    FloatSerializer,
    IntSerializer,
    JsonSerializer,
    PickleSerializer,
    SerializerSnapshot,
    StrSerializer,
    TupleSerializer,
    TypeSerializer,
    check_compatibility,
    get_serializer,
    migrate,
    register_serializer,
    registered_serializers,
    serializer_from_snapshot,
)

AS_IS = Compatibility.COMPATIBLE_AS_IS
AFTER = Compatibility.COMPATIBLE_AFTER_MIGRATION
NO = Compatibility.INCOMPATIBLE

text = st.text(alphabet=st.characters(exclude_categories=["Cs"]))
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=20,
)

WIDE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("ratio", pa.float32()),
        pa.field("small", pa.int8()),
        pa.field("count", pa.uint32()),
        pa.field("flag", pa.bool_()),
        pa.field("blob", pa.binary()),
        pa.field("label", pa.large_string(), nullable=False),
    ]
)


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


wide_records = st.fixed_dictionaries(
    {
        "id": int64,
        "name": _maybe(text),
        "score": _maybe(st.floats(allow_nan=False)),
        "ratio": _maybe(st.floats(width=32, allow_nan=False)),
        "small": _maybe(st.integers(-128, 127)),
        "count": _maybe(st.integers(0, 2**32 - 1)),
        "flag": _maybe(st.booleans()),
        "blob": _maybe(st.binary()),
        "label": text,
    }
)


def _bits(x: float) -> bytes:
    return struct.pack(">d", x)


# --- round trips and determinism ---


# No deadlines: the machine is shared and first examples pay warm-ups (pyarrow, hypothesis).
@settings(deadline=None)
@given(text)
def test_str_round_trip_is_utf8(value: str) -> None:
    data = StrSerializer().serialize(value)
    assert data == value.encode("utf-8")
    assert StrSerializer().deserialize(data) == value


@settings(deadline=None)
@given(int64)
def test_int_round_trip_is_signed_64_bit_big_endian(value: int) -> None:
    data = IntSerializer().serialize(value)
    assert data == value.to_bytes(8, "big", signed=True)
    assert IntSerializer().deserialize(data) == value


@settings(deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_float_round_trip_is_bit_exact(value: float) -> None:
    data = FloatSerializer().serialize(value)
    assert len(data) == 8
    assert _bits(FloatSerializer().deserialize(data)) == _bits(value)


@pytest.mark.parametrize("bits", [0x7FF8000000000001, 0xFFF8000000000000, 0x8000000000000000])
def test_float_keeps_nan_payloads_and_negative_zero(bits: int) -> None:
    value = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
    data = FloatSerializer().serialize(value)
    assert data == bits.to_bytes(8, "big")
    assert _bits(FloatSerializer().deserialize(data)) == data


def test_float_zero_and_negative_zero_are_different_keys() -> None:
    assert FloatSerializer().serialize(0.0) != FloatSerializer().serialize(-0.0)
    assert FloatSerializer().serialize(1) == FloatSerializer().serialize(1.0)


@settings(deadline=None)
@given(st.binary())
def test_bytes_round_trip_unchanged(value: bytes) -> None:
    assert BytesSerializer().serialize(value) == value
    assert BytesSerializer().serialize(bytearray(value)) == value
    assert BytesSerializer().deserialize(memoryview(value)) == value  # type: ignore[arg-type]  # any buffer


@pytest.mark.parametrize(("value", "data"), [(True, b"\x01"), (False, b"\x00")])
def test_bool_is_one_byte(value: bool, data: bytes) -> None:
    assert BoolSerializer().serialize(value) == data
    assert BoolSerializer().deserialize(data) is value


@settings(deadline=None)
@given(json_values)
def test_json_round_trip(value: Any) -> None:
    ser = JsonSerializer()
    assert ser.deserialize(ser.serialize(value)) == value


def test_json_is_compact_sorted_and_not_ascii_escaped() -> None:
    a = JsonSerializer().serialize({"b": [1, 2], "a": "é😀"})
    b = JsonSerializer().serialize({"a": "é😀", "b": [1, 2]})
    assert a == b == '{"a":"é😀","b":[1,2]}'.encode()


@settings(deadline=None)
@given(st.dictionaries(text, json_values, max_size=6))
def test_json_equal_dicts_give_equal_bytes(value: dict[str, Any]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert JsonSerializer().serialize(value) == JsonSerializer().serialize(reordered)


@settings(deadline=None)
@given(st.tuples(text, int64, st.floats(allow_nan=False), st.binary(), st.booleans()))
def test_tuple_round_trip(value: tuple[Any, ...]) -> None:
    ser = TupleSerializer(str, int, float, bytes, bool)
    data = ser.serialize(value)
    back = ser.deserialize(data)
    assert back[0] == value[0] and back[1:2] == value[1:2] and back[3:] == value[3:]
    assert _bits(back[2]) == _bits(value[2])
    assert ser.serialize(list(value)) == data


@settings(deadline=None)
@given(st.tuples(text, text), st.tuples(text, text))
def test_tuple_encoding_is_injective(a: tuple[str, str], b: tuple[str, str]) -> None:
    # ("ab", "c") and ("a", "bc") must not collide: keys are compared as bytes.
    ser = TupleSerializer(str, str)
    assert (ser.serialize(a) == ser.serialize(b)) == (a == b)


def test_nested_tuple_round_trip() -> None:
    ser = TupleSerializer(str, TupleSerializer(int, "json"))
    value = ("k", (7, {"x": [1, None]}))
    assert ser.deserialize(ser.serialize(value)) == value
    assert TupleSerializer(int, float, bool).fixed_size == 17
    assert TupleSerializer(int, str).fixed_size is None


@settings(deadline=None)
@given(wide_records)
def test_arrow_record_round_trip_with_nulls(record: dict[str, Any]) -> None:
    ser = ArrowRecordSerializer(WIDE_SCHEMA)
    back = ser.deserialize(ser.serialize(record))
    assert list(back) == WIDE_SCHEMA.names
    for name, value in record.items():
        if isinstance(value, float):
            assert back[name] == value or (math.isnan(value) and math.isnan(back[name]))
        else:
            assert back[name] == value


@settings(deadline=None)
@given(wide_records)
def test_arrow_record_matches_arrow_itself(record: dict[str, Any]) -> None:
    # What we read back is what Arrow would hold for the same record under the same schema.
    ser = ArrowRecordSerializer(WIDE_SCHEMA)
    expected = pa.Table.from_pylist([record], schema=WIDE_SCHEMA).to_pylist()[0]
    assert ser.deserialize(ser.serialize(record)) == expected


@settings(deadline=None)
@given(wide_records)
def test_arrow_record_is_deterministic_and_order_insensitive(record: dict[str, Any]) -> None:
    ser = ArrowRecordSerializer(WIDE_SCHEMA)
    reordered = dict(reversed(list(record.items())))
    assert ser.serialize(record) == ser.serialize(reordered)


def test_arrow_record_missing_nullable_field_is_null() -> None:
    ser = ArrowRecordSerializer(WIDE_SCHEMA)
    back = ser.deserialize(ser.serialize({"id": 1, "label": "x"}))
    assert back == {n: None for n in WIDE_SCHEMA.names} | {"id": 1, "label": "x"}


def test_arrow_record_with_many_nullable_fields() -> None:
    schema = pa.schema([pa.field(f"f{i}", pa.int32()) for i in range(70)])
    ser = ArrowRecordSerializer(schema)
    record = {f"f{i}": (i if i % 3 else None) for i in range(70)}
    assert ser.deserialize(ser.serialize(record)) == record


@settings(deadline=None)
@given(st.sets(st.integers(), max_size=5) | st.frozensets(text, max_size=5))
def test_pickle_round_trip(value: Any) -> None:
    ser = get_serializer("pickle")
    assert ser.deserialize(ser.serialize(value)) == value


# --- snapshots and rebuilding the writer ---

ALL_BUILTINS: list[TypeSerializer] = [
    StrSerializer(),
    IntSerializer(),
    FloatSerializer(),
    BytesSerializer(),
    BoolSerializer(),
    JsonSerializer(),
    PickleSerializer(),
    PickleSerializer(protocol=4),
    TupleSerializer(str, int, TupleSerializer(bytes, "json")),
    ArrowRecordSerializer(WIDE_SCHEMA),
]


@pytest.mark.parametrize("ser", ALL_BUILTINS, ids=repr)
def test_snapshot_json_round_trip_rebuilds_the_writer(ser: TypeSerializer) -> None:
    snap = ser.snapshot()
    text_form = snap.to_json()
    assert SerializerSnapshot.from_json(text_form) == snap
    assert SerializerSnapshot.from_json(text_form).to_json() == text_form
    assert SerializerSnapshot.from_dict(snap.to_dict()) == snap
    rebuilt = serializer_from_snapshot(SerializerSnapshot.from_json(text_form))
    assert type(rebuilt) is type(ser)
    assert rebuilt == ser and hash(rebuilt) == hash(ser)
    assert rebuilt.resolve_compatibility(snap) is AS_IS
    assert pickle.loads(pickle.dumps(ser)) == ser
    assert pickle.loads(pickle.dumps(snap)) == snap


def test_snapshot_json_is_stable_and_sorted() -> None:
    snap = SerializerSnapshot("x", 2, {"b": 1, "a": (1, 2)})
    assert snap.to_json() == '{"config":{"a":[1,2],"b":1},"name":"x","version":2}'
    assert snap == SerializerSnapshot("x", 2, {"a": [1, 2], "b": 1})
    assert SerializerSnapshot("x", 1).config == {}


def test_snapshot_is_immutable() -> None:
    snap = SerializerSnapshot("x", 1, {"a": 1})
    with pytest.raises(TypeError):
        snap.config["a"] = 2  # type: ignore[index]  # read-only: the assignment fails on purpose


def test_rebuilt_serializer_reads_the_writers_bytes() -> None:
    writer = TupleSerializer(str, ArrowRecordSerializer(WIDE_SCHEMA))
    value = ("k", {"id": 5, "label": "l", "name": None, "flag": True})
    data = writer.serialize(value)
    reader = serializer_from_snapshot(writer.snapshot().to_dict())
    assert reader.deserialize(data) == writer.deserialize(data)
    assert reader.serialize(value) == data


# --- compatibility ---


def _schema(*fields: tuple[str, pa.DataType, bool]) -> pa.Schema:
    return pa.schema([pa.field(n, t, nullable=nl) for n, t, nl in fields])


BASE = _schema(("id", pa.int32(), False), ("v", pa.float32(), True), ("s", pa.string(), True))


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        (BASE, AS_IS),
        (BASE.with_metadata({"x": "y"}), AS_IS),
        (BASE.append(pa.field("extra", pa.string(), nullable=True)), AFTER),
        (BASE.append(pa.field("extra", pa.string(), nullable=False)), NO),
        (
            _schema(("id", pa.int64(), False), ("v", pa.float32(), True), ("s", pa.string(), True)),
            AFTER,
        ),
        (
            _schema(("id", pa.int32(), False), ("v", pa.float64(), True), ("s", pa.string(), True)),
            AFTER,
        ),
        (
            _schema(
                ("id", pa.int32(), True), ("v", pa.float32(), True), ("s", pa.large_string(), True)
            ),
            AFTER,
        ),
        (
            _schema(("s", pa.string(), True), ("v", pa.float32(), True), ("id", pa.int32(), False)),
            AFTER,
        ),
        (_schema(("id", pa.int32(), False), ("v", pa.float32(), True)), NO),
        (
            _schema(("id", pa.int16(), False), ("v", pa.float32(), True), ("s", pa.string(), True)),
            NO,
        ),
        (
            _schema(
                ("id", pa.string(), False), ("v", pa.float32(), True), ("s", pa.string(), True)
            ),
            NO,
        ),
        (
            _schema(
                ("id", pa.int32(), False), ("v", pa.float32(), False), ("s", pa.string(), True)
            ),
            NO,
        ),
        (
            _schema(
                ("id", pa.float64(), False), ("v", pa.float32(), True), ("s", pa.string(), True)
            ),
            NO,
        ),
    ],
)
def test_arrow_schema_evolution(new: pa.Schema, expected: Compatibility) -> None:
    old = ArrowRecordSerializer(BASE)
    current = ArrowRecordSerializer(new)
    assert current.resolve_compatibility(old.snapshot()) is expected
    if expected is not NO:
        data = old.serialize({"id": 7, "v": 1.5, "s": "x"})
        migrated = migrate(data, serializer_from_snapshot(old.snapshot()), current)
        back = current.deserialize(migrated)
        assert (back["id"], back["v"], back["s"]) == (7, 1.5, "x")
        assert all(back[n] is None for n in new.names if n not in BASE.names)


@pytest.mark.parametrize(
    ("current", "previous", "expected"),
    [
        (StrSerializer(), StrSerializer(), AS_IS),
        (IntSerializer(), IntSerializer(), AS_IS),
        (IntSerializer(), StrSerializer(), NO),
        (FloatSerializer(), IntSerializer(), NO),
        (JsonSerializer(), PickleSerializer(), NO),
        (PickleSerializer(), JsonSerializer(), NO),
        (PickleSerializer(5), PickleSerializer(4), AFTER),
        (TupleSerializer(str, int), TupleSerializer(str, int), AS_IS),
        (TupleSerializer(str, int), TupleSerializer(int, int), NO),
        (TupleSerializer(str, int), TupleSerializer(str, int, int), NO),
        (
            TupleSerializer(str, ArrowRecordSerializer(BASE)),
            TupleSerializer(str, ArrowRecordSerializer(BASE)),
            AS_IS,
        ),
        (
            TupleSerializer(str, ArrowRecordSerializer(BASE.append(pa.field("n", pa.int8())))),
            TupleSerializer(str, ArrowRecordSerializer(BASE)),
            AFTER,
        ),
        (ArrowRecordSerializer(BASE), JsonSerializer(), NO),
    ],
)
def test_compatibility_matrix(
    current: TypeSerializer, previous: TypeSerializer, expected: Compatibility
) -> None:
    assert current.resolve_compatibility(previous.snapshot()) is expected


def test_newer_or_unknown_version_is_incompatible() -> None:
    assert StrSerializer().resolve_compatibility(SerializerSnapshot("str", 2)) is NO
    assert StrSerializer().resolve_compatibility(SerializerSnapshot("str", 1, {"x": 1})) is NO
    with pytest.raises(IncompatibleSerializer, match="version 9 is not known"):
        serializer_from_snapshot(SerializerSnapshot("str", 9))


def test_check_compatibility_raises_naming_the_state() -> None:
    assert (
        check_compatibility(IntSerializer().snapshot(), IntSerializer(), "state 'count'") is AS_IS
    )
    with pytest.raises(IncompatibleSerializer, match="state 'count'.*cannot read"):
        check_compatibility(StrSerializer().snapshot(), IntSerializer(), "state 'count'")


class _CelsiusV1(TypeSerializer):
    """A user serializer's first format: whole degrees as text."""

    name = "test-celsius"
    version = 1

    def serialize(self, value: Any) -> bytes:
        return str(round(value)).encode()

    def deserialize(self, data: bytes) -> float:
        return float(data.decode())


class _CelsiusV2(TypeSerializer):
    """Its second format: a double."""

    name = "test-celsius"
    version = 2
    fixed_size = 8

    def serialize(self, value: Any) -> bytes:
        return struct.pack(">d", value)

    def deserialize(self, data: bytes) -> float:
        return struct.unpack(">d", data)[0]


def test_user_serializer_versions_migrate() -> None:
    register_serializer(_CelsiusV1)
    register_serializer(_CelsiusV2)
    register_serializer(_CelsiusV2)  # idempotent
    assert registered_serializers()["test-celsius"] == [1, 2]
    old_bytes = _CelsiusV1().serialize(21.0)
    current = _CelsiusV2()
    assert current.resolve_compatibility(_CelsiusV1().snapshot()) is AFTER
    previous = serializer_from_snapshot(_CelsiusV1().snapshot())
    assert isinstance(previous, _CelsiusV1)
    assert current.deserialize(migrate(old_bytes, previous, current)) == 21.0
    assert _CelsiusV1().resolve_compatibility(current.snapshot()) is NO
    assert get_serializer("test-celsius") == current


def test_registration_conflicts_are_refused() -> None:
    class Impostor(StrSerializer):
        pass

    with pytest.raises(SerializerRegistrationConflict, match="'str' version 1 is already"):
        register_serializer(Impostor)
    with pytest.raises(SerializerRegistrationConflict, match="TypeSerializer subclass"):
        register_serializer(int)  # type: ignore[arg-type]  # a wrong value on purpose

    class Nameless(StrSerializer):
        name = ""

    with pytest.raises(SerializerRegistrationConflict, match="needs class attributes"):
        register_serializer(Nameless)


# --- lookup ---


@pytest.mark.parametrize(
    ("spec", "cls"),
    [
        (str, StrSerializer),
        (int, IntSerializer),
        (float, FloatSerializer),
        (bytes, BytesSerializer),
        (bool, BoolSerializer),
        (dict, JsonSerializer),
        (list, JsonSerializer),
        ("str", StrSerializer),
        ("int", IntSerializer),
        ("float", FloatSerializer),
        ("bytes", BytesSerializer),
        ("bool", BoolSerializer),
        ("json", JsonSerializer),
        ("pickle", PickleSerializer),
        ((str, int), TupleSerializer),
        (WIDE_SCHEMA, ArrowRecordSerializer),
    ],
)
def test_get_serializer(spec: Any, cls: type[TypeSerializer]) -> None:
    assert type(get_serializer(spec)) is cls


def test_get_serializer_returns_instances_as_they_are() -> None:
    ser = TupleSerializer(str, int)
    assert get_serializer(ser) is ser


@pytest.mark.parametrize("spec", [object, set, tuple, type(None), complex])
def test_pickle_is_never_chosen_for_a_type(spec: Any) -> None:
    with pytest.raises(UnknownSerializer, match="'pickle' explicitly"):
        get_serializer(spec)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("nope", "no serializer named 'nope': registered names are .*json.*str"),
        ("tuple", "needs arguments.*TupleSerializer"),
        ("arrow-record", "needs arguments.*ArrowRecordSerializer"),
        (3, r"cannot make a serializer from int \(3\)"),
        ((), r"cannot make a serializer from tuple"),
        (None, "cannot make a serializer from NoneType"),
    ],
)
def test_get_serializer_refuses_unknown_specs(spec: Any, match: str) -> None:
    with pytest.raises(UnknownSerializer, match=match):
        get_serializer(spec)


def test_unknown_snapshot_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownSerializer, match="no serializer named 'avro' is registered.*json"):
        serializer_from_snapshot({"name": "avro", "version": 1})


# --- bad values ---


@pytest.mark.parametrize(
    ("ser", "value", "match"),
    [
        (StrSerializer(), 42, r"str serializer cannot encode a value of type int \(42\): pass"),
        (StrSerializer(), "a\ud800", "lone surrogates"),
        (IntSerializer(), 2**63, "outside the signed 64-bit range"),
        (IntSerializer(), -(2**63) - 1, "outside the signed 64-bit range"),
        (IntSerializer(), "1", "int serializer cannot encode a value of type str"),
        (IntSerializer(), 1.5, "int serializer cannot encode a value of type float"),
        (FloatSerializer(), "1.0", "float serializer cannot encode a value of type str"),
        (FloatSerializer(), 10**400, "float serializer cannot encode"),
        (BytesSerializer(), 5, r"bytes serializer cannot encode a value of type int \(5\)"),
        (BytesSerializer(), "abc", "bytes serializer cannot encode a value of type str"),
        (BoolSerializer(), 1, "pass True or False"),
        (BoolSerializer(), None, "pass True or False"),
        (JsonSerializer(), {1, 2}, "json serializer cannot encode a value of type set.*not JSON"),
        (JsonSerializer(), {"a": object()}, "type object is not JSON serializable"),
        (JsonSerializer(), float("nan"), "no NaN"),
        (JsonSerializer(), ["\udcff"], "lone surrogates"),
        (PickleSerializer(), lambda: 1, "pickle serializer cannot encode a value of type function"),
        (TupleSerializer(str, int), "ab", "pass a tuple of 2 values"),
        (TupleSerializer(str, int), ("a",), "it has 1 fields but the serializer has 2"),
        (TupleSerializer(str, int), ("a", "b"), "tuple field 1: int serializer cannot encode"),
    ],
)
def test_values_a_serializer_cannot_encode(ser: TypeSerializer, value: Any, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        ser.serialize(value)


def test_self_containing_json_is_refused() -> None:
    value: list[Any] = []
    value.append(value)
    with pytest.raises(SerializationError, match="json serializer cannot encode"):
        JsonSerializer().serialize(value)


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"name": "x", "label": "l"}, "field 'id' .*not null.* is missing or None"),
        ({"id": None, "label": "l"}, "field 'id' .*is missing or None"),
        ({"id": 1}, "field 'label' .*is missing or None"),
        ({"id": "1", "label": "l"}, "type str.*field 'id' \\(int64, not null\\) cannot hold it"),
        ({"id": 2**63, "label": "l"}, "field 'id' .*cannot hold it"),
        ({"id": 1, "label": "l", "small": 128}, "field 'small' \\(int8\\) cannot hold it"),
        ({"id": 1, "label": "l", "count": -1}, "field 'count' \\(uint32\\) cannot hold it"),
        ({"id": 1, "label": "l", "ratio": 1e300}, "field 'ratio' \\(float\\) cannot hold it"),
        ({"id": 1, "label": "l", "flag": 1}, "field 'flag' \\(bool\\) cannot hold it"),
        ({"id": 1, "label": "l", "blob": 3}, "field 'blob' \\(binary\\) cannot hold it"),
        ({"id": 1, "label": 3}, "field 'label' \\(large_string, not null\\) cannot hold it"),
        ({"id": 1, "label": "l", "other": 1}, "fields \\['other'\\] that are not in the schema"),
        ({"id": 1, "label": "l", "name": None, "x": 1}, "fields \\['x'\\] that are not in"),
        ({"id": 1, "x": 2, "y": 3, "label": "l"}, "fields \\['x', 'y'\\]"),
        ([("id", 1)], "pass a dict of field -> value"),
    ],
)
def test_records_an_arrow_serializer_refuses(record: Any, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        ArrowRecordSerializer(WIDE_SCHEMA).serialize(record)


def test_unknown_field_is_refused_even_when_a_nullable_field_is_missing() -> None:
    # Same number of keys as the schema, but one of them is not a schema field.
    ser = ArrowRecordSerializer(_schema(("a", pa.int64(), False), ("b", pa.int64(), True)))
    with pytest.raises(SerializationError, match="\\['c'\\] that are not in the schema"):
        ser.serialize({"a": 1, "c": 2})


@pytest.mark.parametrize(
    ("schema", "match"),
    [
        (pa.schema([("t", pa.timestamp("us"))]), "field 't' of type timestamp.*supported types"),
        (pa.schema([("l", pa.list_(pa.int32()))]), "field 'l' of type list"),
        (pa.schema([]), "at least one field"),
        (pa.schema([("a", pa.int8()), ("a", pa.int16())]), "unique field names"),
        ({"a": "int64"}, "takes a pyarrow.Schema"),
    ],
)
def test_unsupported_arrow_schemas(schema: Any, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        ArrowRecordSerializer(schema)


@pytest.mark.parametrize(
    ("ser", "data", "match"),
    [
        (StrSerializer(), b"\xff", "str serializer cannot decode 1 bytes: not UTF-8"),
        (IntSerializer(), b"\x00" * 7, "int serializer cannot decode 7 bytes: expected exactly 8"),
        (IntSerializer(), b"\x00" * 9, "expected exactly 8"),
        (FloatSerializer(), b"", "float serializer cannot decode 0 bytes"),
        (BoolSerializer(), b"\x02", "expected one byte 0x00 or 0x01"),
        (BoolSerializer(), b"", "expected one byte"),
        (JsonSerializer(), b"{", "json serializer cannot decode 1 bytes: not UTF-8 JSON"),
        (JsonSerializer(), b"\xff", "not UTF-8 JSON"),
        (PickleSerializer(), b"not a pickle", "pickle serializer cannot decode"),
        (TupleSerializer(str, int), b"\x00\x00", "truncated length"),
        (TupleSerializer(str, int), b"\x00\x00\x00\x09ab", "field 0 runs past the end"),
        (TupleSerializer(int), b"\x00" * 9, "1 bytes left after the last field"),
        (TupleSerializer(int, int), b"\x00" * 12, "field 1 runs past the end"),
        (ArrowRecordSerializer(BASE), b"\x00", "shorter than the"),
        (
            ArrowRecordSerializer(BASE),
            ArrowRecordSerializer(BASE).serialize({"id": 1, "s": "x"}) + b"!",
            "add up to",
        ),
        (
            ArrowRecordSerializer(BASE),
            ArrowRecordSerializer(BASE).serialize({"id": 1, "s": "x"})[:-1],
            "add up to",
        ),
        (
            ArrowRecordSerializer(BASE),
            ArrowRecordSerializer(BASE).serialize({"id": 1, "s": "é"})[:-1],
            "not UTF-8",
        ),
    ],
)
def test_corrupt_bytes_are_refused(ser: TypeSerializer, data: bytes, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        ser.deserialize(data)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"name": "", "version": 1}, "non-empty string"),
        ({"name": "str", "version": 0}, "version must be an integer >= 1"),
        ({"name": "str", "version": True}, "version must be an integer"),
        ({"name": "str", "version": 1, "config": []}, "config must be a mapping"),
        ({"name": "str", "version": 1, "config": {"x": {1, 2}}}, "must be JSON-able"),
        ({"name": "str"}, "needs exactly the keys"),
        ({"name": "str", "version": 1, "extra": 1}, "needs exactly the keys"),
        (["str", 1], "must be a mapping"),
    ],
)
def test_malformed_snapshots_are_refused(data: Any, match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        SerializerSnapshot.from_dict(data)


def test_malformed_snapshot_json_and_configs_are_refused() -> None:
    with pytest.raises(SerializationError, match="not valid JSON"):
        SerializerSnapshot.from_json("{")
    with pytest.raises(SerializationError, match="takes no config"):
        serializer_from_snapshot(SerializerSnapshot("int", 1, {"x": 1}))
    with pytest.raises(SerializationError, match="non-empty list 'fields'"):
        serializer_from_snapshot(SerializerSnapshot("tuple", 1, {"fields": []}))
    with pytest.raises(SerializationError, match="'fields' with name, type"):
        serializer_from_snapshot(SerializerSnapshot("arrow-record", 1, {"fields": [{"name": "a"}]}))
    with pytest.raises(SerializationError, match="exactly 'protocol'"):
        serializer_from_snapshot(SerializerSnapshot("pickle", 1))
    with pytest.raises(SerializationError, match="protocol must be an int"):
        PickleSerializer(protocol=99)
    with pytest.raises(SerializationError, match="at least one field"):
        TupleSerializer()


@given(st.lists(st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.booleans())))
def test_json_lists_of_ints_are_the_encoders_bytes(value: list[Any]) -> None:
    """Lists (and tuples) of ints take a direct path: its bytes are the JSON encoder's."""
    ser = JsonSerializer()
    expected = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    assert ser.serialize(value) == expected
    assert ser.serialize(tuple(value)) == expected
    assert ser.deserialize(ser.serialize(value)) == value
