"""``chk-<id>``: the one rule for what a checkpoint's directory is called.

Flink names a checkpoint's directory ``chk-`` and the checkpoint id in decimal
(``AbstractFsCheckpointStorageAccess``: ``CHECKPOINT_DIR_PREFIX + checkpointId``), and so does
Statekeeper's own layout. An id has one spelling there: ASCII digits, no sign, no leading zero
(``chk-0`` is checkpoint 0, ``chk-01`` no checkpoint's). A leaf module, so that the snapshot
layer and the Flink reader above it ask the same question the same way.
"""

from __future__ import annotations

import re

CHECKPOINT_DIR_PREFIX = "chk-"
#: the rule as a regular expression without anchors, for patterns that embed a directory name
CHECKPOINT_DIR_PATTERN = r"chk-(?:0|[1-9][0-9]*)"

_CHECKPOINT_DIR = re.compile(r"chk-(0|[1-9][0-9]*)")


def checkpoint_dir_name(checkpoint_id: int) -> str:
    """The directory name of checkpoint ``checkpoint_id`` (``chk-7``)."""
    return f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id}"


def checkpoint_id_of(name: str) -> int | None:
    """The checkpoint id a directory ``name`` (one path component) stands for, or None."""
    m = _CHECKPOINT_DIR.fullmatch(name)
    return None if m is None else int(m.group(1))


def is_checkpoint_dir(name: str) -> bool:
    """Whether ``name`` (one path component, no slash) is a checkpoint's directory."""
    return _CHECKPOINT_DIR.fullmatch(name) is not None
