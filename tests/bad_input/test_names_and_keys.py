"""Names and keys from users: path traversal refused before anything is written, SQL
metacharacters stored and returned intact, unicode keys through both backends, a checkpoint and
a restore."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from state_engine.catalog import Catalog
from state_engine.checkpoint import HeapBackendFactory, RocksDBBackendFactory
from state_engine.cli import main
from state_engine.errors import InvalidJobName, InvalidSnapshotPath
from state_engine.examples import fraud
from state_engine.keygroups import assign_to_key_group
from state_engine.runtime import (
    CollectedOutput,
    CollectSink,
    Context,
    GeneratorSource,
    Job,
    JobRunner,
    KeyedProcessFunction,
    RecordTimestampClock,
    RuntimeContext,
    WatermarkStrategy,
)
from state_engine.state import MapStateDescriptor, ValueStateDescriptor

SQL = "'; DROP TABLE sk_jobs; --"


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


@pytest.mark.parametrize("name", ["../evil", "a/../../b", "..", "x/../../../tmp/evil", "a\\b"])
def test_a_job_name_that_could_leave_the_checkpoint_root_is_refused(
    tmp_path: Path, catalog: Catalog, name: str
) -> None:
    (tmp_path / "root").mkdir()
    before = _files(tmp_path)
    job = fraud.build_job(1, checkpoint_every=100, name=name, records_per_partition=50)
    with pytest.raises(InvalidJobName, match="could leave the checkpoint root"):
        JobRunner(job, catalog=catalog, storage=(tmp_path / "root").as_uri()).run()
    assert _files(tmp_path) - before <= {"catalog.db-journal"}
    assert [j.name for j in catalog.list_jobs()] == []  # nothing registered either


def test_a_savepoint_directory_that_climbs_out_is_refused(tmp_path: Path, catalog: Catalog) -> None:
    job = fraud.build_job(1, checkpoint_every=None, records_per_partition=50)
    runner = JobRunner(job, catalog=catalog, storage=(tmp_path / "root").as_uri())
    runner.run_until(20, kill=False)
    with pytest.raises(InvalidSnapshotPath, match="'..' component"):
        runner.savepoint("../../escaped")
    runner.kill()
    assert not (tmp_path / "escaped").exists() and not (tmp_path.parent / "escaped").exists()


def test_sql_metacharacters_land_in_the_catalog_and_come_back_intact(
    tmp_path: Path, catalog: Catalog, catalog_url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A job name may hold them (it is printable and stays in its directory): registered directly
    it round-trips; a state name with them goes through a checkpoint."""
    catalog.register_job(SQL, max_parallelism=128)
    assert catalog.get_job(SQL).name == SQL

    class Quoted(KeyedProcessFunction):
        def open(self, ctx: RuntimeContext) -> None:
            self.seen = ctx.get_state(ValueStateDescriptor(SQL, int, default=0))

        def process(self, record: Any, ctx: Context) -> None:
            self.seen.update(self.seen.value() + 1)
            ctx.output([ctx.current_key, self.seen.value()])

    def job(p: int) -> Job:
        def record(part: int, i: int, rng: Any) -> dict[str, Any]:
            return {"k": f"k{i % 5}", "ts": i}

        source = GeneratorSource(2, 30, record, watermarks=WatermarkStrategy("ts"))
        return Job("quoted", source, lambda r: r["k"], Quoted(), CollectSink(target),
                   parallelism=p, checkpoint_interval_records=20)  # fmt: skip

    target = CollectedOutput()
    storage = (tmp_path / "ck").as_uri()
    JobRunner(job(2), catalog=catalog, storage=storage).run_until(45)
    with JobRunner(job(1), catalog=catalog, storage=storage, restore_from="latest") as r:
        r.run()
        counts = {}
        for row in r.state_entries():
            if row.state == SQL:
                counts[row.key] = row.value
    assert len(counts) == 5  # every key's count under the quoted state name survived
    assert sorted(v for _, v in target.records if _ == "k0")[-1] == 12
    assert SQL in {s.name for s in catalog.list_states("quoted")}
    monkeypatch.setenv("STATEKEEPER_CATALOG_URL", catalog_url)
    assert main(["jobs", "--json"]) == 0
    names = {j["name"] for j in json.loads(capsys.readouterr().out)}
    assert names == {SQL, "quoted"}  # and sk_jobs is still there to be listed


# --- unicode keys ---

KEYS = [
    "😀x",  # NOTES.md: key group 60 at max parallelism 128, as Flink computes it
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",  # astral plane: UTF-16 surrogate pairs in the Java hash
    "שלום עולם",  # right-to-left
    "مرحبا\u200f",  # Arabic with a right-to-left mark
    "e\u0301",  # combining accent (not normalized: a different key from "é")
    "é",
    "👩‍👩‍👧‍👦",  # a zero-width-joiner sequence
    "",
    "\U0010fffd",
]


class PerKey(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int, default=0))
        self.tags = ctx.get_state(MapStateDescriptor("tags", str, str))

    def process(self, record: Any, ctx: Context) -> None:
        n = self.count.value() + 1
        self.count.update(n)
        self.tags.put(record["tag"], ctx.current_key)
        ctx.output({"key": ctx.current_key, "n": n})


def _unicode_job(p: int, backend: Any, target: CollectedOutput) -> Job:
    def record(part: int, i: int, rng: Any) -> dict[str, Any]:
        key = KEYS[(part + i) % len(KEYS)]
        return {"key": key, "tag": f"{key}·{i % 4}", "ts": i}

    source = GeneratorSource(1, 90, record, watermarks=WatermarkStrategy("ts"))
    return Job("unicode", source, lambda r: r["key"], PerKey(), CollectSink(target),
               parallelism=p, backend=backend, clock=RecordTimestampClock(),
               checkpoint_interval_records=40)  # fmt: skip


@pytest.fixture(params=[("heap", "rocksdb"), ("rocksdb", "heap")], ids=lambda p: "->".join(p))
def backends(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    def make(kind: str, sub: str) -> Any:
        return HeapBackendFactory() if kind == "heap" else RocksDBBackendFactory(tmp_path / sub)

    yield make(request.param[0], "a"), make(request.param[1], "b")


def test_unicode_keys_through_both_backends_a_checkpoint_and_a_restore(
    tmp_path: Path, catalog: Catalog, backends: tuple[Any, Any]
) -> None:
    assert assign_to_key_group("😀x", 128) == 60
    target = CollectedOutput()
    storage = (tmp_path / "ck").as_uri()
    first, second = backends
    JobRunner(_unicode_job(2, first, target), catalog=catalog, storage=storage).run_until(60)
    with JobRunner(_unicode_job(3, second, target), catalog=catalog, storage=storage,
                   restore_from="latest") as r:  # fmt: skip
        r.run()
        state = {(e.key, e.user_key) for e in r.state_entries() if e.state == "tags"}
    finals: dict[str, int] = {}
    for rec in target.records:
        finals[rec["key"]] = max(finals.get(rec["key"], 0), rec["n"])
    assert finals == {k: 10 for k in KEYS}  # every key, every record, exactly once
    assert sorted(target.records, key=lambda r: (r["key"], r["n"])) == [
        {"key": k, "n": n} for k in sorted(KEYS) for n in range(1, 11)
    ]
    assert len(state) == 4 * len(KEYS)  # 4 map entries per key
    assert {key.decode() for key, _ in state} == set(KEYS)  # every key's bytes intact
