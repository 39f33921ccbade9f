"""Every error Statekeeper raises on purpose.

One hierarchy, rooted at :class:`StatekeeperError`, so callers (the CLI, the Airflow operators) can
turn any of them into one readable line. Each message says what was wrong and what to do about it.
Where a Python built-in exception already names the category (``ValueError``, ``TypeError``,
``KeyError``), the class derives from it too, so generic handlers keep working.
"""

from __future__ import annotations


class StatekeeperError(Exception):
    """Base class of every error raised by Statekeeper."""


class ConfigurationError(StatekeeperError, ValueError):
    """A setting (environment variable, URL, option) is missing or malformed."""


# --- key groups and parallelism ---


class InvalidParallelism(StatekeeperError, ValueError):
    """A max parallelism, parallelism or operator index is out of its allowed range."""


class UnsupportedKeyType(StatekeeperError, TypeError):
    """A key whose type has no defined hash (only str, int, bytes, bool and tuples of them do)."""


class KeyGroupOutOfRange(StatekeeperError, ValueError):
    """A key or key group that falls outside the key-group range a backend owns."""


class InvalidKeyHash(StatekeeperError, ValueError):
    """A key hash that is not a 32-bit integer (Java ``int``)."""


class InvalidKeyGroupPrefix(StatekeeperError, ValueError):
    """Stored bytes too short to hold the key-group prefix that the max parallelism implies."""


# --- serializers ---


class SerializationError(StatekeeperError, ValueError):
    """A value the serializer cannot encode, or bytes it cannot decode."""


class UnknownSerializer(StatekeeperError, KeyError):
    """A serializer name (or Python type) that has no registered serializer."""

    def __str__(self) -> str:  # KeyError would repr() the message and add quotes
        return str(self.args[0]) if self.args else ""


class IncompatibleSerializer(StatekeeperError):
    """Data written by one serializer that the current serializer cannot read."""


class SerializerRegistrationConflict(StatekeeperError, ValueError):
    """A serializer name and version already registered to another class."""


# --- keyed and operator state ---


class StateError(StatekeeperError):
    """Misuse of the state API."""


class NoCurrentKey(StateError):
    """Keyed state was accessed before a current key was set."""


class StateRegistrationConflict(StateError):
    """A state name registered again with a different kind, serializer or TTL configuration."""


class InvalidStateDescriptor(StateError, ValueError):
    """A state descriptor or TTL configuration that cannot be used as given."""


class CorruptOperatorState(StateError, ValueError):
    """Operator-state rows or metadata that break their contract (unknown mode, index gaps, ...)."""


class UnknownPartition(StateError, KeyError):
    """A source partition that this subtask's offsets do not hold."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidOffset(StateError, ValueError):
    """A source offset that is negative, not an int, or moves a partition backwards."""


# --- catalog ---


class CatalogError(StatekeeperError):
    """Base class of errors raised by the SQL catalog."""


class CatalogUnreachable(CatalogError):
    """The catalog database cannot be reached, or its URL is malformed."""


class CatalogVersionMismatch(CatalogError):
    """The catalog schema is behind or ahead of this code's migrations."""


class NotFound(CatalogError, KeyError):
    """A job, snapshot, file, run or lease that the catalog does not know."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class NoSuchJob(NotFound):
    """A job name or id that the catalog does not know."""


class NoSuchSnapshot(NotFound):
    """A snapshot id that the catalog does not know."""


class CommitConflict(CatalogError):
    """A compare-and-swap lost: another writer changed the row first."""


class InvalidSnapshotTransition(CatalogError):
    """A snapshot status change that its current status does not allow (e.g. completing twice)."""


class FileAlreadyRegistered(CatalogError):
    """A file path registered as exclusive to one snapshot that another snapshot already holds."""


class ReadOnlyViolation(CatalogError):
    """A statement that would write, sent through a read-only path such as ``statectl sql``."""


class LeaseError(CatalogError):
    """Base class of lease errors."""


class LeaseHeld(LeaseError):
    """The lease is held by another owner and has not expired."""


class StaleFencingToken(LeaseError):
    """A fencing token older than the lease's current one: its holder lost the lease."""


