"""Key groups: key -> key group -> subtask, exactly as Flink's ``KeyGroupRangeAssignment``.

A key's key group is ``murmur_hash(key_hash(key)) % max_parallelism``; subtask ``i`` of
``parallelism`` owns the contiguous range computed by
:func:`compute_key_group_range_for_operator_index`. With the hashes of :mod:`state_engine.hashing`,
String and Long keys land in the same key group (and subtask) as in Flink.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from state_engine.errors import (
    InvalidKeyGroupPrefix,
    InvalidParallelism,
    KeyGroupOutOfRange,
)
from state_engine.hashing import (
    java_string_hash,
    key_hash,
    key_hashes,
    murmur_hash,
    murmur_hash_array,
)
from state_engine.parallelism_limits import (
    DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
    UPPER_BOUND_MAX_PARALLELISM,
)

__all__ = [
    "DEFAULT_LOWER_BOUND_MAX_PARALLELISM",
    "UPPER_BOUND_MAX_PARALLELISM",
    "KeyGroupRange",
    "check_max_parallelism",
    "check_parallelism",
    "assign_to_key_group",
    "clear_caches",
    "compute_key_group_for_key_hash",
    "compute_key_group_range_for_operator_index",
    "compute_operator_index_for_key_group",
    "compute_default_max_parallelism",
    "key_group_prefix",
    "key_group_prefix_length",
    "key_group_from_prefix",
    "assign_to_key_groups",
    "key_groups_for_hashes",
    "operator_indexes_for_key_groups",
]


def _is_int(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, np.integer)


@dataclass(frozen=True, slots=True)
class KeyGroupRange:
    """An inclusive range ``start..end`` of key groups; every empty range is stored as ``0..-1``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if not (_is_int(self.start) and _is_int(self.end)):
            raise KeyGroupOutOfRange(
                f"key-group range bounds must be ints, got start={self.start!r}, end={self.end!r}"
            )
        start, end = int(self.start), int(self.end)
        if start < 0 or end < start - 1 or end >= UPPER_BOUND_MAX_PARALLELISM:
            raise KeyGroupOutOfRange(
                f"invalid key-group range {start}..{end}: need 0 <= start, end >= start - 1 "
                f"(end == start - 1 is empty) "
                f"and end < {UPPER_BOUND_MAX_PARALLELISM}"
            )
        if end < start:
            start, end = 0, -1
        # Frozen dataclass: normalising (and turning NumPy ints into ints) needs object.__setattr__.
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "end", end)

    @classmethod
    def of(cls, start: int, end: int) -> KeyGroupRange:
        """The range ``start..end`` inclusive (``end == start - 1`` gives the empty range)."""
        return cls(start, end)

    @classmethod
    def from_count(cls, start: int, count: int) -> KeyGroupRange:
        """The ``count`` key groups from ``start`` on (as Flink's ``_metadata`` stores a range;
        ``count`` 0 gives the empty range)."""
        return cls(start, start + count - 1)

    @classmethod
    def empty(cls) -> KeyGroupRange:
        """The canonical empty range."""
        return _EMPTY

    @property
    def is_empty(self) -> bool:
        return self.end < self.start

    def __len__(self) -> int:
        return self.end - self.start + 1

    def __contains__(self, key_group: object) -> bool:
        return _is_int(key_group) and self.start <= key_group <= self.end  # type: ignore[operator]  # _is_int: an int

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.start, self.end + 1))

    def intersection(self, other: KeyGroupRange) -> KeyGroupRange:
        """The key groups in both ranges (possibly empty)."""
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyGroupRange(start, end) if start <= end else _EMPTY

    def __str__(self) -> str:
        if self.is_empty:
            return "KeyGroupRange{empty}"
        return f"KeyGroupRange{{{self.start}..{self.end}}}"


_EMPTY = KeyGroupRange(0, -1)


