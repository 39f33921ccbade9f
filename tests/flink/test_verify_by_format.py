"""Issue 33: verify reads each snapshot with its own format's reader and catches impossible
offsets; an unreadable ``_metadata`` is one FAILED snapshot, not a refused directory; an
imported snapshot's times are Flink's; entry counts say how they were got. On the real Flink
fixtures and both catalog databases."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from state_engine import cli
from state_engine.catalog import Catalog
from state_engine.flink import convert
from state_engine.flink.import_job import import_flink
from state_engine.flink.metadata import read_metadata
from state_engine.formatting import ESTIMATE_NOTE, entries_basis, estimate_text
from state_engine.verify import UNREADABLE, verify
from tests.fixtures.catalog import FakeClock
from tests.flink.conftest import FlinkFixtures


def _url(p: Path) -> str:
    return p.resolve().as_uri()


def _metadata_mtime(directory: Path) -> datetime:
    return datetime.fromtimestamp((directory / "_metadata").stat().st_mtime, UTC)


def test_verify_after_a_conversion_is_consistent(
    catalog: Catalog, flink_fixtures: FlinkFixtures, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A converted savepoint recorded under a Flink job is Statekeeper's format: read as such."""
    monkeypatch.setenv("STATEKEEPER_HOME", str(tmp_path / "home"))
    job_dir = flink_fixtures.java_job("hashmap")
    sp_dir = flink_fixtures.java_savepoints("hashmap")
    import_flink(catalog, [str(job_dir), str(sp_dir)], "fraud")
    source = next(s for s in catalog.list_snapshots("fraud") if s.checkpoint_id == 11)
    report = convert.run(catalog, source.id, savepoint_dir=(tmp_path / "sp").as_uri())
    out = catalog.get_snapshot(report["output_snapshot_id"])
    formats = {s.id: s.metadata_format for s in catalog.list_snapshots("fraud")}
    assert formats.pop(out.id) == "statekeeper"
    assert set(formats.values()) == {"flink"} and len(formats) == 5
    for sync in (False, True):  # the sync DAG's verify is `verify --sync`
        result = verify(catalog, "fraud", sync=sync)
        assert result.ok, result.render()
        assert not result.errors
    # and a sync of the directories after the conversion keeps it consistent
    again = import_flink(catalog, [str(job_dir), str(sp_dir)], "fraud")
    assert not again.added and not again.unreadable
    assert verify(catalog, "fraud").ok


