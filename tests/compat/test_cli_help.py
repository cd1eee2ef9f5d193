"""``--help`` of the programs that parse with draccus (compat/cli.py, defect 44): each option once."""

import collections
import re

import pytest

from levanter_mars.compat import cli
from levanter_mars.eval.standalone import EvalHarnessMainConfig
from levanter_mars.program_config import TrainAndEvalConfig
from levanter_mars.training.config import parse_config

_OPTION = re.compile(r"^  (--[\w.]+)")


def _help_groups(text: str) -> list[tuple[str, list[str]]]:
    """Each group of a help text (titles repeat: a variant's nested fields) with the options it lists; the usage line
    before them aside."""
    groups: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            groups.append((line, []))
        elif groups and (match := _OPTION.match(line)):
            groups[-1][1].append(match.group(1))
    return groups


def _options(groups: list[tuple[str, list[str]]], title: str = "") -> list[str]:
    return [option for group, options in groups if title in ("", group) for option in options]


def _help(capsys, config_class: type) -> str:
    with pytest.raises(SystemExit) as ended:
        parse_config(["--help"], config_class)
    assert ended.value.code == 0
    return capsys.readouterr().out


def _repeated(options: list[str]) -> list[str]:
    return sorted(o for o, n in collections.Counter(options).items() if n > 1)


def test_defect_44_draccus_lists_a_nested_fields_config_option_twice(capsys):
    import draccus

    with pytest.raises(SystemExit):
        draccus.parse(EvalHarnessMainConfig, args=["--help"])
    groups = _help_groups(capsys.readouterr().out)
    assert _repeated(_options(groups, "options:")) == ["--sample_logging"]


def test_the_evaluations_help_lists_every_option_once(capsys):
    """`python -m levanter_mars.main.eval_harness --help` listed --sample_logging twice (issue 46)."""
    groups = _help_groups(_help(capsys, EvalHarnessMainConfig))
    assert "--sample_logging" in _options(groups, "options:") and "--checkpoint_path" in _options(groups)
    assert _repeated(_options(groups)) == []


def test_the_training_help_lists_every_option_once_per_group(capsys):
    """Training's help lists the fields of each variant of a choice (a data source, a model family) in that
    variant's own group, as draccus means to; within one group, each once."""
    groups = _help_groups(_help(capsys, TrainAndEvalConfig))
    assert "--trainer" in _options(groups, "options:") and len(groups) > 10
    assert [(group, _repeated(options)) for group, options in groups if _repeated(options)] == []


def test_the_workaround_leaves_format_help_as_it_was():
    from draccus.wrappers.suppressing_argparse import SuppressingArgumentParser

    before = SuppressingArgumentParser.format_help
    with cli.help_lists_each_option_once():
        assert SuppressingArgumentParser.format_help is not before
    assert SuppressingArgumentParser.format_help is before