def check_max_parallelism(max_parallelism: int) -> int:
    """Return ``max_parallelism`` as an int after checking it is in 1..32768."""
    if not _is_int(max_parallelism):
        raise InvalidParallelism(
            f"max parallelism must be an int, got {type(max_parallelism).__name__} "
            f"{max_parallelism!r}: pass a whole number in 1..{UPPER_BOUND_MAX_PARALLELISM}"
        )
    value = int(max_parallelism)
    if not 1 <= value <= UPPER_BOUND_MAX_PARALLELISM:
        raise InvalidParallelism(
            f"max parallelism {value} is outside 1..{UPPER_BOUND_MAX_PARALLELISM}: choose a value "
            f"in that range (the default for a parallelism p is "
            f"compute_default_max_parallelism(p), at least {DEFAULT_LOWER_BOUND_MAX_PARALLELISM})"
        )
    return value


def check_parallelism(max_parallelism: int, parallelism: int) -> None:
    """Check ``max_parallelism`` and that ``parallelism`` is in ``1..max_parallelism``."""
    max_p = check_max_parallelism(max_parallelism)
    if not _is_int(parallelism):
        raise InvalidParallelism(
            f"parallelism must be an int, got {type(parallelism).__name__} {parallelism!r}: "
            f"pass a whole number in 1..{max_p}"
        )
    if parallelism < 1:
        raise InvalidParallelism(
            f"parallelism {parallelism} is below 1: choose a parallelism in 1..{max_p}"
        )
    if parallelism > max_p:
        raise InvalidParallelism(
            f"parallelism {parallelism} exceeds max parallelism {max_p}: raise max parallelism "
            f"with an offline rescale, or choose at most {max_p}"
        )


def _check_key_group(key_group: int, max_parallelism: int) -> None:
    if not _is_int(key_group) or not 0 <= key_group < max_parallelism:
        raise KeyGroupOutOfRange(
            f"key group {key_group!r} is outside 0..{max_parallelism - 1} for max parallelism "
            f"{max_parallelism}: compute it with assign_to_key_group(key, {max_parallelism})"
        )


# Backends call the scalar functions once per record and stream keys repeat, so a bounded cache of
# murmur results turns the costliest step into a lookup (a miss costs ~25% more than no cache).
# typed: 1.0 == 1 must not hit the cache entry of 1 (murmur_hash rejects floats).
_cached_murmur_hash = functools.lru_cache(maxsize=1 << 16, typed=True)(murmur_hash)


def compute_key_group_for_key_hash(key_hash: int, max_parallelism: int) -> int:
    """The key group of a key whose :func:`~state_engine.hashing.key_hash` is ``key_hash``."""
    if type(max_parallelism) is not int or not 0 < max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        max_parallelism = check_max_parallelism(max_parallelism)
    return _cached_murmur_hash(key_hash) % max_parallelism


def assign_to_key_group(key: object, max_parallelism: int) -> int:
    """The key group (``0..max_parallelism-1``) of ``key``; Flink's ``assignToKeyGroup``."""
    if type(max_parallelism) is not int or not 0 < max_parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        max_parallelism = check_max_parallelism(max_parallelism)
    return _cached_murmur_hash(key_hash(key)) % max_parallelism


def clear_caches() -> None:
    """Drop the cached string hashes and murmur results (for benchmarks and memory pressure)."""
    java_string_hash.cache_clear()
    _cached_murmur_hash.cache_clear()