class LeaseExpired(LeaseError):
    """The lease's time ran out before it was renewed: its holder must acquire it again."""


class NoSuchLease(LeaseError, NotFound):
    """A lease name that was never acquired."""


class InvalidCatalogInput(CatalogError, ValueError):
    """A value the catalog refuses to store (unknown kind or status, bad range, negative size)."""


class NoSuchRun(NotFound):
    """A maintenance run id that the catalog does not know."""


class RunIdConflict(CatalogError):
    """A maintenance run id reused for a different kind of run or a different job."""


class InvalidRunTransition(CatalogError):
    """A maintenance run status change its current status does not allow (e.g. finishing twice)."""


class QueryFailed(CatalogError):
    """A read-only query (``statectl sql``) the database could not run."""


# --- checkpoints and snapshots ---


class CheckpointError(StatekeeperError):
    """Base class of errors about snapshot storage, files and ``_metadata``."""


class UnknownStorageScheme(CheckpointError, ConfigurationError):
    """A checkpoint URL whose scheme fsspec does not know, or whose driver is not installed."""


class InvalidJobName(CheckpointError, ConfigurationError):
    """A job name that cannot be used as one directory name (empty, too long, ``/``, ``..``)."""


class InvalidSnapshotPath(CheckpointError, ValueError):
    """A file path that is absolute or escapes its snapshot directory."""


class SnapshotFileExists(CheckpointError, FileExistsError):
    """A snapshot file or ``_metadata`` that already exists: snapshot files are never rewritten."""


class StorageUnavailable(CheckpointError):
    """The checkpoint storage cannot be used: endpoint down, credentials refused, bucket missing."""


class StorageUnreachable(StorageUnavailable, ConnectionError):
    pass


class StorageAccessDenied(StorageUnavailable, PermissionError):
    pass


class StorageBucketMissing(StorageUnavailable, FileNotFoundError):
    pass


class MissingMetadata(CheckpointError, FileNotFoundError):
    """A snapshot directory without ``_metadata``: the snapshot never committed."""


class CorruptMetadata(CheckpointError, ValueError):
    """A ``_metadata`` document that is not valid JSON or fails validation."""


class UnsupportedMetadataVersion(CorruptMetadata):
    """A ``_metadata`` document written by a newer format version than this code reads."""


class MissingSnapshotFile(CheckpointError, FileNotFoundError):
    """A file that ``_metadata`` lists but storage does not hold."""


class ReusedFileMissing(CheckpointError):
    """An incremental snapshot reuses an earlier snapshot's file that the catalog no longer
    knows: a retention or cleanup deleted it after the job last completed a checkpoint."""


class SnapshotFileMismatch(CheckpointError):
    """A snapshot file whose size or checksum differs from what ``_metadata`` recorded."""


class ChecksumMismatch(SnapshotFileMismatch):
    """A snapshot file whose content checksum differs from the recorded one."""


class InvalidStateRows(CheckpointError, ValueError):
    """Rows handed to a snapshot writer that break the row contract (types, nulls, order)."""


class SnapshotNotRestorable(CheckpointError):
    """A snapshot that is not COMPLETED (PENDING, FAILED, SUBSUMED, ...) asked to restore."""


class SnapshotCancelled(CheckpointError):
    """A snapshot cancelled before it completed; nothing of it was kept."""


class InvalidSnapshotRequest(CheckpointError, ValueError):
    """A trigger or restore request that cannot be served as given (format, subtasks, target)."""


# --- runtime ---


class JobError(StatekeeperError):
    """Base class of errors raised while defining or running a job in the local runtime."""


class InvalidJob(JobError, ConfigurationError):
    """A job definition that cannot run as given (missing part, bad interval, reserved name)."""


class MalformedRecord(JobError, ValueError):
    """A source record that cannot be parsed or timestamped; the message names file and offset."""


class SinkCommitFailed(JobError):
    """A sink transaction that can be neither committed nor found committed (its data is gone)."""


