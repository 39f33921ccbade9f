"""Which Flink jobs the ``statekeeper_flink_sync`` DAG imports: a JSON mapping, job name -> dirs.

From the Airflow Variable ``statekeeper_flink_jobs`` or, when it is unset, the JSON file named by
``STATEKEEPER_FLINK_JOBS_FILE``; the format (``checkpoint_dir``, ``savepoint_dirs``,
``flink_job_id``, ``rest_url``, ``manage``) is in ``docs/operations.md``, "From Airflow".
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any

from state_engine.catalog.models import JOB_ACTIONS
from state_engine.errors import ConfigurationError

VARIABLE = "statekeeper_flink_jobs"
FILE_SETTING = "STATEKEEPER_FLINK_JOBS_FILE"


@dataclass(frozen=True)
class FlinkJobConfig:
    name: str
    checkpoint_dir: str | None = None
    savepoint_dirs: tuple[str, ...] = ()
    flink_job_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: the job's management policy, set at every sync; None: the catalog's (read-only when new)
    manage: tuple[str, ...] | None = None

    @property
    def paths(self) -> list[str]:
        """Every directory to import, the checkpoint directory first."""
        return ([self.checkpoint_dir] if self.checkpoint_dir else []) + list(self.savepoint_dirs)

    @property
    def job_id(self) -> str | None:
        if self.flink_job_id:
            return self.flink_job_id
        if self.checkpoint_dir:
            return posixpath.basename(self.checkpoint_dir.rstrip("/")) or None
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "checkpoint_dir": self.checkpoint_dir,
            "savepoint_dirs": list(self.savepoint_dirs),
            "flink_job_id": self.job_id,
            **({} if self.manage is None else {"manage": list(self.manage)}),
        }


def parse_jobs_config(value: Any, source: str) -> list[FlinkJobConfig]:
    """The jobs of a mapping (or its JSON text); a clear error naming ``source`` otherwise."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigurationError(f"{source} is not JSON ({exc}); see {__name__}") from None
    if not isinstance(value, dict):
        raise ConfigurationError(
            f"{source} must be a JSON object of job name -> {{checkpoint_dir, savepoint_dirs}}"
        )
    out = []
    for name, spec in sorted(value.items()):
        if not isinstance(spec, dict):
            raise ConfigurationError(f"{source}: job {name!r} must map to an object")
        ckpt = spec.get("checkpoint_dir")
        sps = spec.get("savepoint_dirs") or []
        if isinstance(sps, str):
            sps = [sps]
        if ckpt is not None and not isinstance(ckpt, str):
            raise ConfigurationError(f"{source}: job {name!r}: checkpoint_dir must be a string")
        if not isinstance(sps, list) or not all(isinstance(s, str) and s for s in sps):
            raise ConfigurationError(f"{source}: job {name!r}: savepoint_dirs must be strings")
        if not ckpt and not sps:
            raise ConfigurationError(
                f"{source}: job {name!r} names no directory; give checkpoint_dir and/or "
                "savepoint_dirs"
            )
        known = {"checkpoint_dir", "savepoint_dirs", "flink_job_id", "manage"}
        out.append(
            FlinkJobConfig(
                str(name),
                ckpt or None,
                tuple(sps),
                spec.get("flink_job_id") or None,
                {k: v for k, v in spec.items() if k not in known},
                _manage(spec.get("manage"), name, source),
            )
        )
    return out


def _manage(value: Any, name: str, source: str) -> tuple[str, ...] | None:
    """A job's ``manage``: a list of actions (or their comma-separated text); [] is read-only."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [a.strip() for a in value.split(",") if a.strip()]
    if not isinstance(value, list) or not all(a in JOB_ACTIONS for a in value):
        raise ConfigurationError(
            f"{source}: job {name!r}: manage must list actions of {', '.join(JOB_ACTIONS)} "
            f"(empty: read-only), got {value!r}"
        )
    return tuple(value)


def load_jobs_config(variable: str | None = None) -> list[FlinkJobConfig]:
    """The configured jobs: ``variable`` (the Variable's text) if set, else the settings file."""
    if variable is not None and variable.strip():
        return parse_jobs_config(variable, f"Airflow Variable {VARIABLE!r}")
    path = os.environ.get(FILE_SETTING, "").strip()
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigurationError(f"{FILE_SETTING}={path!r} cannot be read: {exc}") from None
    return parse_jobs_config(text, f"{FILE_SETTING} file {path!r}")
