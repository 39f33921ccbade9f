"""Shared by the Airflow tests and their conftest (a uniquely named module: several folders
have a ``conftest.py``, so importing ``conftest`` by name would be ambiguous)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"
PLUGINS = ROOT / "plugins"
JWT_SECRET = "statekeeper-tests-only-" + "0123456789abcdef" * 4  # HS512 wants >= 64 bytes


class MovableClock:
    """The catalog's clock, set by hand: snapshots created 'two hours ago' without waiting."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


@dataclass(frozen=True)
class Seeded:
    url: str
    completed_id: int
    older_completed_id: int
    stale_pending_id: int
    fresh_pending_id: int