def _flip_operator_state_offset(chk: Path) -> tuple[str, str, int]:
    """Flip the two low bytes of the first operator-state offset of subtask 0 of the first
    operator with operator state, in place; (operator uid, handle name, the flipped offset)."""
    meta = read_metadata(str(chk))
    op, st = next(
        (op, st) for op in meta.operators for st in op.subtasks if st.managed_operator_state
    )
    handle = st.managed_operator_state
    assert handle is not None and handle.delegate is not None
    entry = handle.states[0]
    name = entry.name.encode()
    # the entry as Flink writes it: the name (modified UTF-8), the mode (a byte), the count, the
    # offsets as longs
    tail = struct.pack(">i", len(entry.offsets)) + b"".join(
        struct.pack(">q", o) for o in entry.offsets
    )
    data = bytearray((chk / "_metadata").read_bytes())
    at = data.index(struct.pack(">H", len(name)) + name)
    pos = at + 2 + len(name) + 1
    assert bytes(data[pos : pos + len(tail)]) == tail
    offset_at = pos + 4
    data[offset_at + 6] ^= 0xFF
    data[offset_at + 7] ^= 0xFF
    stat = (chk / "_metadata").stat()
    (chk / "_metadata").write_bytes(bytes(data))
    os.utime(chk / "_metadata", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (flipped,) = struct.unpack_from(">q", data, offset_at)
    assert flipped != entry.offsets[0]
    assert read_metadata(str(chk)).checkpoint_id == meta.checkpoint_id  # it still parses
    return op.uid, handle.delegate.name, flipped


def test_a_flipped_operator_state_offset_fails_verify_naming_operator_and_handle(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    import_flink(catalog, [str(job_dir)], "flipped")
    assert verify(catalog, "flipped").ok
    uid, handle, flipped = _flip_operator_state_offset(job_dir / "chk-10")
    result = verify(catalog, "flipped")
    assert not result.ok
    (error,) = result.errors
    assert error.kind == "metadata-structure" and error.checkpoint_id == 10
    assert f"operator {uid}" in error.message and handle in error.message
    assert f"offset {flipped}" in error.message and "\n" not in error.message
    # imported as it is now, the same _metadata is a FAILED snapshot saying why
    report = import_flink(catalog, [str(flink_copy(flink_fixtures.java_job("rocksdb")))], "other")
    assert not report.unreadable
    other = flink_copy(flink_fixtures.java_savepoints("hashmap"))
    sp = other / "savepoint-24b66e-d8d099a6f7d1"
    uid, handle, _ = _flip_operator_state_offset(sp)
    report = import_flink(catalog, [str(other)], "sp")
    (bad,) = report.unreadable
    assert bad["location"] == _url(sp) and bad["recorded"] and bad["checkpoint_id"] == 5
    assert f"operator {uid}" in bad["reason"] and handle in bad["reason"]
    assert [a["checkpoint_id"] for a in report.added] == [9]


def test_a_truncated_metadata_is_one_failed_snapshot_and_the_others_import(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    job_dir = flink_copy(flink_fixtures.java_job("hashmap"))
    meta = job_dir / "chk-11" / "_metadata"
    whole = meta.read_bytes()
    meta.write_bytes(whole[:1000])
    report = import_flink(catalog, [str(job_dir)], "partial")
    assert sorted(a["checkpoint_id"] for a in report.added) == [8, 10]
    (bad,) = report.unreadable
    assert (bad["checkpoint_id"], bad["location"], bad["recorded"]) == (
        11,
        _url(job_dir / "chk-11"),
        True,
    )
    assert "chk-11/_metadata: at byte offset" in bad["reason"]
    text = report.render()
    assert "1 unreadable" in text and f"x {_url(job_dir / 'chk-11')} unreadable" in text
    failed = catalog.get_snapshot(bad["snapshot_id"])
    assert failed.status == "FAILED" and "chk-11/_metadata: at byte offset" in (failed.error or "")
    result = verify(catalog, "partial")
    assert result.ok, result.render()  # the catalog says what storage holds
    (line,) = [f for f in result.findings if f.level == UNREADABLE]
    assert line.checkpoint_id == 11 and "not restorable" in line.message
    assert not [f for f in result.findings if f.path and "chk-11" in f.path and f is not line]
    assert "1 FAILED (unreadable)" in result.render()
    # a sync is idempotent: nothing recorded twice
    rows = len(catalog.list_snapshots("partial"))
    again = import_flink(catalog, [str(job_dir)], "partial")
    assert not again.added and sorted(again.unchanged) == [8, 10]
    assert [(u["snapshot_id"], u["recorded"]) for u in again.unreadable] == [(failed.id, False)]
    assert len(catalog.list_snapshots("partial")) == rows
    # once it reads again, it is imported and its FAILED record discarded
    meta.write_bytes(whole)
    fixed = import_flink(catalog, [str(job_dir)], "partial")
    assert [a["checkpoint_id"] for a in fixed.added] == [11] and not fixed.unreadable
    assert catalog.get_snapshot(failed.id).status == "DISCARDED"
    result = verify(catalog, "partial")
    assert result.ok and not [f for f in result.findings if f.level == UNREADABLE]


def test_an_unreadable_savepoint_directory_is_recorded_and_a_gone_one_discarded(
    catalog: Catalog, flink_fixtures: FlinkFixtures, flink_copy: Callable[[Path], Path]
) -> None:
    alone = flink_copy(flink_fixtures.java_savepoints("hashmap")) / "savepoint-24b66e-1f90111708b1"
    (alone / "_metadata").write_bytes((alone / "_metadata").read_bytes()[:600])
    report = import_flink(catalog, [str(alone)], "one")  # a savepoint directory on its own
    (bad,) = report.unreadable
    assert bad["checkpoint_id"] == 9 and bad["recorded"]  # the id from the file's header
    assert catalog.get_snapshot(bad["snapshot_id"]).kind == "SAVEPOINT"
    assert verify(catalog, "one").ok
    # a directory of savepoints: the good one imports beside the bad one
    sp_dir = flink_copy(flink_fixtures.java_savepoints("rocksdb"))
    broken = sp_dir / "savepoint-0cf791-72b072c25cc0"
    (broken / "_metadata").write_bytes((broken / "_metadata").read_bytes()[:600])
    many = import_flink(catalog, [str(sp_dir)], "many")
    assert [a["checkpoint_id"] for a in many.added] == [5]
    assert [u["checkpoint_id"] for u in many.unreadable] == [9]
    shutil.rmtree(broken)
    gone = import_flink(catalog, [str(sp_dir)], "many")
    assert [v["checkpoint_id"] for v in gone.vanished] == [9] and not gone.unreadable
    assert verify(catalog, "many").ok


def test_an_imported_snapshot_completed_when_flink_wrote_its_metadata(
    catalog: Catalog, flink_fixtures: FlinkFixtures, clock: FakeClock
) -> None:
    job_dir = flink_fixtures.java_job("rocksdb")
    sp_dir = flink_fixtures.java_savepoints("rocksdb")
    import_flink(catalog, [str(job_dir), str(sp_dir)], "times")
    snaps = catalog.list_snapshots("times")
    assert len(snaps) == 5
    for snap in snaps:
        expected = _metadata_mtime(Path(snap.location.removeprefix("file://")))
        assert snap.completed_at is not None and snap.imported_at is not None
        assert abs((snap.completed_at - expected).total_seconds()) < 1e-3, snap
        assert snap.imported_at == clock.now  # the import's own time, kept apart
        assert snap.duration_ms is None  # Flink's, unknown here
    # the size chart over those times: a point per distinct completion, no repeated label
    from statekeeper_airflow.charts import PLOT_H, TOP, Series, line_chart

    history = catalog.state_size_history("times")
    points = sorted({(p.completed_at, float(p.bytes)) for p in history if p.completed_at})
    svg = line_chart(
        [Series("total", points)], element_id="c", title="t", y_label=lambda v: f"{v:.0f}"
    )
    xs = re.findall(r'<circle cx="([0-9.]+)"', svg)
    assert len(set(xs)) == len({t for t, _ in points}) == 4  # two share their second
    labels = re.findall(rf'y="{TOP + PLOT_H + 18}" text-anchor="\w+">([^<]+)</text>', svg)
    assert labels and len(labels) == len(set(labels)), labels
    assert all(len(label) == len("01:54:39") for label in labels)  # seconds over a short span


def test_entry_counts_say_how_they_were_got(
    catalog: Catalog,
    flink_fixtures: FlinkFixtures,
    catalog_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import_flink(
        catalog,
        [str(flink_fixtures.java_job("hashmap")), str(flink_fixtures.java_savepoints("hashmap"))],
        "hm",
    )
    import_flink(catalog, [str(flink_fixtures.java_job("rocksdb"))], "rocks")
    by_id = {s.checkpoint_id: s for s in catalog.list_snapshots("hm")}
    canonical = by_id[5]
    assert (canonical.format, entries_basis(canonical)) == ("CANONICAL", "counted")
    assert canonical.entries > 0 and estimate_text(canonical.entries, canonical) == (
        f"{canonical.entries:,}"
    )
    natives = [s for s in catalog.list_snapshots("hm") + catalog.list_snapshots("rocks")]
    natives = [s for s in natives if s.format == "NATIVE"]
    assert len(natives) == 7
    for snap in natives:  # hashmap and RocksDB state that nothing decoded to count
        assert snap.bytes > 0 and entries_basis(snap) == "not-counted"
        assert estimate_text(snap.entries, snap) == "not counted"
    # a Statekeeper native snapshot's count is an estimate from its SSTs, and says so
    assert estimate_text(12, "NATIVE") == "~12" and entries_basis("NATIVE") == "estimated"
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)  # the CLI on the same catalog
    for job in ("hm", "rocks"):
        assert cli.main(["snapshots", job]) == 0
        out = capsys.readouterr().out
        assert "~0" not in out and ESTIMATE_NOTE not in out and "not counted" in out
    assert cli.main(["snapshots", "hm", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["checkpoint_id"]: r["entries_basis"] for r in rows}[5] == "counted"
    assert cli.main(["show", str(natives[0].id)]) == 0
    assert "not counted" in capsys.readouterr().out
