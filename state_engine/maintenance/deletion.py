"""What the deleting maintenance jobs (``expire``, ``orphan_cleanup``) share: the job's file lease,
the forget-then-delete step, ages and cut-offs, and hooks for tests.

The lease is ``statekeeper/<job>/files``, the one a running job's CheckpointManager takes before
it releases shared files, so at most one deleter per job works at a time. A deleting job holds it
with a fencing token for its whole deletion, renews it from a background thread, passes the token
to every ``Catalog.forget_files`` (which checks it inside its own transaction, together with the
"no PENDING or COMPLETED snapshot references these files" rule) and releases it at the end.

Order of every batch: forget in the catalog first, then delete from storage. A crash in between
leaves files the catalog no longer knows (what orphan cleanup removes), never a catalog entry
whose file is gone. A stale token (the lease expired and was taken over) fails the forget, so its
holder deletes nothing more.

Deletes run on a thread pool on the driver: each one is a single metadata call to the file system
or object store, so threads saturate it without a cluster's task overhead. A caller may delete
otherwise (the Spark jobs spread very large sets over the cluster:
:mod:`state_engine.jobs.spark_delete`).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from state_engine.catalog import Catalog
from state_engine.checkpoint.commit import file_lease_name
from state_engine.errors import (
    DeletionLeaseHeld,
    DeletionLeaseLost,
    DeletionLeaseTimeout,
    InvalidCatalogInput,
    InvalidJobParams,
    LeaseError,
    LeaseHeld,
    NoSuchJob,
    StatekeeperError,
)
from state_engine.faults import crash_point
from state_engine.maintenance.run import RunTarget
from state_engine.snapshot.storage import delete_url

LEASE_TTL_S = 120.0
DEFAULT_WAIT_S = 600.0
POLL_S = 0.2
BATCH = 1000
THREADS = 16
# dry-run and report lists are recorded as JSON with the run: keep them readable
LIST_LIMIT = 1000

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(w|d|h|m|s|ms)", re.IGNORECASE)
_UNIT_S = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


@dataclass
class DeletionHooks:
    """Callbacks at the points where the deleting jobs can race others; None in production.

    Each is called as ``hook(kind, job)``. Tests pause a job here with threading.Events.
    """

    after_listing: Callable[[str, str], None] | None = None
    after_plan: Callable[[str, str], None] | None = None
    before_forget: Callable[[str, str], None] | None = None
    on_lease_wait: Callable[[str, str], None] | None = None

    def call(self, point: str, kind: str, job: str) -> None:
        hook = getattr(self, point)
        if hook is not None:
            hook(kind, job)


hooks = DeletionHooks()


# --- parameters ---


def resolve_job(catalog: Catalog, params: dict[str, Any]) -> RunTarget:
    """``job`` (a name the catalog knows) -> the run's target."""
    job = params.get("job")
    if not isinstance(job, str) or not job:
        raise InvalidJobParams("name the job whose files to delete: --job NAME")
    try:
        record = catalog.get_job(job)
    except NoSuchJob:
        raise NoSuchJob(
            f"job {job!r} is not in the catalog; nothing was deleted: list the jobs with "
            "`statectl jobs`"
        ) from None
    return RunTarget(job=record.name)


