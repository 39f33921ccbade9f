"""Catalog ids and counts from users: whole numbers inside the catalog's signed 64-bit columns."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from state_engine.errors import InvalidJobParams

#: The largest id (and count) a catalog column holds: a signed 64-bit integer.
MAX_ID = (1 << 63) - 1


def check_id(value: object, what: str = "snapshot id", low: int = 1) -> int:
    """``value`` (an int or its digits) as an int from ``low`` to :data:`MAX_ID`, else
    InvalidJobParams in one line."""
    try:
        if isinstance(value, bool | float):
            raise ValueError
        number = int(str(value).strip()) if isinstance(value, str) else int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidJobParams(
            f"{what} {value!r} is not a whole number; use a number from {low} to {MAX_ID}"
        ) from None
    if not low <= number <= MAX_ID:
        raise InvalidJobParams(
            f"{what} {number} is out of range; use a number from {low} to {MAX_ID}"
        )
    return number


def id_arg(what: str = "snapshot id", low: int = 1) -> Callable[[str], int]:
    """An argparse ``type=`` for an id (or, with ``low=0``, a count such as ``--limit``)."""

    def parse(text: str) -> int:
        try:
            return check_id(text, what, low)
        except InvalidJobParams as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what  # argparse names the type in its messages
    return parse
