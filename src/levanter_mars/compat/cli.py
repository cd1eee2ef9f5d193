"""argparse, as draccus drives it (defects 19 and 44)."""

from __future__ import annotations

import argparse
import contextlib
import difflib
from typing import Iterator

from levanter_mars.compat.patching import patched


@contextlib.contextmanager
def argparse_errors_raise(error_class: type[Exception]) -> Iterator[None]:
    """argparse's ``error`` prints the whole usage (some 240 lines of fields) before the one line that matters and
    exits; meanwhile it raises ``error_class`` instead, with the closest known flag for each unrecognized one."""

    def error(parser: argparse.ArgumentParser, message: str):
        known = [flag for action in parser._actions for flag in action.option_strings]
        hints = []
        for token in message.split():
            if token.startswith("--") and token not in known:
                close = difflib.get_close_matches(token.split("=", 1)[0], known, n=1, cutoff=0.75)
                if close:
                    hints.append(f"{token}: did you mean {close[0]}?")
        raise error_class("; ".join([message, *hints]) + f" (`{parser.prog} --help` lists every field)")

    with patched(argparse.ArgumentParser, error=error):
        yield


def _without_superseded_repeats(parser: argparse.ArgumentParser, actions: list) -> list:
    """A group's ``actions`` less those that argparse replaced (registered again later, draccus' conflict handling)
    whose option strings the group already shows."""
    live = set(map(id, parser._actions))
    shown = {tuple(a.option_strings) for a in actions if id(a) in live}
    kept = []
    for action in actions:
        if id(action) not in live:
            if tuple(action.option_strings) in shown:
                continue
            shown.add(tuple(action.option_strings))
        kept.append(action)
    return kept


@contextlib.contextmanager
def help_lists_each_option_once() -> Iterator[None]:
    """Defect 44. draccus registers the config-file option of a nested dataclass field twice (the parent adds
    ``--<field>``, the field's own wrapper ``--<field>`` again); argparse keeps the second, and draccus keeps the first
    in its help on purpose (for the options of a choice type's other variants, which it shows in their own groups), so
    ``--help`` lists the option twice in one group. Meanwhile, a group's help shows such a repeat once."""
    from draccus.wrappers.suppressing_argparse import SuppressingArgumentParser

    format_help = SuppressingArgumentParser.format_help

    def format_help_once(parser: argparse.ArgumentParser) -> str:
        saved = [(group, group._group_actions) for group in parser._action_groups]
        for group, actions in saved:
            group._group_actions = _without_superseded_repeats(parser, actions)
        try:
            return format_help(parser)
        finally:
            for group, actions in saved:
                group._group_actions = actions

    with patched(SuppressingArgumentParser, format_help=format_help_once):
        yield
