"""Rewrite runs of Flink jobs (rescale, TTL cleanup, ``statectl flink rewrite``): what is checked
before any Spark session starts, how the output savepoint is committed to the catalog, and how
to restore it.

:func:`prepare` turns a run's params into a checked :class:`FlinkRewrite` (the source snapshot,
its ``_metadata``, the writer's plan) or refuses with one line. :func:`commit_savepoint` records
a written savepoint the way ``statectl flink import`` records one Flink wrote, so verify,
retention and ``state show`` treat it alike. The Spark job is ``state_engine.jobs.flink_rewrite``;
the rules are in docs/operations.md ("Rewriting Flink savepoints").
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from state_engine.catalog import Catalog, KeyGroupStatRow, SnapshotRecord
from state_engine.config import Settings
from state_engine.errors import (
    InvalidJobParams,
    NoSuchJob,
    NoSuchSnapshot,
    SnapshotNotUsable,
    StatekeeperError,
)
from state_engine.flink.import_job import file_groups, key_group_bytes, operator_key
from state_engine.flink.keyed_state import catalog_flink_metadata
from state_engine.flink.metadata import FlinkSnapshotMetadata, metadata_from_bytes
from state_engine.flink.rewrite import RewriteOptions, RewritePlan, RewriteRefused, plan_rewrite
from state_engine.keygroups import UPPER_BOUND_MAX_PARALLELISM
from state_engine.maintenance.job_storage import storage_for
from state_engine.maintenance.output import OutputSnapshot
from state_engine.maintenance.preflight import allowed_roots, snapshot_of_job, whole_number
from state_engine.snapshot.storage import FileStore, SnapshotDir, canonical_url
from state_engine.snapshot_enums import SnapshotStatus

__all__ = [
    "REWRITE_KINDS",
    "FlinkRewrite",
    "commit_savepoint",
    "is_flink_job",
    "prepare",
    "restore_instructions",
    "rewrite_options",
]

#: The maintenance kinds that rewrite a Flink job's snapshot into a Flink savepoint.
REWRITE_KINDS = ("rescale", "ttl_cleanup", "flink_rewrite")


@dataclass(frozen=True)
class FlinkRewrite:
    """A checked rewrite: the source snapshot, its ``_metadata``, the options and the plan."""

    job: str
    source: SnapshotRecord
    meta: FlinkSnapshotMetadata
    options: RewriteOptions
    plan: RewritePlan
    parallelism: int
    max_parallelism: int

    @property
    def max_parallelism_changes(self) -> bool:
        return self.max_parallelism != self.source.max_parallelism


def is_flink_job(catalog: Catalog, job: Any) -> bool:
    """Whether ``job`` names a catalog job of origin flink (False for unknown names)."""
    if not isinstance(job, str) or not job:
        return False
    try:
        return catalog.get_job(job).origin == "flink"
    except NoSuchJob:
        return False


def targets_flink(catalog: Catalog, kind: str, params: Mapping[str, Any]) -> bool:
    """Whether a ``kind`` run with ``params`` is a rewrite of a Flink job's snapshot."""
    if kind == "flink_rewrite":
        return True
    if kind not in REWRITE_KINDS:
        return False
    if params.get("job") is not None:
        return is_flink_job(catalog, params["job"])
    try:
        snap = catalog.get_snapshot(int(params["snapshot"]))
    except (StatekeeperError, KeyError, TypeError, ValueError):
        return False
    return is_flink_job(catalog, snap.job)


def _pairs(items: Any, what: str, example: str) -> list[tuple[str, str]]:
    if items is None:
        return []
    if isinstance(items, Mapping):
        return [(str(k), str(v)) for k, v in items.items()]
    if isinstance(items, str):
        items = [items]
    out = []
    for item in items:
        name, sep, value = str(item).partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidJobParams(f"{what} {item!r} is not NAME=VALUE; write it as {example}")
        out.append((name.strip(), value.strip()))
    return out