def parse_duration(value: Any, what: str) -> timedelta:
    """A duration: seconds (number), a timedelta, or text such as ``3d``, ``12h``, ``1h30m``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION_RE.findall(text)
            if not parts or "".join(n + u for n, u in parts).lower() != text.lower():
                raise InvalidJobParams(
                    f"{what} {value!r} is not a duration; use seconds or e.g. '3d', '12h', "
                    "'1h30m', '45s'"
                ) from None
            seconds = sum(float(n) * _UNIT_S[u.lower()] for n, u in parts)
    else:
        raise InvalidJobParams(f"{what} {value!r} is not a duration; use e.g. '3d' or seconds")
    if seconds < 0:
        raise InvalidJobParams(f"{what} {value!r} is negative; use a duration >= 0")
    return timedelta(seconds=seconds)


def parse_cutoff(value: Any, now: datetime, what: str = "older_than") -> datetime:
    """``older_than`` as a point in time: an ISO-8601 timestamp or datetime (as is), or a
    duration (see :func:`parse_duration`) before ``now``."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and ("-" in value.strip()[1:] or "T" in value):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidJobParams(
                f"{what} {value!r} is neither an ISO-8601 timestamp (e.g. "
                "'2025-01-31T00:00:00Z') nor a duration (e.g. '3d')"
            ) from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return now - parse_duration(value, what)


def wait_seconds(wait: Any) -> float | None:
    """``wait``: False (refuse when held), True (wait up to 10 minutes) or seconds to wait."""
    if wait is None or wait is False:
        return None
    if wait is True:
        return DEFAULT_WAIT_S
    if isinstance(wait, str) and wait.strip().lower() in ("true", "yes"):
        return DEFAULT_WAIT_S
    if isinstance(wait, str) and wait.strip().lower() in ("false", "no", "0"):
        return None
    seconds = parse_duration(wait, "wait").total_seconds()
    return seconds or None


def as_aware(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# --- the lease ---


class FileLease:
    """The job's file lease for one deleting run: acquired (or waited for), renewed, released.

    ``check()`` raises once the lease is lost; ``forget_files`` checks the token itself too.
    """

    def __init__(
        self,
        catalog: Catalog,
        job: str,
        kind: str,
        run_id: str,
        *,
        wait: float | None,
        ttl: float = LEASE_TTL_S,
    ) -> None:
        self.catalog = catalog
        self.job = job
        self.kind = kind
        self.name = file_lease_name(job)
        self.owner = f"{kind}:{run_id}:{uuid.uuid4().hex[:8]}"
        self.wait = wait
        self.ttl = ttl
        self.token: int | None = None
        self.waited = False
        self._stop = threading.Event()
        self._lost: BaseException | None = None
        self._renewer: threading.Thread | None = None

    def __enter__(self) -> FileLease:
        self.token = self._acquire()
        self._renewer = threading.Thread(target=self._renew, name=f"lease-{self.name}", daemon=True)
        self._renewer.start()
        return self

    def _acquire(self) -> int:
        deadline = None if self.wait is None else time.monotonic() + self.wait
        while True:
            try:
                return self.catalog.acquire_lease(self.name, self.owner, self.ttl)
            except LeaseHeld as exc:
                holder = self.catalog.get_lease(self.name)
                who = (
                    f"{holder.owner!r} (token {holder.token}, until "
                    f"{holder.expires_at.isoformat()})"
                    if holder is not None
                    else "another deleter"
                )
                if deadline is None:
                    raise DeletionLeaseHeld(
                        f"{self.kind} of job {self.job!r} did not start: the file lease "
                        f"{self.name!r} is held by {who}; nothing was deleted: run again when "
                        "it is released, or pass wait=True / --wait to wait for it"
                    ) from exc
                remaining = deadline - time.monotonic()
                # a deleter told to wait polls at least once, however short the wait or slow
                # the machine, so "waited N s" is always true of it
                if remaining <= 0 and self.waited:
                    raise DeletionLeaseTimeout(
                        f"{self.kind} of job {self.job!r} waited {self.wait:g} s for the file "
                        f"lease {self.name!r}, still held by {who}; nothing was deleted: run "
                        "again later or wait longer"
                    ) from exc
                self.waited = True
                hooks.call("on_lease_wait", self.kind, self.job)
                # the catalog offers no notification, so poll; the stop event never fires here
                self._stop.wait(max(0.0, min(POLL_S, remaining)))

    @property
    def held_token(self) -> int:
        """The fencing token of the held lease (set by ``__enter__``: use the lease in ``with``)."""
        assert self.token is not None, f"file lease {self.name!r} used outside its with block"
        return self.token

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.catalog.renew_lease(self.name, self.held_token, self.ttl)
            except (LeaseError, StatekeeperError) as exc:
                self._lost = exc
                return

    def check(self) -> None:
        """Raise DeletionLeaseLost if the lease was lost (renewal failed, or its token stale)."""
        if self._lost is None:
            try:
                self.catalog.check_lease(self.name, self.held_token)
                return
            except LeaseError as exc:
                self._lost = exc
        raise DeletionLeaseLost(
            f"{self.kind} of job {self.job!r} lost the file lease {self.name!r} "
            f"({self._lost}); it stopped before deleting more: run it again"
        ) from self._lost

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.token is not None:
            with contextlib.suppress(LeaseError):
                self.catalog.release_lease(self.name, self.token)


# --- forget, then delete ---


@dataclass
class Deleted:
    """What a forget-then-delete pass did."""

    files: int = 0
    bytes: int = 0
    forgotten: int = 0
    dirs: int = 0
    missing: int = 0
    skipped_live: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)


