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