def _names(items: Any) -> tuple[str, ...]:
    if items is None:
        return ()
    if isinstance(items, str):
        items = [items]
    return tuple(str(i).strip() for i in items if str(i).strip())


def rewrite_options(kind: str, params: Mapping[str, Any]) -> RewriteOptions:
    """The writer's options of a ``kind`` run's params; bad values refused with one line."""
    ttl = {}
    for state, ms in _pairs(params.get("ttl"), "--ttl", "STATE=MS, e.g. lastSeen=3600000"):
        ttl[state] = whole_number(ms, f"the TTL of state {state!r} (ms)", 1)
    uids = dict(_pairs(params.get("uid"), "--uid", "OLD=NEW, e.g. agg=aggregate-v2"))
    parallelism = params.get("parallelism")
    max_p = params.get("max_parallelism")
    if kind == "rescale" and parallelism is None:
        raise InvalidJobParams("rescale needs the new parallelism: --parallelism N")
    if kind == "ttl_cleanup" and not ttl:
        raise InvalidJobParams(
            "ttl_cleanup of a Flink job needs the TTL of each state to clean: --ttl STATE=MS "
            "(repeatable; a Flink snapshot does not store the TTL)"
        )
    if max_p is not None:
        max_p = whole_number(max_p, "max_parallelism", 1, UPPER_BOUND_MAX_PARALLELISM)
    if parallelism is not None:
        parallelism = whole_number(parallelism, "parallelism", 1, UPPER_BOUND_MAX_PARALLELISM)
    at = params.get("at")
    return RewriteOptions(
        parallelism=parallelism,
        max_parallelism=max_p,
        ttl=ttl,
        at=None if at is None else whole_number(at, "--at (epoch ms)", 0),
        drop_states=_names(params.get("drop_state")),
        drop_operators=_names(params.get("drop_operator")),
        uids=uids,
    )


def _source(catalog: Catalog, kind: str, params: Mapping[str, Any]) -> SnapshotRecord:
    job = params.get("job")
    if job is not None and not is_flink_job(catalog, job):
        try:
            catalog.get_job(job)
        except NoSuchJob:
            raise NoSuchJob(
                f"job {job!r} is not in the catalog; list the jobs with `statectl jobs`"
            ) from None
        raise InvalidJobParams(
            f"job {job!r} is not a Flink job: `statectl flink rewrite` writes Flink savepoints "
            "of jobs imported with `statectl flink import`"
        )
    if params.get("snapshot") is None:
        if job is None:
            raise InvalidJobParams("name the input: --snapshot ID, or --job NAME for its latest")
        for snap in catalog.list_snapshots(job, status=SnapshotStatus.COMPLETED):
            if catalog_flink_metadata(catalog, snap.id) is not None:
                return snap
        raise NoSuchSnapshot(
            f"Flink job {job!r} has no COMPLETED Flink snapshot to {kind.replace('_', ' ')}; "
            f"import its directories with `statectl flink import PATH --job {job}`"
        )
    record = snapshot_of_job(catalog, params["snapshot"], job)
    if not is_flink_job(catalog, record.job):
        raise InvalidJobParams(
            f"snapshot {record.id} is of job {record.job!r}, which is not a Flink job: rewrite "
            "snapshots of jobs imported with `statectl flink import`"
        )
    if record.status is not SnapshotStatus.COMPLETED:
        raise SnapshotNotUsable(
            f"snapshot {record.id} of job {record.job!r} is {record.status}, not COMPLETED; only "
            f"completed snapshots are rewritten: pick one from `statectl snapshots {record.job}`"
        )
    return record


def output_url(catalog: Catalog, job: str, directory: str, settings: Settings) -> str:
    """The URL a ``--savepoint-dir`` names (a URL, or a path under the job's root)."""
    if not isinstance(directory, str) or not directory.strip():
        raise InvalidJobParams(
            f"savepoint_dir {directory!r} is empty; leave it out for the default"
        )
    if "://" in directory or directory.startswith("/"):
        return canonical_url(directory)
    try:
        return canonical_url(storage_for(catalog, job, settings).url_of(directory))
    except StatekeeperError as exc:
        raise InvalidJobParams(f"savepoint_dir {directory!r}: {exc}") from None