#: Deletes URLs from storage and returns those that existed (see :func:`delete_urls`).
Deleter = Callable[[Sequence[str]], set[str]]


def forget_and_delete(
    catalog: Catalog,
    lease: FileLease,
    files: dict[str, int],
    *,
    delete: Deleter | None = None,
    threads: int = THREADS,
) -> Deleted:
    """Forget ``files`` (URL -> size) under the lease's token, then delete them from storage
    (with ``delete``; default: :func:`delete_urls` on ``threads`` threads).

    A batch the catalog refuses because a snapshot started referencing one of its files meanwhile
    is narrowed to the still-unreferenced files and tried again; those files are kept.
    """
    out = Deleted()
    urls = sorted(files)
    forgotten: list[str] = []
    for start in range(0, len(urls), BATCH):
        batch = urls[start : start + BATCH]
        lease.check()
        hooks.call("before_forget", lease.kind, lease.job)
        try:
            out.forgotten += catalog.forget_files(
                lease.job, batch, lease=lease.name, token=lease.held_token
            )
        except InvalidCatalogInput:
            live = catalog.live_paths(lease.job)
            keep = [u for u in batch if u in live]
            if not keep:
                raise
            out.skipped_live.extend(keep)
            batch = [u for u in batch if u not in live]
            out.forgotten += catalog.forget_files(
                lease.job, batch, lease=lease.name, token=lease.held_token
            )
        forgotten.extend(batch)
        crash_point("deletion.after_forget")
    lease.check()
    # only what this attempt found and removed counts: a retry's earlier attempt removed the rest
    removed = delete(forgotten) if delete is not None else delete_urls(forgotten, threads=threads)
    out.paths = [u for u in forgotten if u in removed]
    out.files = len(out.paths)
    out.bytes = sum(files[u] for u in out.paths)
    out.missing = len(forgotten) - len(out.paths)
    return out


def _delete_one(url: str) -> str | None:
    if not delete_url(url):
        return None  # already gone: an earlier attempt of this run deleted it
    crash_point("deletion.after_delete_one")
    return url


def delete_urls(urls: Sequence[str], *, threads: int = THREADS) -> set[str]:
    """Delete ``urls`` from storage on a thread pool; returns those that existed. Missing files
    are fine."""
    if not urls:
        return set()
    with ThreadPoolExecutor(max(1, min(threads, len(urls)))) as pool:
        return {u for u in pool.map(_delete_one, urls) if u is not None}


def limited(items: Sequence[Any]) -> dict[str, Any]:
    """A list for the recorded report, cut to LIST_LIMIT items (the count says how many)."""
    return {
        "count": len(items),
        "items": list(items[:LIST_LIMIT]),
        "truncated": len(items) > LIST_LIMIT,
    }
