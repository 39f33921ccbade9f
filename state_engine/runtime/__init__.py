"""A local job runtime: partitioned sources with offsets in operator state, a keyed process
function with state and timers, exactly-once sinks, and checkpoints, savepoints and restores at
any parallelism through :mod:`state_engine.checkpoint`."""

from state_engine.runtime.clock import RecordDrivenClock, RecordTimestampClock
from state_engine.runtime.coordinator import CheckpointCoordinator
from state_engine.runtime.functions import (
    Context,
    KeyedProcessFunction,
    RuntimeContext,
    TimeDomain,
    TimerService,
)
from state_engine.runtime.job import Job, JobGraph
from state_engine.runtime.keyed_operator import KeyedProcessOperator
from state_engine.runtime.runner import JobResult, JobRunner
from state_engine.runtime.sinks import (
    CollectedOutput,
    CollectSink,
    FileSink,
    Sink,
    SinkTransactions,
    SinkWriter,
)
from state_engine.runtime.source_reader import SourceReader, SourceRecord
from state_engine.runtime.sources import (
    GeneratorSource,
    JsonlSource,
    MalformedPolicy,
    ParquetSource,
    RawRecord,
    Source,
)
from state_engine.runtime.timers import InternalTimerService
from state_engine.runtime.watermarks import MAX_WATERMARK, MIN_WATERMARK, WatermarkStrategy
from state_engine.runtime.worker_pool import ProcessJobRunner

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "ProcessJobRunner",
    "CheckpointCoordinator",
    "CollectSink",
    "CollectedOutput",
    "Context",
    "FileSink",
    "GeneratorSource",
    "InternalTimerService",
    "Job",
    "JobGraph",
    "JobResult",
    "JobRunner",
    "JsonlSource",
    "KeyedProcessFunction",
    "KeyedProcessOperator",
    "MalformedPolicy",
    "ParquetSource",
    "RawRecord",
    "RecordDrivenClock",
    "RecordTimestampClock",
    "RuntimeContext",
    "Sink",
    "SinkTransactions",
    "SinkWriter",
    "Source",
    "SourceReader",
    "SourceRecord",
    "TimeDomain",
    "TimerService",
    "WatermarkStrategy",
]