def check_output_dir(catalog: Catalog, job: str, directory: str, settings: Settings) -> str:
    """Refuse an output directory that exists, lies inside (or holds) another snapshot or a
    directory Flink writes to, or is outside the job's storage roots; returns its URL."""
    url = output_url(catalog, job, directory, settings)
    roots = allowed_roots(catalog, job, settings)
    if not any(url == r or url.startswith(r + "/") for r in roots):
        raise InvalidJobParams(
            f"savepoint_dir {directory!r} is outside job {job!r}'s storage roots "
            f"({', '.join(roots[:2])}); use a path under them, or add its parent to "
            "STATEKEEPER_ALLOWED_SAVEPOINT_DIRS (comma-separated URLs)"
        )
    store, path = FileStore.at(url)
    if store.exists(path):
        raise InvalidJobParams(
            f"savepoint_dir {url} exists; a rewrite writes a new directory of its own: name one "
            "that does not exist yet (or leave it out for the default)"
        )
    inside = catalog.snapshots_under(url)
    if inside:
        raise InvalidJobParams(
            f"savepoint_dir {url} holds snapshot {inside[0].id} of job {inside[0].job!r}; name "
            "a new directory outside every snapshot"
        )
    scheme, sep, rest = url.partition("://")
    parent = rest
    while "/" in parent.strip("/"):
        parent = posixpath.dirname(parent.rstrip("/"))
        here = f"{scheme}{sep}{parent}"
        owner = catalog.directory_owner(here)
        if owner is not None:
            raise InvalidJobParams(
                f"savepoint_dir {url} lies inside {here}, a directory Flink job {owner!r} "
                "writes (imported with `statectl flink import`); its retention would delete "
                "the savepoint: name a directory outside it"
            )
        for snap in catalog.snapshots_under(here):
            if canonical_url(snap.location) == here:
                raise InvalidJobParams(
                    f"savepoint_dir {url} lies inside snapshot {snap.id} of job {snap.job!r} "
                    f"({here}); name a directory outside every snapshot"
                )
    return url


def prepare(
    catalog: Catalog, kind: str, params: Mapping[str, Any], settings: Settings | None = None
) -> FlinkRewrite:
    """Check a rewrite run's params against the catalog and the source's ``_metadata`` (no Spark,
    nothing written); each refusal is one line saying what was wrong and what to do."""
    settings = settings or Settings.from_env()
    options = rewrite_options(kind, params)
    source = _source(catalog, kind, params)
    meta = catalog_flink_metadata(catalog, source.id)
    if meta is None:
        raise SnapshotNotUsable(
            f"snapshot {source.id} of Flink job {source.job!r} is not a snapshot Flink wrote (a "
            "savepoint converted into Statekeeper's format); rewrite one Flink wrote, listed by "
            f"`statectl snapshots {source.job}`"
        )
    max_p = options.max_parallelism or meta.max_parallelism or source.max_parallelism
    parallelism = options.parallelism or source.parallelism
    if options.parallelism is not None and options.parallelism > max_p:
        raise InvalidJobParams(
            f"parallelism {options.parallelism} is above the max parallelism {max_p} of "
            f"snapshot {source.id}: a subtask owns at least one key group; use at most {max_p}, "
            "or raise --max-parallelism too"
        )
    if params.get("savepoint_dir") is not None:
        check_output_dir(catalog, source.job, str(params["savepoint_dir"]), settings)
    try:
        plan = plan_rewrite(meta, options)
    except RewriteRefused as exc:
        raise InvalidJobParams(str(exc)) from None
    return FlinkRewrite(source.job, source, meta, options, plan, parallelism, max_p)


