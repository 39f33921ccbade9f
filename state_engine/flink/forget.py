"""Forgetting a Flink directory that is gone for good.

A sync never discards the snapshots of a claimed directory it cannot find: an unmounted volume or
a moved bucket comes back, and its checkpoints must still pin their files. So a directory
deleted on purpose stays in the catalog, reported under ``missing_directories`` at every sync,
and orphan cleanup refuses the job. ``statectl flink forget-directory PATH --job NAME`` says it
is gone: the job's snapshots in it are discarded (a PENDING one, left by an interrupted import,
failed first), the catalog forgets the files under it (nothing is deleted: the directory is not
there), and the job no longer claims it. Files its snapshots referenced elsewhere (a savepoint's
shared files under the checkpoint directory) lose those references and go with the job's next
expire or orphan cleanup, like any other dead file.

It is refused while the directory exists (sync it instead), for a directory the job does not
claim, and for a job that is not a Flink job. It runs under the job's file lease, so no expire or
orphan cleanup of the job runs at the same time.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from state_engine.catalog import Catalog
from state_engine.errors import FlinkImportError
from state_engine.flink.import_job import normalize_root
from state_engine.maintenance.deletion import FileLease
from state_engine.snapshot.storage import FileStore
from state_engine.snapshot_enums import SnapshotStatus

FORGET = "forget_directory"


@dataclass
class ForgetReport:
    job: str
    directory: str
    #: the directories the job no longer claims: ``directory`` and any claimed inside it
    released: list[str] = field(default_factory=list)
    discarded: list[dict[str, Any]] = field(default_factory=list)
    files_forgotten: int = 0
    #: files under it that snapshots elsewhere still reference (gone with the directory: those
    #: snapshots fail `statectl verify`); their records stay
    still_referenced: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "directory": self.directory,
            "released_directories": self.released,
            "discarded": self.discarded,
            "files_forgotten": self.files_forgotten,
            "still_referenced": self.still_referenced,
        }

    def render(self) -> str:
        lines = [f"job {self.job}: forgot {self.directory}"]
        lines += [f"  no longer claims {d}" for d in self.released if d != self.directory]
        for d in self.discarded:
            lines.append(
                f"  discarded snapshot {d['snapshot_id']} (checkpoint {d['checkpoint_id']}, "
                f"was {d['status']}) at {d['location']}"
            )
        lines.append(f"  {self.files_forgotten} file record(s) forgotten; nothing was deleted")
        if self.still_referenced:
            lines.append(
                f"  {len(self.still_referenced)} file(s) under it are still referenced by "
                f"snapshots elsewhere (e.g. {self.still_referenced[0]}): run `statectl verify "
                f"{self.job}`"
            )
        return "\n".join(lines)


def forget_directory(
    catalog: Catalog,
    path: str,
    job: str,
    *,
    storage_options: dict[str, Any] | None = None,
    wait: float | None = None,
) -> ForgetReport:
    """Forget the claimed Flink directory ``path`` of ``job``, gone for good (see module doc)."""
    record = catalog.get_job(job)
    if record.origin != "flink":
        raise FlinkImportError(
            f"job {job!r} is a Statekeeper job; forget-directory is for the directories a Flink "
            "job was imported from"
        )
    store, root = FileStore.at(path, storage_options)
    root = normalize_root(store, root)
    url = store.url_of(root)
    claimed = [d for d, _ in catalog.job_directories(job)]
    if url not in claimed:
        known = ", ".join(claimed) or "none"
        raise FlinkImportError(f"job {job!r} was not imported from {url}; its directories: {known}")
    if store.exists(root):
        raise FlinkImportError(
            f"{url} still exists; only a directory gone for good is forgotten: sync it with "
            f"`statectl flink import {url} --job {job}`, or delete it first"
        )
    report = ForgetReport(job, url)
    inside = url.rstrip("/") + "/"
    with FileLease(catalog, job, FORGET, uuid.uuid4().hex, wait=wait) as lease:
        gone_ids: set[int] = set()
        for snap in catalog.list_snapshots(job):
            if snap.location != url and not snap.location.startswith(inside):
                continue
            if snap.status is SnapshotStatus.DISCARDED:
                gone_ids.add(snap.id)
                continue
            lease.check()
            was = snap.status.value
            why = f"its directory {url} was forgotten (gone for good)"
            if snap.status is SnapshotStatus.PENDING:
                snap = catalog.fail_snapshot(snap.id, error=why)
            catalog.discard_snapshot(snap.id, error=why)
            gone_ids.add(snap.id)
            report.discarded.append(
                {
                    "snapshot_id": snap.id,
                    "checkpoint_id": snap.checkpoint_id,
                    "status": was,
                    "location": snap.location,
                }
            )
        paths = {
            f.path
            for sid in sorted(gone_ids)
            for f in catalog.snapshot_files(sid)
            if f.path.startswith(inside)
        }
        paths.update(f.path for f in catalog.releasable_files(job) if f.path.startswith(inside))
        live = paths & catalog.live_paths(job)
        report.still_referenced = sorted(live)
        paths -= live
        lease.check()
        report.files_forgotten = catalog.forget_files(
            job, sorted(paths), lease=lease.name, token=lease.held_token
        )
        for d in claimed:
            if d == url or d.startswith(inside):
                catalog.release_directory(job, d)
                report.released.append(d)
    return report
