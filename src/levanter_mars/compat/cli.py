"""argparse, as draccus drives it (defect 19)."""

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
