"""What a backend records about each state (for checkpoints' _metadata) and the canonical row."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

from state_engine.errors import InvalidStateDescriptor
from state_engine.serde import SerializerSnapshot, TypeSerializer, serializer_from_snapshot
from state_engine.state.descriptors import StateKind
from state_engine.state.ttl import StateTtlConfig

if TYPE_CHECKING:
    import pyarrow as pa


class StateEntry(NamedTuple):
    """One canonical keyed-state row (the Parquet schema of canonical snapshots).

    Value/Reducing/Aggregating: one row, ``user_key`` None. Map: one row per entry, ``user_key`` the
    serialized map key. List: one row per element, ``user_key`` its position as 4-byte big-endian.
    ``value`` is serialized with the state's serializer; expiry is its own column.
    """

    key_group: int
    key_hash: int
    key: bytes
    namespace: bytes
    state: str
    user_key: bytes | None
    value: bytes
    expires_at: int | None


class StateColumns(NamedTuple):
    """Canonical rows of one state, column by column (a restore's bulk form of
    :class:`StateEntry` rows: every column the same length, rows in the same order).

    Each column is a sequence of the field's values, or an Arrow array of them (a restore read
    from Parquet hands its columns over as they are: a backend that decodes Arrow columns itself
    skips a Python object per row and field). :meth:`column` gives either as a list."""

    state: str
    key_group: Sequence[int] | pa.Array
    key_hash: Sequence[int] | pa.Array
    key: Sequence[bytes] | pa.Array
    namespace: Sequence[bytes] | pa.Array
    user_key: Sequence[bytes | None] | pa.Array
    value: Sequence[bytes] | pa.Array
    expires_at: Sequence[int | None] | pa.Array

    @property
    def rows(self) -> int:
        return len(self.key)

    def column(self, name: str) -> Sequence[Any]:
        """Column ``name`` as a Python sequence."""
        values = getattr(self, name)
        to_pylist = getattr(values, "to_pylist", None)  # an Arrow array
        listed: Sequence[Any] = values if to_pylist is None else to_pylist()
        return listed

    def entries(self) -> Iterator[StateEntry]:
        """The rows as :class:`StateEntry` tuples."""
        names = ("key_group", "key_hash", "key", "namespace")
        rows = zip(
            *(self.column(n) for n in names),
            repeat(self.state),
            *(self.column(n) for n in ("user_key", "value", "expires_at")),
            strict=False,  # repeat() never ends; the other columns have one length
        )
        return map(StateEntry._make, rows)


@dataclass(frozen=True)
class StateMetaInfo:
    """Name, kind, serializers (roles ``value``, ``namespace`` and, for maps, ``user_key``), TTL."""

    name: str
    kind: StateKind
    serializers: Mapping[str, TypeSerializer] = field(default_factory=dict)
    ttl: StateTtlConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind.value,
            "serializers": {r: s.snapshot().to_dict() for r, s in sorted(self.serializers.items())},
            "ttl": self.ttl.to_dict() if self.ttl is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StateMetaInfo:
        try:
            return cls(
                name=data["name"],
                kind=StateKind(data["kind"]),
                serializers={
                    role: serializer_from_snapshot(SerializerSnapshot.from_dict(snap))
                    for role, snap in data["serializers"].items()
                },
                ttl=StateTtlConfig.from_dict(data["ttl"]) if data.get("ttl") else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, InvalidStateDescriptor):
                raise
            raise InvalidStateDescriptor(
                f"cannot read state meta info from {dict(data)!r:.200}: {exc!r}; expected the dict "
                "StateMetaInfo.to_dict() writes"
            ) from exc

    @staticmethod
    def coerce(value: StateMetaInfo | Mapping[str, Any]) -> StateMetaInfo:
        return value if isinstance(value, StateMetaInfo) else StateMetaInfo.from_dict(value)