def restore_instructions(rewrite: FlinkRewrite, location: str) -> dict[str, Any]:
    """How to restore the Flink job from ``location``, and what must change in the job first."""
    where = location[len("file://") :] if location.startswith("file://") else location
    opts = rewrite.options
    p = f" -p {opts.parallelism}" if opts.parallelism is not None else ""
    lenient = bool(opts.drop_states or opts.drop_operators or opts.uids)
    flags = " --allowNonRestoredState" if lenient else ""
    out: dict[str, Any] = {
        "command": f"flink run -s {where}{flags}{p} <your job>",
        "config": f"execution.state-recovery.path: {where}",
        "warnings": [],
    }
    if lenient:
        out["config"] += "\nexecution.state-recovery.ignore-unclaimed-state: true"
    if rewrite.max_parallelism_changes:
        out["warnings"].append(
            f"the job's max parallelism must change to {rewrite.max_parallelism} (from "
            f"{rewrite.source.max_parallelism}) before this restore: set "
            f"env.setMaxParallelism({rewrite.max_parallelism}) or pipeline.max-parallelism: "
            f"{rewrite.max_parallelism}; Flink refuses a max parallelism mismatch"
        )
    if opts.uids:
        renamed = ", ".join(f"{a} -> {b}" for a, b in opts.uids.items())
        out["warnings"].append(f"the job's operators must carry their new uids: {renamed}")
    return out


def restore_lines(restore: Mapping[str, Any]) -> list[str]:
    """The restore instructions as lines for people (the CLI, the run's log)."""
    lines = [f"restore with: {restore['command']}", f"  or set {restore['config']}"]
    lines.extend(f"warning: {w}" for w in restore.get("warnings", ()))
    return lines


def _metadata_location(snap: SnapshotDir) -> str:
    url = snap.metadata_url
    return snap.store.path_of(url) if snap.store.is_local else url


def commit_savepoint(
    out: OutputSnapshot,
    metadata: bytes,
    rows_per_key_group: Mapping[tuple[str, int], int] | None = None,
) -> SnapshotRecord:
    """Commit the written Flink savepoint of ``out``: attach every file its ``_metadata`` bytes
    reference (as the import records a Flink savepoint), write ``_metadata`` last, complete.

    ``rows_per_key_group``: records per (operator uid, key group), for the key-group stats.
    """
    snap = out.snapshot
    store = snap.store
    meta = metadata_from_bytes(metadata, _metadata_location(snap), exists=store.exists)
    missing = sorted(
        h.location or h.name
        for run in meta.handle_runs()
        for h in run.handles
        if h.location is not None and h.exists is False
    )
    if missing:
        raise InvalidJobParams(
            f"the rewritten savepoint {snap.url} references files that were not written: "
            f"{', '.join(missing[:3])}; nothing was committed"
        )
    groups = file_groups(meta, store)
    stats = list(_stats(meta, rows_per_key_group or {}))
    catalog = out.pending.catalog
    with catalog.batch():
        catalog.attach_files(out.record.id, groups)
        if stats:
            catalog.record_key_group_stats(out.record.id, stats)
    snap.commit_metadata(metadata)
    sizes: dict[str, int] = {}
    for g in groups:
        for path, size in zip(g.paths, g.sizes, strict=True):
            sizes[path] = size
    out.record = out.pending.complete(
        None, bytes=sum(sizes.values()), entries=sum(r.rows for r in stats)
    )
    out.committed = True
    return out.record


def _stats(
    meta: FlinkSnapshotMetadata, rows: Mapping[tuple[str, int], int]
) -> Iterable[KeyGroupStatRow]:
    sizes: dict[tuple[str, int], int] = {}
    for op in meta.operators:
        uid = operator_key(op.uid, op.operator_id)
        for st in op.subtasks:
            if st.managed_keyed_state is None:
                continue
            for kg, n in key_group_bytes(st.managed_keyed_state).items():
                if 0 <= kg < meta.max_parallelism:
                    sizes[(uid, kg)] = sizes.get((uid, kg), 0) + n
    for (uid, kg), n in sorted(sizes.items()):
        yield KeyGroupStatRow(uid, kg, int(rows.get((uid, kg), 0)), n)
