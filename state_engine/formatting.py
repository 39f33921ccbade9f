"""Text for people: byte sizes, terminal-safe strings and aligned tables (statectl, the demo,
``verify`` and the plugin's pages all use these, so a size reads the same everywhere).

A leaf module: it imports nothing heavy and of Statekeeper only the snapshot enums.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from state_engine.snapshot_enums import SnapshotFormat

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")
# bidi overrides and isolates reorder what follows them on the terminal: shown escaped, too
_BIDI = {0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}
#: Table columns that hold byte counts; statectl shows them as sizes (``--json`` keeps bytes).
BYTE_COLUMNS = frozenset(
    {"bytes", "size", "bytes_in", "bytes_out", "shared_bytes", "bytes_checked", "total_bytes"}
)


def human_bytes(n: int | float | None) -> str:
    """``n`` bytes in binary units with one decimal: ``512 B``, ``1.3 MiB``; None is ``-``."""
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{int(n)} B"
    value = float(n)
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def is_control(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code < 0xA0 or code in _BIDI


def escape_control(text: str) -> str:
    """``text`` with control characters (escape sequences, newlines, bidi overrides) shown as
    ``\\xNN`` escapes: a catalog string must not move the cursor or clear the terminal."""
    if not any(is_control(ch) for ch in text):
        return text
    return "".join(_escape_char(ch) if is_control(ch) else ch for ch in text)


def cell_text(value: Any) -> str:
    """One value as table text (not yet escaped)."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def format_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    width: int | None = None,
    sizes: Collection[str] = (),
) -> str:
    """Aligned columns, numbers right-aligned; control characters escaped; cells longer than
    ``width`` cut with an ellipsis; columns named in ``sizes`` shown as byte sizes."""
    size_at = [c in sizes for c in columns]

    def cell(value: Any, i: int) -> str:
        text = human_bytes(value) if size_at[i] and _is_number(value) else cell_text(value)
        text = escape_control(text)
        if width is not None and len(text) > width:
            text = text[: width - 1] + "…"
        return text

    cells = [[cell(v, i) for i, v in enumerate(row)] for row in rows]
    heads = [escape_control(str(c)) for c in columns]
    widths = [len(c) for c in heads]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    numeric = [
        any(r[i] is not None for r in rows) and all(_is_number(r[i]) or r[i] is None for r in rows)
        for i in range(len(columns))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    out = [line(heads), line(["-" * w for w in widths])]
    out.extend(line(row) for row in cells)
    if not rows:
        out.append("(no rows)")
    return "\n".join(out)


#: Snapshot formats whose entry counts and per-key-group rows are estimated, not counted: a
#: RocksDB (native) snapshot's figures come from its SST files' metadata, which counts every
#: version and tombstone of a key (a savepoint of it may hold far fewer rows).
ESTIMATED_FORMATS = frozenset({SnapshotFormat.NATIVE})
ESTIMATE_NOTE = "estimated from RocksDB SST metadata (counts versions and tombstones), not counted"
#: an imported snapshot whose state Statekeeper does not decode to count (Flink's native state)
NOT_COUNTED_NOTE = (
    "not counted: this Flink snapshot's native state is not decoded to count it (its bytes "
    "per key group are exact; a canonical savepoint of it counts its entries)"
)
COUNTED, ESTIMATED, NOT_COUNTED = "counted", "estimated", "not-counted"


def entries_basis(snapshot: Any) -> str:
    """Where a snapshot's ``entries`` come from: :data:`COUNTED`, :data:`ESTIMATED` (RocksDB SST
    metadata) or :data:`NOT_COUNTED`. ``snapshot``: a snapshot record (its recorded basis, else
    its format's) or a format."""
    if snapshot is None or isinstance(snapshot, str):
        fmt = snapshot
    else:
        basis = getattr(snapshot, "entries_basis", None)
        if basis in (COUNTED, ESTIMATED, NOT_COUNTED):
            return str(basis)
        if getattr(snapshot, "metadata_format", None) == "flink":
            return NOT_COUNTED  # an import counts only what it says it counted
        fmt = snapshot.format
    return ESTIMATED if str(fmt or "").upper() in ESTIMATED_FORMATS else COUNTED


def is_estimated(snapshot: Any) -> bool:
    """Whether ``snapshot``'s (a record or a format) entries are estimated from SST metadata."""
    return entries_basis(snapshot) == ESTIMATED


def is_not_counted(snapshot: Any) -> bool:
    """Whether ``snapshot``'s (a record or a format) entries were never counted (0 for want of a
    count, not of entries)."""
    return entries_basis(snapshot) == NOT_COUNTED


def entries_note(snapshot: Any) -> str | None:
    """What a reader must know about ``snapshot``'s entry count (None: it is exact)."""
    basis = entries_basis(snapshot)
    return (
        ESTIMATE_NOTE if basis == ESTIMATED else NOT_COUNTED_NOTE if basis == NOT_COUNTED else None
    )


def estimate_text(value: int | float, snapshot: Any) -> str:
    """``value`` with thousands separators, marked ``~`` when ``snapshot`` (a record or a
    format) only estimates it; "not counted" when it never counted it."""
    basis = entries_basis(snapshot)
    if basis == NOT_COUNTED:
        return "not counted"
    text = f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"
    return f"~{text}" if basis == ESTIMATED else text
