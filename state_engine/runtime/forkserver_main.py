"""Loads the parent's main script into the forkserver process, when :func:`prestart` asks.

``set_forkserver_preload(["__main__"])`` is meant to load the main script once, in the process
every worker is forked from. Before Python 3.13 it never does (CPython gh-126631: the forkserver
looks for a ``main_path`` that ``spawn.get_preparation_data`` stopped providing in 3.4), so every
worker ran the whole script again when it started: a script that loads its data at import time
paid that once per worker. :func:`prestart` names the script (and the ``sys.path`` it runs with)
in :data:`ENV_VAR`, and this module, preloaded first, loads it as ``__mp_main__`` the way the
forkserver would have, so each worker's own preparation sees it loaded and skips it.
"""

from __future__ import annotations

import json
import os
import sys
from multiprocessing import process, spawn

ENV_VAR = "STATEKEEPER_FORKSERVER_MAIN"


def _load_main() -> None:
    # taken out of the environment: the workers forked from here, and anything they start,
    # must not load the script again
    spec = os.environ.pop(ENV_VAR, None)
    if not spec:
        return
    wanted = json.loads(spec)
    path = wanted["main_path"]
    if getattr(sys.modules["__main__"], "__file__", None) == path:
        return  # loaded already: a Python that preloads __main__ itself
    sys.path[:] = wanted["sys_path"]
    current = process.current_process()
    current._inheriting = True  # type: ignore[attr-defined]  # what the forkserver sets
    try:
        spawn.import_main_path(path)
    except (Exception, SystemExit):  # noqa: BLE001
        # A script that fails here would take the forkserver down with it: leave it to each
        # worker instead, which loads it again (and reports its error) as without the preload.
        sys.modules.pop("__mp_main__", None)
    finally:
        del current._inheriting  # type: ignore[attr-defined]  # as above


_load_main()
