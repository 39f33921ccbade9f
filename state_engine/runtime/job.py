"""A job definition: source -> key by -> keyed process function -> sink, and how to run it."""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from state_engine.errors import InvalidJob
from state_engine.keygroups import check_parallelism
from state_engine.runtime.functions import KeyedProcessFunction
from state_engine.runtime.sinks import Sink
from state_engine.runtime.sources import Source
from state_engine.snapshot_enums import FORMAT_OPTIONS
from state_engine.state.ttl import Clock

#: How a job's subtasks run: all in the caller's thread, or in worker processes.
EXECUTIONS = ("threads", "processes")
#: The environment variable that picks the execution of jobs that do not name one.
EXECUTION_ENV = "STATEKEEPER_EXECUTION"


@dataclass(frozen=True)
class Job:
    """Everything that defines a job; :meth:`with_` gives a copy with changes (e.g. parallelism).

    ``process_function``: a :class:`KeyedProcessFunction` (deep-copied once per subtask, as Flink
    ships a serialized copy to each) or a zero-argument factory of one.
    ``backend``: a ``StateBackendFactory`` (``HeapBackendFactory()``,
    ``RocksDBBackendFactory(dir)``); None is the heap. ``clock``: processing time (default: the
    system clock; a :class:`~state_engine.runtime.clock.RecordTimestampClock` makes runs
    reproducible). ``fork_writer``: heap snapshots on local storage are written by a forked
    child process (see :mod:`state_engine.checkpoint.forked`); False keeps them on a thread.
    ``max_concurrent_checkpoints``: checkpoints whose asynchronous phase may still run when the
    next barrier is due (Flink's ``maxConcurrentCheckpoints``; thread execution, see
    :mod:`state_engine.runtime.coordinator`); 1 makes every barrier wait for the previous one.
    ``execution``: ``"threads"`` runs every subtask in the caller's thread (deterministic; for
    tests and debugging), ``"processes"`` runs them in up to min(parallelism, cores) worker
    processes (see :mod:`state_engine.runtime.worker_pool`); None (default) takes
    ``$STATEKEEPER_EXECUTION``, else ``"threads"``.
    """

    name: str
    source: Source
    key_selector: Callable[[Any], Any]
    process_function: KeyedProcessFunction | Callable[[], KeyedProcessFunction]
    sink: Sink
    key_serializer: Any = str
    parallelism: int = 1
    max_parallelism: int = 128
    backend: Any = None
    checkpoint_interval_records: int | None = None
    checkpoint_interval_seconds: float | None = None
    checkpoint_format: str = "canonical"
    retained: int = 3
    incremental: bool = False
    fork_writer: bool = True
    max_concurrent_checkpoints: int = 1
    clock: Clock | None = None
    source_uid: str = "source"
    operator_uid: str = "process"
    sink_uid: str = "sink"
    execution: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidJob(f"a job needs a non-empty name, got {self.name!r}")
        if not isinstance(self.source, Source):
            raise InvalidJob(
                f"job {self.name!r}: source must be a Source (JsonlSource, ParquetSource, "
                f"GeneratorSource), got {type(self.source).__name__}"
            )
        if not isinstance(self.sink, Sink):
            raise InvalidJob(
                f"job {self.name!r}: sink must be a Sink (FileSink, CollectSink), got "
                f"{type(self.sink).__name__}"
            )
        if not callable(self.key_selector):
            raise InvalidJob(f"job {self.name!r}: key_selector must be a callable record -> key")
        fn = self.process_function
        if not isinstance(fn, KeyedProcessFunction) and not callable(fn):
            raise InvalidJob(
                f"job {self.name!r}: process_function must be a KeyedProcessFunction or a factory "
                "of one"
            )
        check_parallelism(self.max_parallelism, self.parallelism)
        if self.checkpoint_format not in FORMAT_OPTIONS:
            raise InvalidJob(
                f"job {self.name!r}: checkpoint_format {self.checkpoint_format!r} is not one of "
                f"{', '.join(FORMAT_OPTIONS)}"
            )
        if type(self.retained) is not int or self.retained < 1:
            raise InvalidJob(f"job {self.name!r}: retained must be an int >= 1")
        if type(self.max_concurrent_checkpoints) is not int or self.max_concurrent_checkpoints < 1:
            raise InvalidJob(f"job {self.name!r}: max_concurrent_checkpoints must be an int >= 1")
        uids = (self.source_uid, self.operator_uid, self.sink_uid)
        if len(set(uids)) != 3 or not all(isinstance(u, str) and u for u in uids):
            raise InvalidJob(
                f"job {self.name!r}: operator uids {uids} must be distinct non-empty strings"
            )
        if self.execution is not None and self.execution not in EXECUTIONS:
            raise InvalidJob(
                f"job {self.name!r}: execution {self.execution!r} is not one of "
                f"{', '.join(EXECUTIONS)}"
            )
        if self.backend is not None and not callable(getattr(self.backend, "create", None)):
            raise InvalidJob(
                f"job {self.name!r}: backend must be a StateBackendFactory (HeapBackendFactory(), "
                f"RocksDBBackendFactory(dir)), got {type(self.backend).__name__}"
            )

    @property
    def checkpointing(self) -> bool:
        return (
            self.checkpoint_interval_records is not None
            or self.checkpoint_interval_seconds is not None
        )

    def new_function(self) -> KeyedProcessFunction:

        fn = self.process_function
        made = copy.deepcopy(fn) if isinstance(fn, KeyedProcessFunction) else fn()
        if not isinstance(made, KeyedProcessFunction):
            raise InvalidJob(
                f"job {self.name!r}: the process_function factory returned "
                f"{type(made).__name__}, not a KeyedProcessFunction"
            )
        return made

    @property
    def execution_mode(self) -> str:
        """``execution``, or ``$STATEKEEPER_EXECUTION`` when it is None, or ``"threads"``."""
        if self.execution is not None:
            return self.execution
        mode = os.environ.get(EXECUTION_ENV, "").strip() or "threads"
        if mode not in EXECUTIONS:
            raise InvalidJob(f"${EXECUTION_ENV}={mode!r} is not one of {', '.join(EXECUTIONS)}")
        return mode

    def with_(self, **changes: Any) -> Job:
        return dataclasses.replace(self, **changes)


#: Flink's name for the same thing.
JobGraph = Job
