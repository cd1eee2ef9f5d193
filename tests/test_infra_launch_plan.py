"""The Ray launcher's plan without a cluster, as a newcomer reads it (issue 46): the driver's note on one-shot
actions only when one was asked for, TPU type spellings, and the pre-flight table in the dry run."""

import shlex

import draccus
import pytest

from levanter_mars.infra import pod
from levanter_mars.infra.config import split_overrides
from tests.helpers.ray_launch import contact_nothing, dry_run  # noqa: F401 - an autouse fixture

SMALL = "config/gpt2_small_mars.yaml"
BUCKET = ["--trainer.checkpointer.base_path", "gs://test-bucket/ckpt", "--data.cache_dir", "gs://test-bucket/tok"]


def _driver_config(plan: dict) -> pod.PodConfig:
    """The job's driver (pod.py) config, parsed from the entrypoint as the driver parses it."""
    entry = shlex.split(plan["ray_job"]["entrypoint"])
    own, _ = split_overrides(entry[entry.index("levanter_mars.infra.pod") + 1 :])
    return draccus.parse(pod.PodConfig, args=own)


@pytest.mark.parametrize("overrides, asked", [((), False), (("--fresh", "false"), False), (("--fresh", "true"), True)])
def test_the_driver_notes_one_shot_actions_only_when_one_was_asked_for(capsys, overrides, asked):
    """Every launch logged `one-shot actions (fresh=true) apply to its first attempt only`, `--fresh false` too."""
    plan, config, _ = dry_run(capsys, "--config_path", SMALL, "--tpu_type", "v4-8", "--", *BUCKET, *overrides)
    assert config["fresh"] is asked
    note = pod.one_shot_actions_note(_driver_config(plan), "launch-1")
    if asked:
        assert note == "launch launch-1: one-shot actions (fresh=true) apply to its first attempt only"
    else:
        assert note is None


def test_v5e_n_is_read_as_v5litepod_n_once_where_the_command_line_is_parsed(capsys):
    """`--tpu_type v5e-16` was refused without a suggestion, where v6e takes `v6e-16`: Google Cloud's docs use both."""
    from levanter_mars.infra.config import RayLaunchConfig, parse_args
    from levanter_mars.main.preflight import _parser

    plan, _, _ = dry_run(capsys, "--config_path", SMALL, "--tpu_type", "v5e-16", "--", *BUCKET)
    assert plan["tpu_type"] == "v5litepod-16" and plan["hosts"]["per_slice"] == 4
    assert plan["resources"]["per_slice"] == {"TPU-v5litepod-16-head": 1}
    assert _driver_config(plan).tpu_type == "v5litepod-16"  # what Levanter's scheduler is handed
    launch, _ = parse_args(["--config_path", SMALL, "--tpu_type", "v5e-16"], RayLaunchConfig)
    assert launch.tpu_type == "v5litepod-16"
    assert _parser().parse_args(["--config_path", SMALL, "--tpu_type", "v5e-16"]).tpu_type == "v5litepod-16"
    assert _parser().parse_args(["--config_path", SMALL, "--tpu_type", "v6e-16"]).tpu_type == "v6e-16"


@pytest.mark.parametrize("typed, suggested", [("v4-33", "v4-32"), ("v6e16", "v6e-16"), ("V5E-16", "v5e-16"),
                                              ("v5lite-16", "v5litepod-16")])  # fmt: skip
def test_an_unknown_tpu_type_is_refused_with_the_closest_known_spelling(capsys, typed, suggested):
    from levanter_mars.infra import launch

    argv = ["--dry_run", "--skip_preflight", "--config_path", SMALL, "--tpu_type", typed, "--", *BUCKET]
    assert launch.cli(argv) == 2
    out, err = capsys.readouterr()
    assert f"--tpu_type: unknown slice type {typed!r}; did you mean {suggested!r}?" in err, err
    assert out == ""


#: Pre-flight's table as it prints it (`python -m levanter_mars.main.preflight ... --tpu_type v4-8`, one layer).
PREFLIGHT_TABLE = """\
pre-flight: config/gpt2_small_mars.yaml on 1 x v4-8 (topology v4:2x2x1, 4 chips, 4 JAX devices per slice, TPU compiler)
  per chip        parameters     0.04 GiB
                  optimizer      0.13 GiB
                  total          1.70 GiB   of 30.75 GiB usable (32 GiB HBM), headroom 29.05 GiB
  compile         132 s
  verdict         fits"""


def test_the_dry_run_shows_the_pre_flight_table_as_it_prints(capsys, monkeypatch):
    """It was one quoted line of `\\n` escapes inside the plan's YAML."""
    import yaml

    from levanter_mars.infra import launch

    monkeypatch.setattr(launch, "preflight_run", lambda run, working_dir, skip: (0, PREFLIGHT_TABLE))
    code = launch.cli(["--dry_run", "--config_path", SMALL, "--tpu_type", "v4-8", "--", *BUCKET])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "\\n" not in out.split("---")[0]
    shown = out.split("\npreflight: ", 1)[1].splitlines()
    assert shown[0].startswith("|")  # a block literal: each line of the table on its own line, indented
    body = [line.removeprefix("  ") for line in shown[1 : 1 + len(PREFLIGHT_TABLE.splitlines())]]
    assert body == PREFLIGHT_TABLE.splitlines()
    assert next(yaml.safe_load_all(out))["preflight"].rstrip("\n") == PREFLIGHT_TABLE
