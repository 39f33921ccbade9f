"""Does the catalog tell the truth about storage? (``statectl verify``)

Per job: every file of every COMPLETED snapshot exists with its recorded size (and, deep, crc32),
each checked once however many snapshots share it; each COMPLETED ``_metadata`` reads with the
reader of the snapshot's recorded format, names the same checkpoint, lists exactly the catalog's
files and (Flink's) has offsets and ranges that can be right; PENDING snapshots and Flink
snapshots an import found unreadable (FAILED) are listed apart; files
under the job's roots that no live snapshot references are warnings (``strict``: errors). Nothing
is changed, except that ``sync`` re-syncs a Flink job whose ``_metadata`` went missing (the running
job subsumed it) and verifies it again. The user-facing rules: ``docs/operations.md``, "Verify".
:func:`verify` returns a :class:`VerifyReport`; ``ok`` is False on any error.
"""

from __future__ import annotations

import posixpath
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from state_engine.catalog import Catalog
from state_engine.catalog.records import JobRecord, SnapshotFileRecord, SnapshotRecord
from state_engine.errors import StatekeeperError
from state_engine.formatting import human_bytes
from state_engine.snapshot.metadata import SnapshotMetadata
from state_engine.snapshot.storage import METADATA_FILE, FileStore, SnapshotDir, format_checksum
from state_engine.snapshot_enums import RETAINED_STATUSES, SnapshotKind, SnapshotStatus

ERROR, WARNING, PENDING = "ERROR", "WARNING", "PENDING"
#: a Flink snapshot an import found unreadable: listed, not an inconsistency (the catalog says so)
UNREADABLE = "FAILED"
LIVE = RETAINED_STATUSES
_CHUNK = 1 << 20

#: exit status of ``statectl verify`` when it found an inconsistency (1 is "could not check")
EXIT_INCONSISTENT = 3


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    level: str  # ERROR, WARNING, PENDING or FAILED
    # missing, size, checksum, metadata, metadata-mismatch, metadata-structure, orphan,
    # released, pending, unreadable
    kind: str
    message: str
    path: str | None = None
    snapshot_id: int | None = None
    checkpoint_id: int | None = None


@dataclass
class JobReport:
    job: str
    location: str | None
    completed: int = 0
    pending: int = 0
    unreadable: int = 0
    files_checked: int = 0
    bytes_checked: int = 0
    files_listed: int = 0
    findings: list[Finding] = field(default_factory=list)
    #: checkpoints the sync before a second verify found gone (``sync``: Flink subsumed them)
    vanished: list[int] = field(default_factory=list)

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)


@dataclass
class VerifyReport:
    jobs: list[JobReport]
    deep: bool
    strict: bool

    @property
    def findings(self) -> list[Finding]:
        return [f for j in self.jobs for f in j.findings]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "deep": self.deep,
            "strict": self.strict,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "jobs": [asdict(j) for j in self.jobs],
        }

    def render(self) -> str:
        check = "size and crc32 checksum" if self.deep else "size only (--quick)"
        lines: list[str] = []
        for j in self.jobs:
            lines.append(
                f"job {j.job} ({j.location or 'no location'}): {j.completed} COMPLETED, "
                f"{j.pending} PENDING"
                + (f", {j.unreadable} FAILED (unreadable)" if j.unreadable else "")
                + f" snapshot(s); {j.files_checked} file(s), "
                f"{human_bytes(j.bytes_checked)} checked ({check}); "
                f"{j.files_listed} file(s) in storage"
            )
            if j.vanished:
                lines.append(
                    "  synced: checkpoint(s) "
                    f"{', '.join(map(str, j.vanished))} vanished since the last import "
                    "(subsumed by the running job) and are no longer live"
                )
            for f in j.findings:
                lines.append(f"  {f.level:<7} {f.message}")
        if not self.jobs:
            lines.append("no jobs in the catalog")
        if self.ok:
            lines.append(f"result: consistent ({len(self.warnings)} warning(s))")
        else:
            lines.append(
                f"result: INCONSISTENT: {len(self.errors)} error(s), {len(self.warnings)} "
                "warning(s); do not restore from a snapshot with an ERROR line"
            )
        return "\n".join(lines)


