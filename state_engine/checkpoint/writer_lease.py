"""One writer per job: the run that writes a job's checkpoints holds the job's writer lease.

As a Flink job has one JobMaster leader, a Statekeeper job has one running :class:`JobRunner`:
it takes the catalog lease ``writer:<job>`` when it starts, renews it in the background while it
lives and gives it up when it stops. A second run of the same job while the first lives is
refused (:class:`JobAlreadyRunning`) instead of interleaving two writers' checkpoints.

A run that died (SIGKILL, a lost machine) leaves its lease held until the TTL lapses. The next
run takes it over at once when the holder's process is provably gone: same host, same kernel
boot, same PID namespace, and no process with its PID. Otherwise it waits for the TTL.

Every snapshot a run begins records the run as its ``writer``. Holding the lease means no other
run of the job is alive, so the new run fails every PENDING snapshot an earlier run began (those
begun without a writer lease -- maintenance outputs, Flink imports, a CheckpointManager driven
directly -- are left alone): the rows go FAILED with the reason, which releases the files they
pinned, their own directories are removed, and orphan cleanup judges ``shared/`` again.

A run whose lease was lost (its renewals failed past the TTL and another run took it over)
cannot complete a snapshot: every completion checks the lease's fencing token in its own
transaction, so a stalled writer that wakes up after its successor started commits nothing over
it (:class:`StaleFencingToken`), and once its renewal saw the loss it begins none either
(:class:`WriterLeaseLost`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from state_engine.catalog.store import NAME_MAX_LENGTH
from state_engine.errors import (
    JobAlreadyRunning,
    LeaseError,
    LeaseHeld,
    NoSuchJob,
    StatekeeperError,
    WriterLeaseLost,
)
from state_engine.snapshot_enums import SnapshotStatus

if TYPE_CHECKING:
    from state_engine.catalog import Catalog, SnapshotRecord
    from state_engine.snapshot.storage import CheckpointStorage

log = logging.getLogger(__name__)

#: How long a writer lease lives without renewal (seconds); renewed every third of it.
WRITER_LEASE_TTL_S = 60.0


def writer_lease_name(job: str) -> str:
    """``writer:<job>``; a job name too long for a lease name keeps a prefix and a digest."""
    name = f"writer:{job}"
    if len(name) <= NAME_MAX_LENGTH:
        return name
    digest = hashlib.sha256(job.encode()).hexdigest()[:16]
    return f"writer:{job[:150]}~{digest}"


def running_writer(catalog: Catalog, job: str) -> str | None:
    """The owner of ``job``'s live writer lease: the run checkpointing the job now, if any."""
    lease = catalog.get_lease(writer_lease_name(job))
    return lease.owner if lease is not None and lease.held_at(catalog.now()) else None


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _machine() -> str:
    """This kernel boot and PID namespace: where a PID names one process (empty: unknown)."""
    boot = _read("/proc/sys/kernel/random/boot_id")[:8]
    try:
        pid_ns = os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]")
    except OSError:
        return ""
    return f"{boot}.{pid_ns}" if boot else ""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


class Owner:
    """Who holds a writer lease: ``runner/<host>/<machine>/<pid>/<nonce>`` in the catalog."""

    def __init__(self, host: str, machine: str, pid: int, nonce: str) -> None:
        self.host, self.machine, self.pid, self.nonce = host, machine, pid, nonce

    @classmethod
    def this_process(cls) -> Owner:
        host = socket.gethostname() or "-"
        return cls(host, _machine() or "-", os.getpid(), uuid.uuid4().hex[:8])

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        parts = text.split("/")
        if len(parts) != 5 or parts[0] != "runner" or not parts[3].isdigit():
            return None
        return cls(parts[1], parts[2], int(parts[3]), parts[4])

    def __str__(self) -> str:
        return f"runner/{self.host}/{self.machine}/{self.pid}/{self.nonce}"

    def known_dead(self) -> bool:
        """True only when this owner's process is provably gone: it ran on this machine (same
        host, boot and PID namespace), is not this process, and its PID is free."""
        here = Owner.this_process()
        return (
            self.machine != "-"
            and (self.host, self.machine) == (here.host, here.machine)
            and self.pid != here.pid
            and not _pid_alive(self.pid)
        )


