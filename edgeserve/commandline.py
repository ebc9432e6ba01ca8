"""argparse as edgeserve's command line refuses: with the error tree's exit code for a bad
argument, the refusing command's own usage, and the nearest choice or option to one mistyped."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from edgeserve.errors import ConfigError

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)$")


class Parser(argparse.ArgumentParser):
    """argparse, exiting on a bad argument with the error tree's code for one (ConfigError's),
    as every other refusal of the command line does, and naming the nearest choice or option
    to one mistyped (`biuld`, `--prot`), as git does."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ConfigError.exit_code, f"{self.prog}: error: {_suggested(message)}\n")

    def unrecognized(self, extras: Sequence[str]) -> NoReturn:
        """Arguments no option of this command takes (argparse reports them from the top-level
        parser, with its usage and none of the command's options)."""
        options = [name for action in self._actions for name in action.option_strings]
        hints = []
        for extra in extras:
            near = difflib.get_close_matches(extra.split("=")[0], options, n=1)
            if extra.startswith("-") and near:
                hints.append(near[0])
        hint = f" (did you mean {', '.join(hints)}?)" if hints else ""
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def _suggested(message: str) -> str:
    """An invalid choice's message with the nearest choice, if one is near."""
    match = _INVALID_CHOICE.search(message)
    if match is None:
        return message
    choices = [choice.strip("'") for choice in match["choices"].split(", ")]
    near = difflib.get_close_matches(match["given"], choices, n=1)
    return f"{message}; did you mean '{near[0]}'?" if near else message


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, where arguments no option takes are refused by the command
    they were given to, with its usage and the option meant."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = parser  # the command named (nested ones too, were there any)
        for word in sys.argv[1:] if argv is None else argv:
            command = _commands(command).get(word, command)
        assert isinstance(command, Parser)
        command.unrecognized(extras)
    return args


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subcommands only there
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