class _Storage:
    """Filesystems by URL scheme, and file checks that are done once per URL."""

    def __init__(self, storage_options: dict[str, Any] | None) -> None:
        self.options = storage_options
        self._stores: dict[str, FileStore] = {}
        self._checked: dict[tuple[str, bool, bool], tuple[str, str] | None] = {}

    def resolve(self, url: str) -> tuple[FileStore, str]:
        scheme = url.split("://", 1)[0] if "://" in url else "file"
        store = self._stores.get(scheme)
        if store is None:
            store, path = FileStore.at(url, self.options)
            self._stores[scheme] = store
            return store, path
        return store, store.path_of(url)

    def check(
        self, url: str, size: int, checksum: str | None, deep: bool, *, at_least: bool = False
    ) -> tuple[str, str] | None:
        """None if the file is as recorded, else (kind, what is wrong). ``at_least``: a file
        its writer may append to (a Flink physical file of ranges): ``size`` bytes or more."""
        key = (url, deep, at_least)
        if key not in self._checked:
            self._checked[key] = self._check(url, size, checksum, deep, at_least)
        return self._checked[key]

    def forget_problems(self) -> None:
        """Check again what was found wrong (a file found as recorded stays so)."""
        self._checked = {k: v for k, v in self._checked.items() if v is None}

    def _check(
        self, url: str, size: int, checksum: str | None, deep: bool, at_least: bool
    ) -> tuple[str, str] | None:
        store, path = self.resolve(url)
        try:
            actual = store.size(path)
        except FileNotFoundError:
            return "missing", "is missing from storage"
        if at_least:
            if actual < size:
                return "size", (
                    f"has {actual} bytes in storage, fewer than the {size} the catalog's "
                    "snapshots read of it (truncated)"
                )
        elif actual != size:
            return "size", (
                f"has {actual} bytes in storage, the catalog recorded {size} (truncated or "
                "replaced)"
            )
        if deep and checksum is not None:
            crc = 0
            with store.open_read(path) as f:
                while chunk := f.read(_CHUNK):
                    crc = zlib.crc32(chunk, crc)
            if format_checksum(crc) != checksum:
                return "checksum", (
                    f"has checksum {format_checksum(crc)}, the catalog recorded {checksum} "
                    "(its content is corrupt)"
                )
        return None

    def list_files(self, url: str) -> dict[str, int]:
        """URL -> size of every file under ``url`` (nothing if it does not exist)."""
        store, path = self.resolve(url)
        base = path.rstrip("/")
        return {store.url_of(f"{base}/{f.path}"): f.size for f in store.find(path)}


def _label(s: SnapshotRecord) -> str:
    name = (
        f"chk-{s.checkpoint_id}"
        if s.kind is SnapshotKind.CHECKPOINT
        else f"savepoint {s.checkpoint_id}"
    )
    return f"{name} (snapshot {s.id}, {s.status})"


def _ranged(f: SnapshotFileRecord) -> bool:
    """Whether the snapshot reads ranges of the file (Flink file merging, a changelog), which
    its writer may have appended to since."""
    return bool(f.details and f.details.get("segments"))


def _by_path(files: Iterable[SnapshotFileRecord]) -> dict[str, SnapshotFileRecord]:
    out: dict[str, SnapshotFileRecord] = {}
    for f in files:
        out.setdefault(f.path, f)  # a file read by several subtasks is listed once per subtask
    return out


def _check_flink_metadata(
    report: JobReport,
    snap: SnapshotRecord,
    files: dict[str, SnapshotFileRecord],
    job_location: str | None,
) -> None:
    """A Flink snapshot's binary ``_metadata`` (see state_engine.flink) against the catalog."""
    from state_engine.flink.import_job import check_metadata

    label = _label(snap)
    meta_url = snap.location.rstrip("/") + "/" + METADATA_FILE
    try:
        problems, structure = check_metadata(
            snap.location, job_location, {p: f.size for p, f in files.items()}
        )
    except (StatekeeperError, OSError, ValueError) as exc:
        report.add(
            Finding(ERROR, "metadata", f"{label}: {METADATA_FILE} cannot be read: {exc}",
                    meta_url, snap.id, snap.checkpoint_id)
        )  # fmt: skip
        return
    for problem in problems:
        report.add(
            Finding(ERROR, "metadata-mismatch",
                    f"{label}: {METADATA_FILE} disagrees with the catalog: {problem}",
                    meta_url, snap.id, snap.checkpoint_id)
        )  # fmt: skip
    for problem in structure:
        report.add(
            Finding(ERROR, "metadata-structure",
                    f"{label}: {METADATA_FILE} cannot be right: {problem}",
                    meta_url, snap.id, snap.checkpoint_id)
        )  # fmt: skip


