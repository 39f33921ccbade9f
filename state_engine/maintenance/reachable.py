"""Which storage URLs Spark's executors reach, and under which URL.

Statekeeper addresses storage with fsspec URLs; Spark reads through Hadoop file systems. The two
agree on ``file://``, ``gs://`` and ``hdfs://``; S3 is ``s3a://`` on the Hadoop side. Storage that
lives inside one Python process (``memory://``) or whose scheme Hadoop does not know cannot be
reached by Spark's executors at all, and is refused up front instead of failing in a task.
"""

from __future__ import annotations

import re
from pathlib import Path

from state_engine.errors import ConfigurationError, StorageNotReachableFromSpark

_SCHEMES = {"file": "file", "s3": "s3a", "s3a": "s3a", "s3n": "s3a", "gs": "gs", "hdfs": "hdfs"}
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def spark_url(url: str) -> str:
    """The URL under which Spark (Hadoop file systems) reaches the fsspec URL ``url``.

    ``file://`` stays, ``s3://`` becomes ``s3a://``, ``gs://`` and ``hdfs://`` stay, a plain path
    becomes an absolute ``file://`` URL. Anything else raises StorageNotReachableFromSpark.
    """
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(
            f"storage URL {url!r} is empty; use e.g. 'file:///var/lib/checkpoints' or "
            "'s3://bucket/checkpoints'"
        )
    match = _SCHEME_RE.match(url)
    if match is None:
        return Path(url).expanduser().resolve().as_uri()
    scheme = match.group(1).lower()
    target = _SCHEMES.get(scheme)
    if target is None:
        raise StorageNotReachableFromSpark(
            f"storage URL {url!r} uses scheme {scheme!r}, which Spark's executors cannot reach"
            + (" (it lives inside one Python process)" if scheme == "memory" else "")
            + "; keep checkpoints on a shared file system or object store Spark can open: "
            "file:// (local mode or a shared mount), s3:// (read as s3a://), gs:// or hdfs://"
        )
    return target + url[match.end(1) :]


def check_reachable(url: str) -> str:
    """``spark_url`` for its error; returns the URL unchanged for fsspec use."""
    spark_url(url)
    return url
