"""The one rule for job names, checked wherever a name enters (import, runtime, Airflow)."""

from __future__ import annotations

from state_engine.errors import InvalidJobName

MAX_JOB_NAME_LENGTH = 200
JOB_NAME_RULE = (
    f"a job name is 1 to {MAX_JOB_NAME_LENGTH} printable characters (letters, digits, "
    "punctuation, inner spaces) without '/', '\\' or '..', not starting with '.' and without "
    "leading or trailing spaces"
)


def _problem(name: str) -> str | None:
    if not name:
        return "is empty"
    if len(name) > MAX_JOB_NAME_LENGTH:
        return f"is {len(name)} characters long"
    unprintable = sorted({c for c in name if not c.isprintable()})
    if unprintable:
        return f"holds unprintable characters {''.join(unprintable)!r}"
    if "/" in name or "\\" in name or ".." in name:
        return "holds a path separator or '..', which could leave the checkpoint root"
    if name.startswith("."):
        return "starts with '.'"
    if name != name.strip():
        return "has a leading or trailing space"
    return None


def check_job_name(name: object) -> str:
    """``name`` if it follows :data:`JOB_NAME_RULE`, else InvalidJobName saying the rule."""
    if not isinstance(name, str):
        raise InvalidJobName(f"job name {name!r} is not a string; {JOB_NAME_RULE}")
    problem = _problem(name)
    if problem is not None:
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise InvalidJobName(f"job name {shown!r} {problem}; {JOB_NAME_RULE}")
    return name