def _check_metadata(
    report: JobReport,
    snap: SnapshotRecord,
    files: dict[str, SnapshotFileRecord],
    job_location: str | None = None,
) -> None:
    """``_metadata`` reads with the reader of its format (a Flink job's catalog holds Flink's
    snapshots and the savepoints Statekeeper converted into its own), validates, and agrees
    with what the catalog attached."""
    label = _label(snap)
    if snap.metadata_format == "flink":
        _check_flink_metadata(report, snap, files, job_location)
        return
    try:
        sdir = SnapshotDir.from_url(snap.location)
        meta = SnapshotMetadata.from_json(sdir.read_metadata_bytes(), sdir.url)
    except (StatekeeperError, OSError, ValueError) as exc:
        report.add(
            Finding(ERROR, "metadata", f"{label}: {METADATA_FILE} cannot be read: {exc}",
                    posixpath.join(snap.location, METADATA_FILE), snap.id, snap.checkpoint_id)
        )  # fmt: skip
        return
    problems: list[str] = []
    if meta.checkpoint_id != snap.checkpoint_id:
        problems.append(
            f"it names checkpoint {meta.checkpoint_id}, the catalog {snap.checkpoint_id}"
        )
    listed: set[str] = set()
    for mf in meta.files:
        try:
            url = sdir.url_of(mf.path)
        except StatekeeperError as exc:
            problems.append(f"file {mf.path!r}: {exc}")
            continue
        listed.add(url)
        cf = files.get(url)
        if cf is None:
            problems.append(f"it lists {mf.path} ({url}), which the catalog did not attach")
        elif cf.size != mf.size or (cf.checksum and cf.checksum != mf.checksum):
            problems.append(
                f"it records {mf.path} as {mf.size} bytes {mf.checksum}, the catalog as "
                f"{cf.size} bytes {cf.checksum}"
            )
    meta_url = sdir.metadata_url
    for url in sorted(set(files) - listed - {meta_url}):
        problems.append(f"the catalog attached {url}, which it does not list")
    for problem in problems:
        report.add(
            Finding(ERROR, "metadata-mismatch",
                    f"{label}: {METADATA_FILE} disagrees with the catalog: {problem}",
                    meta_url, snap.id, snap.checkpoint_id)
        )  # fmt: skip


def verify_job(
    catalog: Catalog,
    job: str | int | JobRecord,
    *,
    deep: bool = True,
    strict: bool = False,
    storage: _Storage | None = None,
) -> JobReport:
    """Check one job's live snapshots against storage (see the module doc)."""
    record = job if isinstance(job, JobRecord) else catalog.get_job(job)
    storage = storage or _Storage(None)
    report = JobReport(record.name, record.location)
    snaps = catalog.list_snapshots(record.id, status=list(LIVE))
    referenced: set[str] = set()
    roots = [record.location] if record.location else []
    for snap in sorted(snaps, key=lambda s: s.checkpoint_id):
        files = _by_path(catalog.snapshot_files(snap.id))
        referenced.update(files)
        if not any(snap.location.startswith(r.rstrip("/") + "/") for r in roots):
            roots.append(snap.location)
        if snap.status is SnapshotStatus.PENDING:
            report.pending += 1
            missing = sum(
                1
                for f in files.values()
                if storage.check(f.path, f.size, None, False, at_least=_ranged(f)) is not None
            )
            remedy = (
                "the next `statectl flink import` of its directory finishes it"
                if record.origin == "flink"
                else "failed by the job's next run, or as stale by `statectl maintain expire "
                f"--job {record.name} --abort-pending-older-than 1h`"
            )
            report.add(
                Finding(PENDING, "pending",
                        f"{_label(snap)} started {snap.created_at:%Y-%m-%d %H:%M:%S}: not "
                        f"restorable (in progress, or left by a crash); {len(files)} file(s) "
                        f"attached, {missing} of them not in storage; its files are kept (if "
                        f"its writer died: {remedy})",
                        snap.location, snap.id, snap.checkpoint_id)
            )  # fmt: skip
            continue
        report.completed += 1
        for f in files.values():
            report.files_checked += 1
            report.bytes_checked += f.size
            problem = storage.check(f.path, f.size, f.checksum, deep, at_least=_ranged(f))
            if problem is not None:
                kind, what = problem
                if _subsumed_hint(record, kind, f.path):
                    what += (
                        "; a running Flink job may have subsumed this checkpoint since the last "
                        f"import: `statectl verify {record.name} --sync` syncs first"
                    )
                report.add(
                    Finding(ERROR, kind, f"{_label(snap)}: file {f.path} {what}", f.path,
                            snap.id, snap.checkpoint_id)
                )  # fmt: skip
        _check_metadata(report, snap, files, record.location)
    unreadable = _report_unreadable(catalog, record, report) if record.origin == "flink" else []
    referenced |= catalog.live_paths(record.id)
    known = catalog.known_paths(record.id)
    orphan_level = ERROR if strict else WARNING
    for root in roots:
        stored = storage.list_files(root)
        report.files_listed += len(stored)
        for url, size in sorted(stored.items()):
            if url in referenced or any(url.startswith(u.rstrip("/") + "/") for u in unreadable):
                continue  # an unreadable snapshot's files: its FAILED line says it
            if url in known:
                report.add(
                    Finding(orphan_level, "released",
                            f"released file {url} ({size} B): no live snapshot uses it; the next "
                            "checkpoint's cleanup or orphan cleanup deletes it", url)
                )  # fmt: skip
            else:
                report.add(
                    Finding(orphan_level, "orphan",
                            f"orphan file {url} ({size} B): no snapshot references it (left by "
                            "a failed or crashed snapshot?); orphan cleanup deletes it", url)
                )  # fmt: skip
    return report