def compute_key_group_range_for_operator_index(
    max_parallelism: int, parallelism: int, operator_index: int
) -> KeyGroupRange:
    """The contiguous key groups that subtask ``operator_index`` of ``parallelism`` owns."""
    check_parallelism(max_parallelism, parallelism)
    if not _is_int(operator_index) or not 0 <= operator_index < parallelism:
        raise InvalidParallelism(
            f"operator index {operator_index!r} is outside 0..{parallelism - 1} for parallelism "
            f"{parallelism}: subtasks are numbered from 0"
        )
    max_p, p, i = int(max_parallelism), int(parallelism), int(operator_index)
    return KeyGroupRange((i * max_p + p - 1) // p, ((i + 1) * max_p - 1) // p)


def compute_operator_index_for_key_group(
    max_parallelism: int, parallelism: int, key_group: int
) -> int:
    """The subtask (``0..parallelism-1``) that owns ``key_group``."""
    check_parallelism(max_parallelism, parallelism)
    _check_key_group(key_group, int(max_parallelism))
    return int(key_group) * int(parallelism) // int(max_parallelism)


def compute_default_max_parallelism(parallelism: int) -> int:
    """Flink's default: ``p + p // 2`` rounded up to a power of two, clamped to 128..32768."""
    if not _is_int(parallelism) or not 1 <= parallelism <= UPPER_BOUND_MAX_PARALLELISM:
        raise InvalidParallelism(
            f"parallelism {parallelism!r} is outside 1..{UPPER_BOUND_MAX_PARALLELISM}, the "
            "parallelisms Flink (and this engine) support: choose a whole number in that range"
        )
    x = int(parallelism) + int(parallelism) // 2
    rounded = 1 << (x - 1).bit_length()
    return min(max(rounded, DEFAULT_LOWER_BOUND_MAX_PARALLELISM), UPPER_BOUND_MAX_PARALLELISM)


# --- RocksDB key-group prefix ---


def key_group_prefix_length(max_parallelism: int) -> int:
    """Bytes of the key-group prefix: 1 when ``max_parallelism <= 128``, else 2."""
    max_p = check_max_parallelism(max_parallelism)
    return 1 if max_p <= DEFAULT_LOWER_BOUND_MAX_PARALLELISM else 2


def key_group_prefix(key_group: int, max_parallelism: int) -> bytes:
    """The big-endian key-group prefix that Flink's RocksDB backend puts before each key."""
    length = key_group_prefix_length(max_parallelism)
    _check_key_group(key_group, int(max_parallelism))
    return int(key_group).to_bytes(length, "big")


def key_group_from_prefix(data: bytes | bytearray | memoryview, max_parallelism: int) -> int:
    """The key group encoded at the start of a RocksDB key written with :func:`key_group_prefix`."""
    length = key_group_prefix_length(max_parallelism)
    if len(data) < length:
        raise InvalidKeyGroupPrefix(
            f"{len(data)} byte(s) cannot hold the {length}-byte key-group prefix of max "
            f"parallelism {max_parallelism}: the data is not a key written by this backend"
        )
    key_group = int.from_bytes(bytes(data[:length]), "big")
    if key_group >= max_parallelism:
        raise KeyGroupOutOfRange(
            f"prefix holds key group {key_group}, outside 0..{max_parallelism - 1}: the data was "
            f"written with a different max parallelism than {max_parallelism}"
        )
    return key_group


# --- vectorised ---


def key_groups_for_hashes(hashes: npt.ArrayLike, max_parallelism: int) -> npt.NDArray[np.int32]:
    """:func:`compute_key_group_for_key_hash` of every hash, as an int32 array."""
    max_p = check_max_parallelism(max_parallelism)
    return murmur_hash_array(hashes) % np.int32(max_p)


def assign_to_key_groups(keys: Any, max_parallelism: int) -> npt.NDArray[np.int32]:
    """Key group of every key, int32; takes any ``keys`` that :func:`.hashing.key_hashes` takes."""
    max_p = check_max_parallelism(max_parallelism)
    return murmur_hash_array(key_hashes(keys)) % np.int32(max_p)


def operator_indexes_for_key_groups(
    key_groups: npt.ArrayLike, max_parallelism: int, parallelism: int
) -> npt.NDArray[np.int32]:
    """:func:`compute_operator_index_for_key_group` of every key group, as an int32 array."""
    check_parallelism(max_parallelism, parallelism)
    max_p, p = int(max_parallelism), int(parallelism)
    kg = np.asarray(key_groups)
    if kg.dtype.kind not in "iu":
        raise KeyGroupOutOfRange(
            f"key groups must be an integer array, got dtype {kg.dtype}: pass the output of "
            "assign_to_key_groups"
        )
    if kg.size and (int(kg.min()) < 0 or int(kg.max()) >= max_p):
        raise KeyGroupOutOfRange(
            f"key groups span {int(kg.min())}..{int(kg.max())}, outside 0..{max_p - 1} for max "
            f"parallelism {max_p}: compute them with assign_to_key_groups(keys, {max_p})"
        )
    return (kg.astype(np.int64) * p // max_p).astype(np.int32)
