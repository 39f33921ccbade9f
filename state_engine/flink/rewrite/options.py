"""What a rewrite of a Flink snapshot changes, and the refusal raised when that cannot be done."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from state_engine.errors import FlinkStateError

__all__ = ["RewriteOptions", "RewriteRefused"]


class RewriteRefused(FlinkStateError):
    """Options that do not fit the snapshot; the message says what was wrong and what to do."""


@dataclass(frozen=True)
class RewriteOptions:
    """The changes of one rewrite; every field left at its default keeps the snapshot as is.

    * ``parallelism``: new parallelism of every keyed operator (None: keep each one's).
    * ``max_parallelism``: new job-wide max parallelism (None: keep).
    * ``ttl``: state name -> TTL in ms; entries with ``lastAccessTimestamp + ttl <= at`` go.
    * ``at``: epoch ms the TTL is measured at (None: now).
    * ``drop_states``: ``"STATE"`` (in every operator) or ``"UID/STATE"``.
    * ``drop_operators``: uid or hex OperatorID whose state goes (the operator stays, empty).
    * ``uids``: old uid or hex OperatorID -> new uid (the OperatorID follows the new uid).
    """

    parallelism: int | None = None
    max_parallelism: int | None = None
    ttl: Mapping[str, int] = field(default_factory=dict)
    at: int | None = None
    drop_states: tuple[str, ...] = ()
    drop_operators: tuple[str, ...] = ()
    uids: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ttl", dict(self.ttl or {}))
        object.__setattr__(self, "uids", dict(self.uids or {}))
        object.__setattr__(self, "drop_states", tuple(self.drop_states))
        object.__setattr__(self, "drop_operators", tuple(self.drop_operators))

    @property
    def changes_state(self) -> bool:
        """Whether any keyed state must be rewritten (anything but a parallelism change)."""
        return bool(
            self.max_parallelism is not None
            or self.ttl
            or self.drop_states
            or self.drop_operators
            or self.uids
        )