def _report_unreadable(catalog: Catalog, record: JobRecord, report: JobReport) -> list[str]:
    """List the Flink snapshots an import found unreadable (recorded FAILED); their locations."""
    from state_engine.flink.unreadable import is_unreadable

    failed = catalog.list_snapshots(record.id, status=SnapshotStatus.FAILED)
    locations = []
    for snap in sorted(failed, key=lambda s: s.checkpoint_id):
        if not is_unreadable(snap):
            continue
        locations.append(snap.location)
        report.unreadable += 1
        report.add(
            Finding(UNREADABLE, "unreadable",
                    f"{_label(snap)}: not restorable ({snap.error}); the next "
                    "`statectl flink import` imports it if it reads again",
                    snap.location, snap.id, snap.checkpoint_id)
        )  # fmt: skip
    return locations


def _subsumed_hint(record: JobRecord, kind: str, path: str) -> bool:
    """Whether a finding is a Flink snapshot's missing ``_metadata``: what a sync explains."""
    return record.origin == "flink" and kind == "missing" and path.endswith("/" + METADATA_FILE)


def _verify_synced(
    catalog: Catalog, record: JobRecord, deep: bool, strict: bool, storage: _Storage
) -> JobReport:
    """``verify_job``; for a Flink job whose snapshot lost its ``_metadata``, sync its
    directories and verify again (see the module doc)."""
    report = verify_job(catalog, record, deep=deep, strict=strict, storage=storage)
    if record.origin != "flink" or not any(
        f.level == ERROR and f.path and _subsumed_hint(record, f.kind, f.path)
        for f in report.findings
    ):
        return report
    from state_engine.flink.import_job import import_flink

    directories = [d for d, _ in catalog.job_directories(record.name)]
    try:
        synced = import_flink(catalog, directories, record.name, storage_options=storage.options)
    except (StatekeeperError, OSError) as exc:  # storage unreachable: reported, not raised
        report.add(
            Finding(WARNING, "sync",
                    f"the sync of {', '.join(directories)} before a second verify failed: {exc}")
        )  # fmt: skip
        return report
    storage.forget_problems()
    again = verify_job(catalog, record, deep=deep, strict=strict, storage=storage)
    again.vanished = sorted(v["checkpoint_id"] for v in synced.vanished)
    return again


def verify(
    catalog: Catalog,
    job: str | int | None = None,
    *,
    deep: bool = True,
    strict: bool = False,
    storage_options: dict[str, Any] | None = None,
    sync: bool = False,
) -> VerifyReport:
    """Check ``job`` (default: every job in the catalog) against storage; ``sync``: sync a Flink
    job whose snapshot lost its ``_metadata`` and check it again (see the module doc)."""
    storage = _Storage(storage_options)
    jobs = [catalog.get_job(job)] if job is not None else catalog.list_jobs()
    return VerifyReport(
        [
            _verify_synced(catalog, j, deep, strict, storage)
            if sync
            else verify_job(catalog, j, deep=deep, strict=strict, storage=storage)
            for j in jobs
        ],
        deep=deep,
        strict=strict,
    )
