"""The value types of the command line's options (argparse `type=`): each turns one text into
a value or says, in the option's words, what was expected."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable


def numbers(kind: Callable[[str], float]) -> Callable[[str], list[float]]:
    """An argparse type for comma lists: `1,4,16` -> [1, 4, 16]."""

    def parse(text: str) -> list[float]:
        return [kind(part) for part in text.split(",") if part.strip()]

    return parse


def seconds(text: str) -> float:
    """An argparse type for a time bound: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of seconds")
    return value


_HEADER = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[ \t]*([^\r\n]*)")


def header(text: str) -> tuple[str, str]:
    """An argparse type for a request header, as curl -H takes it: `NAME: VALUE`."""
    match = _HEADER.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected 'NAME: VALUE', as 'Authorization: Bearer TOKEN'"
        )
    return match[1], match[2]


def at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An argparse type for a count of things: an integer >= `minimum` (`why`: the reason)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number >= {minimum}{why}")
        return value

    return parse


count = at_least(1)


def port(text: str) -> int:
    """An argparse type for TCP ports: 1-65535, or 0 for any free port."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a TCP port: expected 1-65535, or 0 for any free port"
        )
    return value
