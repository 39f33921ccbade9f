"""One catalog per app, opened on first use.

Opening checks the schema is at head. A failed open is not cached: once someone runs
``statectl catalog upgrade`` (or the database comes back), the next request succeeds without
restarting the API server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from state_engine.catalog import Catalog
from state_engine.config import Settings


def open_from_env() -> Catalog:
    return Catalog.from_settings(Settings.from_env())


class CatalogHolder:
    def __init__(self, opener: Callable[[], Catalog] = open_from_env) -> None:
        self._opener = opener
        self._catalog: Catalog | None = None
        self._lock = threading.Lock()

    def get(self) -> Catalog:
        catalog = self._catalog
        if catalog is not None:
            return catalog
        # Requests run in a threadpool: only one of them opens the engine.
        with self._lock:
            if self._catalog is None:
                self._catalog = self._opener()
            return self._catalog

    def close(self) -> None:
        with self._lock:
            if self._catalog is not None:
                self._catalog.close()
                self._catalog = None
