"""One spelling per concept: snapshot kind, format and status are the enums of
``state_engine.snapshot_enums``, stored in the catalog as the same strings as before."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from state_engine.catalog import Catalog
from state_engine.catalog.models import (
    RETAINED_STATUSES,
    SNAPSHOT_FORMATS,
    SNAPSHOT_KINDS,
    SNAPSHOT_STATUSES,
)
from state_engine.snapshot_enums import (
    FORMAT_OPTIONS,
    SnapshotFormat,
    SnapshotKind,
    SnapshotStatus,
)

REPO = Path(__file__).resolve().parents[2]
# FAILED is also a maintenance run's status: left out so run code may spell it
SNAPSHOT_WORDS = {*SnapshotKind, *SnapshotFormat, *SnapshotStatus} - {SnapshotStatus.FAILED}
SPELLED_BY = {"kind", "format", "status", "statuses"}


def literal_spellings(source: str) -> list[int]:
    """Lines where ``source`` compares to, or passes as kind/format/status, a snapshot word
    written as a string literal (``x.kind == "SAVEPOINT"``, ``status in ("PENDING", ...)``,
    ``list_snapshots(job, status="COMPLETED")``)."""

    def words(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in SNAPSHOT_WORDS
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(words(e) for e in node.elts)
        return False

    def spelled(node: ast.AST) -> bool:  # x.kind, status, ... (not Flink's REST "status")
        if isinstance(node, ast.Attribute):
            return node.attr in SPELLED_BY
        return isinstance(node, ast.Name) and node.id in SPELLED_BY

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(words(n) for n in operands) and any(spelled(n) for n in operands):
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg in SPELLED_BY and words(node.value):
            lines.append(node.value.lineno)
    return sorted(lines)


def test_the_checker_sees_literal_spellings() -> None:
    source = "\n".join(
        [
            'a = s.kind == "SAVEPOINT"',
            'b = s.status in ("PENDING", "COMPLETED")',
            'c = catalog.list_snapshots(job, status="COMPLETED")',
            'd = "NATIVE" != s.format',
            "e = s.kind is SnapshotKind.SAVEPOINT",
            'f = run.status == "FAILED"',
            'g = kind != "CHECKPOINT"',
            'h = answer.get("status") == "COMPLETED"',
        ]
    )
    assert literal_spellings(source) == [1, 2, 3, 4, 7]


def test_no_module_spells_a_snapshot_kind_format_or_status_as_a_string() -> None:
    paths = [p for d in ("state_engine", "plugins", "dags") for p in (REPO / d).rglob("*.py")]
    found = [
        f"{p.relative_to(REPO)}:{line}"
        for p in sorted(paths)
        if p.name != "snapshot_enums.py"
        for line in literal_spellings(p.read_text())
    ]
    assert found == [], "use SnapshotKind / SnapshotFormat / SnapshotStatus:\n" + "\n".join(found)


def test_the_catalog_columns_hold_the_same_strings_as_before() -> None:
    assert SNAPSHOT_KINDS == ("CHECKPOINT", "SAVEPOINT")
    assert SNAPSHOT_FORMATS == ("CANONICAL", "DELTA", "NATIVE")
    assert SNAPSHOT_STATUSES == ("PENDING", "COMPLETED", "FAILED", "SUBSUMED", "DISCARDED")
    assert RETAINED_STATUSES == ("PENDING", "COMPLETED")
    for values in (SNAPSHOT_KINDS, SNAPSHOT_FORMATS, SNAPSHOT_STATUSES, RETAINED_STATUSES):
        assert all(type(v) is str for v in values)  # plain strings in the check constraints


def test_records_carry_the_enums_and_compare_equal_to_the_stored_strings(
    catalog: Catalog,
) -> None:
    catalog.register_job("job", max_parallelism=128)
    snap = catalog.begin_snapshot(
        "job", location="file:///x/chk-1", parallelism=1, kind="savepoint", format="delta"
    )
    assert snap.kind is SnapshotKind.SAVEPOINT and snap.kind == "SAVEPOINT"
    assert snap.format is SnapshotFormat.DELTA and f"{snap.format}" == "DELTA"
    assert snap.status is SnapshotStatus.PENDING
    [listed] = catalog.list_snapshots("job", status=SnapshotStatus.PENDING)
    assert listed == snap
    done = catalog.complete_snapshot(snap.id, snap.version)
    assert done.status is SnapshotStatus.COMPLETED
    raw = catalog.query("SELECT kind, format, status FROM sk_snapshots").rows
    assert [tuple(r) for r in raw] == [("SAVEPOINT", "DELTA", "COMPLETED")]


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("canonical", SnapshotFormat.CANONICAL),
        ("DELTA", SnapshotFormat.DELTA),
        ("Native", SnapshotFormat.NATIVE),
        ("parquet", None),
        (None, None),
    ],
)
def test_configuration_spells_formats_in_lower_case(
    option: object, expected: SnapshotFormat | None
) -> None:
    assert SnapshotFormat.from_option(option) is expected
    assert FORMAT_OPTIONS == ("canonical", "native", "delta")
    assert SnapshotFormat.DELTA.option == "delta"


def test_the_enums_module_is_a_leaf() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, state_engine.snapshot_enums, state_engine.parallelism_limits\n"
            "print(sorted(m for m in sys.modules if m.startswith('state_engine')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == (
        "['state_engine', 'state_engine.parallelism_limits', 'state_engine.snapshot_enums']"
    )
