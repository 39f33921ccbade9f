"""Flink's directory layout, and the names Statekeeper gives what it finds there.

A job's checkpoint directory ``<checkpoint-dir>/<job-id>`` holds a ``chk-<id>/`` per retained
checkpoint (its ``_metadata``, written last, and its exclusive files), ``shared/`` (RocksDB files
several incremental checkpoints reference) and ``taskowned/`` (files the task managers own and
delete themselves). A savepoint is a directory of its own, ``savepoint-<job id prefix>-<random>``,
holding its ``_metadata``. Statekeeper's own layout uses the same names: ``_metadata``,
``shared`` and the ``chk-<id>`` rule are the snapshot layer's, imported here.
"""

from __future__ import annotations

import re

from state_engine.checkpoint_dirs import (
    CHECKPOINT_DIR_PATTERN,
    CHECKPOINT_DIR_PREFIX,
    checkpoint_id_of,
    is_checkpoint_dir,
)
from state_engine.snapshot.storage import METADATA_FILE, SHARED_DIR

__all__ = [
    "CHECKPOINT_DIR_PREFIX",
    "JOB_DIR_PARTS",
    "KIND_EXCLUSIVE",
    "KIND_FOREIGN",
    "KIND_INLINE",
    "KIND_SHARED",
    "KIND_TASKOWNED",
    "METADATA_FILE",
    "RELOCATABLE_TAIL",
    "ROLE_CHANGELOG",
    "ROLE_CHANNEL_STATE",
    "ROLE_CHECKPOINTS",
    "ROLE_COORDINATOR",
    "ROLE_KEYED_STATE",
    "ROLE_META",
    "ROLE_OPERATOR_STATE",
    "ROLE_PRIVATE",
    "ROLE_SAVEPOINT",
    "ROLE_SAVEPOINTS",
    "ROLE_SHARED",
    "SAVEPOINT_DIR_PREFIX",
    "SHARED_DIR",
    "TASKOWNED_DIR",
    "checkpoint_id_of",
    "is_checkpoint_dir",
]

TASKOWNED_DIR = "taskowned"
#: what a job's checkpoint directory holds beside its ``chk-<id>`` directories
JOB_DIR_PARTS = (SHARED_DIR, TASKOWNED_DIR)
SAVEPOINT_DIR_PREFIX = "savepoint-"

#: ``<job-id>/{shared,taskowned,chk-N}/[<dir>/]<name>`` at the end of a path: group 1 the job
#: id, 2 the job directory's part, 3 the rest. File merging (FLIP-306) keeps its physical files
#: one directory deeper (``shared/job_<id>_op_<op>_<i>_<p>/``, ``taskowned/job_<id>_tm_<tm>/``).
RELOCATABLE_TAIL = re.compile(
    rf"/([^/]+)/({SHARED_DIR}|{TASKOWNED_DIR}|{CHECKPOINT_DIR_PATTERN})/((?:[^/]+/)?[^/]+)$"
)

# What a directory a job's snapshots are imported from is (its role in sk_job_dirs).
ROLE_CHECKPOINTS = "flink-checkpoints"  # a job's checkpoint directory
ROLE_SAVEPOINTS = "flink-savepoints"  # a directory of savepoint directories
ROLE_SAVEPOINT = "flink-savepoint"  # one savepoint directory

# Why a snapshot references a file (FileReference.role).
ROLE_COORDINATOR = "coordinator"
ROLE_OPERATOR_STATE = "operator-state"
ROLE_KEYED_STATE = "keyed-state"
ROLE_META = "meta"
ROLE_SHARED = "shared"
ROLE_PRIVATE = "private"
ROLE_CHANNEL_STATE = "channel-state"
ROLE_CHANGELOG = "changelog"

# Where a referenced file lives (StreamHandle.kind).
KIND_INLINE = "inline"  # bytes inside _metadata: no file
KIND_EXCLUSIVE = "exclusive"  # the snapshot's own directory
KIND_SHARED = "shared"  # <job>/shared
KIND_TASKOWNED = "taskowned"  # <job>/taskowned
KIND_FOREIGN = "foreign"  # anywhere else (another checkpoint, a NO_CLAIM ancestor's directory)