class WriterLease:
    """The writer lease of ``job`` for one run: :meth:`acquire`, then :meth:`release`."""

    def __init__(self, catalog: Catalog, job: str, ttl: float = WRITER_LEASE_TTL_S) -> None:
        self.catalog = catalog
        self.job = job
        self.name = writer_lease_name(job)
        self.owner = str(Owner.this_process())
        self.ttl = ttl
        self.token: int | None = None
        #: the holder this run took the lease over from (its process was gone), if any
        self.took_over_from: str | None = None
        self._lost: BaseException | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self) -> WriterLease:
        """Take the lease (from a dead holder too) and start renewing it; JobAlreadyRunning if
        a live run holds it."""
        self.token = self._take()
        self._renewer = threading.Thread(target=self._renew, name=self.name, daemon=True)
        self._renewer.start()
        return self

    def _take(self, attempts: int = 2) -> int:
        try:
            return self.catalog.acquire_lease(self.name, self.owner, self.ttl)
        except LeaseHeld as exc:
            holder = self.catalog.get_lease(self.name)
            if attempts > 1 and (holder is None or not holder.held_at(self.catalog.now())):
                return self._take(attempts - 1)  # given up since: take it as a free lease
            owner = None if holder is None else Owner.parse(holder.owner)
            if holder is None or owner is None or not owner.known_dead():
                until = "" if holder is None else f" until {holder.expires_at.isoformat()}"
                who = "another run" if holder is None else repr(holder.owner)
                raise JobAlreadyRunning(
                    f"job {self.job!r} is already running: {who} holds its writer lease "
                    f"{self.name!r}{until}; one run writes a job's snapshots. Stop that run "
                    "first (a run that died gives the lease up when its lease expires, at once "
                    "when it died on this machine)"
                ) from exc
            try:
                token = self.catalog.acquire_lease(
                    self.name, self.owner, self.ttl, take_over=holder.token
                )
            except LeaseHeld as again:  # another new run took it over first
                raise JobAlreadyRunning(
                    f"job {self.job!r} is already running: another run took over the writer "
                    f"lease {self.name!r} of the dead {holder.owner!r} first"
                ) from again
            self.took_over_from = holder.owner
            return token

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            self.renew()
            if self._lost is not None:
                return

    def renew(self) -> None:
        """Extend the lease by its TTL now (the background thread does this every third of
        it); a lease taken over or expired marks this run as having lost it."""
        if self.token is None or self._lost is not None:
            return
        try:
            self.catalog.renew_lease(self.name, self.token, self.ttl)
        except LeaseError as exc:
            self._lost = exc
        except Exception as exc:  # noqa: BLE001 -- unreachable now (or closed): the next retries
            log.warning("renewing the writer lease %s failed: %s", self.name, exc)

    def check(self) -> None:
        """Raise WriterLeaseLost if this run may no longer write the job's snapshots."""
        if self._lost is not None:
            raise WriterLeaseLost(
                f"this run of job {self.job!r} lost its writer lease {self.name!r} "
                f"({self._lost}); another run writes the job's snapshots now: stop this one"
            )
        if self.token is None:
            raise WriterLeaseLost(f"this run of job {self.job!r} holds no writer lease")

    def fencing(self) -> tuple[str, int]:
        """(name, token) a snapshot's completion checks in its own transaction: a run whose
        lease was taken over cannot complete one, whatever its own flag says yet."""
        self.check()
        assert self.token is not None  # check() raised otherwise
        return self.name, self.token

    def release(self) -> None:
        """Stop renewing and give the lease up (harmless when lost or released already)."""
        self._stop.set()
        renewer = self._renewer
        if renewer is not None and renewer is not threading.current_thread():
            # a bound, not a delay: a renewal stuck in the catalog keeps the lease to its TTL
            renewer.join(self.ttl)
            if renewer.is_alive():
                log.warning("the writer lease %s lapses with its TTL: renewal hangs", self.name)
                self.token = None
                return
        token, self.token = self.token, None
        if token is not None and self._lost is None:
            try:
                self.catalog.release_lease(self.name, token)
            except StatekeeperError as exc:  # it lapses with its TTL
                log.warning("releasing the writer lease %s failed: %s", self.name, exc)

    def fail_stale_commits(self, storage: CheckpointStorage) -> list[SnapshotRecord]:
        """Fail every PENDING snapshot an earlier run of the job began (none of them can still
        be written: this run holds the lease), releasing their files and removing their own
        directories; returns them as they were."""
        from state_engine.checkpoint.commit import abandon

        self.check()
        try:
            pending = self.catalog.list_snapshots(self.job, status=SnapshotStatus.PENDING)
        except NoSuchJob:
            return []  # its first run: nothing was begun yet
        stale = [s for s in pending if s.writer is not None and s.writer != self.owner]
        for snap in stale:
            reason = (
                f"its run stopped before completing it; failed by the job's next run ({self.owner})"
            )
            abandon(self.catalog, snap, reason, storage=storage)
            log.warning(
                "job %s: snapshot %s (checkpoint %s) was left PENDING by a run that stopped; "
                "failed it and removed %s",
                self.job,
                snap.id,
                snap.checkpoint_id,
                snap.location,
            )
        return stale