class JobAlreadyRunning(JobError, LeaseHeld):
    """Another live run of the job holds its writer lease: one run writes a job's snapshots."""


class WriterLeaseLost(JobError, LeaseError):
    """This run's writer lease expired or was taken over: it may no longer write snapshots."""


# --- maintenance jobs ---


class MaintenanceError(StatekeeperError):
    """Base class of errors raised by the Spark maintenance jobs."""


class SparkMasterUnreachable(MaintenanceError, ConnectionError):
    pass


class StorageNotReachableFromSpark(MaintenanceError, ConfigurationError):
    """A storage URL (e.g. ``memory://``) that Spark's executors cannot open."""


class InvalidJobParams(MaintenanceError, ValueError):
    """Maintenance job parameters that cannot be used as given."""


class JobReadOnly(InvalidJobParams):
    """A deleting maintenance run the job's management policy does not allow (or a bad policy)."""


class SnapshotNotUsable(MaintenanceError):
    """An input snapshot a maintenance job cannot read (not COMPLETED, or not canonical)."""


class MaintenanceJobFailed(MaintenanceError):
    """A maintenance job failed for a reason outside Statekeeper's own errors (Spark, I/O)."""


class SparkTaskFailed(MaintenanceJobFailed):
    """A Spark task of a maintenance job raised; the message names the task and its error.

    Raised only once every task of the stage has ended, so nothing is still writing when the
    job cleans up its output.
    """


class DeletionLeaseHeld(MaintenanceError, LeaseHeld):
    """A deleting job (expire, orphan cleanup) found the job's file lease held and may not wait."""


class DeletionLeaseTimeout(MaintenanceError, LeaseHeld):
    """A deleting job waited for the job's file lease and its wait ran out."""


class DeletionLeaseLost(MaintenanceError, LeaseError):
    """A deleting job's file lease could not be renewed: it stops before deleting more."""


class RetentionRemovesEverything(MaintenanceError, ValueError):
    """An expire retention that would remove every completed checkpoint of the job."""


# --- verification and faults ---


class VerificationError(StatekeeperError):
    """``statectl verify`` found the catalog and storage disagreeing (the report says where)."""


class InvalidCrashPoint(ConfigurationError):
    """A ``STATEKEEPER_CRASH_AT`` value that is not ``name`` or ``name:N`` (N >= 1)."""


# --- Apache Flink snapshots ---


class FlinkError(StatekeeperError):
    """Base class of errors about Apache Flink checkpoints and savepoints."""


class FlinkMetadataError(FlinkError, ValueError):
    """A Flink ``_metadata`` file that is truncated, malformed or not a Flink metadata file.

    The message names the file, the byte offset and what was expected there.
    """


class UnsupportedFlinkMetadataVersion(FlinkMetadataError):
    """A Flink ``_metadata`` version this reader does not know (it reads versions 3 to 6)."""


class FlinkPathEscapes(FlinkError, ValueError):
    """A handle path that resolves outside the snapshot's or job's directories."""


class FlinkImportError(FlinkError):
    """A Flink directory that cannot be imported (not a job or savepoint dir, files missing)."""


class FlinkDirectoryClaimed(FlinkImportError):
    """A Flink directory already imported under another job name."""


class FlinkJobDirectoryMissing(FlinkImportError, FileNotFoundError):
    """A Flink job's checkpoint or savepoint directory that no longer exists."""


# --- Flink keyed state (issue 12 part B: decoding and conversion) ---


class FlinkStateError(FlinkError, ValueError):
    """Keyed-state bytes of a Flink snapshot that are truncated or do not follow Flink's layout.

    The message names the file (or handle), the byte offset and what was expected there.
    """


class UnsupportedFlinkSerializer(FlinkStateError):
    """A Flink serializer this reader cannot decode (POJO, Kryo, Avro, user serializers).

    The message names the state and the serializer snapshot class; ``--raw`` shows the bytes
    instead.
    """


class FlinkConversionError(FlinkError):
    """A Flink snapshot that cannot be converted into a Statekeeper canonical savepoint."""
