"""Defect 19: argparse exits on a bad flag; ``levanter_mars.compat.cli`` makes it raise."""

import pytest

from levanter_mars.compat import cli


def test_defect_19_argparse_prints_its_whole_usage_and_exits_and_the_workaround_raises(capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="train")
    parser.add_argument("--trainer.num_train_steps")
    with pytest.raises(SystemExit):
        parser.parse_args(["--trainer.num_trian_steps", "3"])
    assert "usage: train" in capsys.readouterr().err

    class Refused(Exception):
        pass

    with cli.argparse_errors_raise(Refused), pytest.raises(Refused, match="did you mean --trainer.num_train_steps"):
        parser.parse_args(["--trainer.num_trian_steps", "3"])
    with pytest.raises(SystemExit):  # restored
        parser.parse_args(["--nope"])
