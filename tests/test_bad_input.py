"""Bad input is refused before anything is compiled, with a message naming the field or file."""

import errno
import os
import subprocess
import sys
from dataclasses import dataclass

import optax
import pytest
from levanter.optim import OptimizerConfig

from levanter_mars.optim.levanter_config import MarsAdamWConfig
from levanter_mars.training.config import ConfigError
from levanter_mars.training.trainer import MarsTrainerConfig
from levanter_mars.training.validation import check_mesh, check_optimizer
from tests.helpers.training import REPO, run_cli_in_process, run_paths, tiny_config
from tests.helpers.xla_flags import device_flags


@pytest.fixture
def config(tmp_path, pydocs_corpus):
    return tiny_config(tmp_path, pydocs_corpus, "bad")


def _assert_nothing_started(tmp_path):
    paths = run_paths(tmp_path, "bad")
    assert not paths["metrics"].exists()
    assert not any(paths["checkpoints"].glob("step-*")) if paths["checkpoints"].exists() else True


@pytest.mark.parametrize(
    "yaml_extra,expected",
    [
        ({"optimizer": {"gama": 0.1}}, "gama"),
        ({"trainer": {"num_train_stepz": 3}}, "num_train_stepz"),
        ({"optimizer": {"type": "mars-adamv"}}, "mars-adamv"),
        ({"optimizer": {"beta1": 1.0}}, "optimizer.beta1"),
        ({"optimizer": {"beta2": -0.5}}, "optimizer.beta2"),
        ({"optimizer": {"gamma": 3.0}}, "optimizer.gamma"),
        ({"optimizer": {"learning_rate": -1e-3}}, "optimizer.learning_rate"),
        ({"optimizer": {"learning_rate": float("inf")}}, "optimizer.learning_rate must be >= 0 and finite"),
        ({"optimizer": {"lr_schedule": "cosin"}}, "optimizer.lr_schedule must be one of"),
        ({"optimizer": {"warmup": -0.5}}, "optimizer.warmup"),
        ({"optimizer": {"decay": 1.5}}, "optimizer.decay"),
        ({"optimizer": {"warmup": 500}}, "trainer.num_train_steps=30"),
        ({"trainer": {"checkpointer": {"keep": [{"every": -1}]}}}, "trainer.checkpointer.keep[0].every"),
        ({"trainer": {"checkpointer": {"keep": [{"every:100": None}]}}}, "trainer.checkpointer.keep[0] must be"),
        ({"trainer": {"nonfinite": "ignore"}}, "trainer.nonfinite"),
        ({"trainer": {"model_axis_size": 3}}, "trainer.model_axis_size"),
        ({"trainer": {"preemption_grace_s": 0}}, "trainer.preemption_grace_s must be a number of seconds > 0"),
        ({"trainer": {"preemption_grace_s": -5.0}}, "trainer.preemption_grace_s"),
        ({"model": {"num_heads": 3}}, "model.hidden_dim"),
        ({"data": {"tokenizer": "/nonexistent/tokenizer"}}, "data.tokenizer"),
        ({"log_entropy": True}, "log_entropy is not supported"),
        ({"embedded_corpus_sources": "everything"}, "embedded_corpus_sources must be one of ('stdlib', 'installed')"),
        ({"data": {"cache_dir": "/nonexistent/cache", "train_urls": ["/nonexistent/train.jsonl"]}},
         "data.train_urls[0]"),
    ],
)
def test_bad_config_fails_fast_naming_the_field(tmp_path, pydocs_corpus, capsys, yaml_extra, expected):
    config = tiny_config(tmp_path, pydocs_corpus, "bad", yaml_extra)
    code, output = run_cli_in_process(capsys, config)
    assert code == 2, output[-2000:]
    assert expected in output, output[-2000:]
    _assert_nothing_started(tmp_path)


def test_storage_the_run_cannot_write_is_exit_5_naming_the_field(tmp_path, pydocs_corpus, capsys):
    """A failed write probe is unusable storage (5), not a bad config (2): on a pod the same probe fails on a passing
    failure of the storage service at an attempt's start, which a launcher retries a bounded number of times. Only a
    path no retry can write is a config error (tests/test_reliability.py: a file where the directory must be)."""
    config = tiny_config(tmp_path, pydocs_corpus, "bad", {"hf_save_path": "/proc/no-exports-here", "hf_save_steps": 10})
    code, output = run_cli_in_process(capsys, config)
    assert code == 5, output[-2000:]
    assert "hf_save_path: cannot write HF exports" in output, output[-2000:]
    _assert_nothing_started(tmp_path)


def test_misspelled_command_line_flag(config, capsys):
    code, output = run_cli_in_process(capsys, config, "--optimizer.gama", "0.1")
    assert code == 2 and "--optimizer.gama" in output
    assert "did you mean --optimizer.gamma?" in output
    assert "usage:" not in output  # the one line that matters, not argparse's ~240 lines of fields


def test_missing_config_file(tmp_path, capsys):
    code, output = run_cli_in_process(capsys, tmp_path / "nope.yaml")
    assert code == 2 and "nope.yaml" in output


def test_batch_not_divisible_by_data_parallel_size():
    trainer = MarsTrainerConfig(train_batch_size=12)
    with pytest.raises(ConfigError, match="trainer.train_batch_size=12 is not divisible by the data-parallel size 8"):
        check_mesh(trainer, device_count=8)
    with pytest.raises(ConfigError, match="per_device_parallelism"):
        check_mesh(MarsTrainerConfig(train_batch_size=16, per_device_parallelism=3), device_count=8)
    check_mesh(MarsTrainerConfig(train_batch_size=16, model_axis_size=2), device_count=8)  # 16 % 4 == 0


def test_batch_check_on_eight_simulated_devices(config):
    env = dict(os.environ, XLA_FLAGS=device_flags(8), PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
    proc = subprocess.run(
        [sys.executable, "-m", "levanter_mars.main.train_lm", "--config_path", str(config),
         "--trainer.train_batch_size", "12"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "trainer.train_batch_size=12" in proc.stderr


@OptimizerConfig.register_subclass("test-exact-behind-a-plain-transform")
@dataclass(frozen=True)
class _ExactBehindPlainTransform(MarsAdamWConfig):
    """A chain that wraps MARS in a plain GradientTransformation, which drops obj_fn."""

    def build(self, num_train_steps):
        inner = super().build(num_train_steps)
        return optax.GradientTransformation(inner.init, lambda u, s, p=None: inner.update(u, s, p))


def test_exact_with_a_chain_that_cannot_receive_the_loss_hook():
    with pytest.raises(ConfigError, match="never receives the loss hook"):
        check_optimizer(_ExactBehindPlainTransform(exact=True))
    check_optimizer(MarsAdamWConfig(exact=True))  # the real chain receives it
    check_optimizer(_ExactBehindPlainTransform(exact=False))  # approx does not need it


def test_missing_data_files_behind_an_existing_cache_are_warned_about(tmp_path, caplog):
    """Raw files may be deleted once tokenized, so a cache excuses them, but not silently."""
    from types import SimpleNamespace

    from levanter_mars.training.data.sources import missing_data_paths

    data = SimpleNamespace(cache_dir=str(tmp_path / "cache"), train_urls=[str(tmp_path / "gone.jsonl")],
                           validation_urls=[])
    assert missing_data_paths(data) == [f"data.train_urls[0]: no such file {str(tmp_path / 'gone.jsonl')!r}"]
    (tmp_path / "cache" / "train").mkdir(parents=True)
    (tmp_path / "cache" / "train" / "shard_ledger.json").write_text("{}")
    with caplog.at_level("WARNING"):
        assert missing_data_paths(data) == []
    assert "data.train_urls" in caplog.text and "gone.jsonl" in caplog.text and "existing token cache" in caplog.text


@pytest.mark.parametrize("empty", [("train", "validation"), ("train",), ("validation",)])
def test_empty_data_files_are_a_config_error_naming_the_field_and_file(tmp_path, pydocs_corpus, capsys, empty):
    """An empty train file made Levanter fail after compiling ("Requested indices beyond the end of the dataset"),
    an empty validation file with an IndexError from its eval; through the launcher, each was retried."""
    urls = {}
    for split in ("train", "validation"):
        path = tmp_path / f"{split}.jsonl"
        source = pydocs_corpus / f"{split}.jsonl"
        path.write_text("\n  \n" if split in empty else source.read_text())
        urls[f"{split}_urls"] = [str(path)]
    config = tiny_config(tmp_path, pydocs_corpus, "bad", {"data": {**urls, "cache_dir": str(tmp_path / "tokenized")}})
    code, output = run_cli_in_process(capsys, config)
    assert code == 2, output[-3000:]
    first = empty[0]
    line = next(line for line in output.splitlines() if line.startswith("config error:"))
    assert f"data.{first}_urls" in line and f"{first}.jsonl" in line and "empty" in line, line
    assert "Traceback" not in output
    assert not (tmp_path / "tokenized" / first).exists(), "a cache was built from the empty file"
    _assert_nothing_started(tmp_path)


def test_an_empty_token_cache_is_a_config_error(tmp_path):
    """A cache built from empty files (before this check) is refused too, naming it."""
    from types import SimpleNamespace

    from levanter_mars.training.data.sources import empty_data_paths

    (tmp_path / "cache" / "train").mkdir(parents=True)
    ledger = tmp_path / "cache" / "train" / "shard_ledger.json"
    ledger.write_text('{"total_num_rows": 0, "is_finished": true}')
    data = SimpleNamespace(cache_dir=str(tmp_path / "cache"), train_urls=[str(tmp_path / "gone.jsonl")],
                           validation_urls=[])
    assert empty_data_paths(data) == [
        f"data.train_urls: the token cache {str(tmp_path / 'cache' / 'train')!r} has no documents (built from "
        "empty files?)"
    ]
    ledger.write_text('{"total_num_rows": 60, "is_finished": true}')
    assert empty_data_paths(data) == []


@pytest.mark.parametrize(
    "error, code",
    [(OSError(errno.ENOSPC, "No space left on device"), 5), (TimeoutError("storage service timed out"), 5),
     (OSError(errno.EROFS, "Read-only file system"), 2), (PermissionError(errno.EACCES, "Permission denied"), 2),
     (NotADirectoryError(errno.ENOTDIR, "Not a directory"), 2)],
)
def test_a_failed_write_probe_is_a_config_error_only_when_the_path_is_wrong(tmp_path, monkeypatch, error, code):
    import fsspec.implementations.local as local

    from levanter_mars.main.train_lm import exit_code
    from levanter_mars.training.checkpointing.storage import check_writable

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(local.LocalFileSystem, "makedirs", fail)
    with pytest.raises(Exception, match=r"trainer\.checkpointer\.base_path: cannot write checkpoints") as raised:
        check_writable(str(tmp_path / "checkpoints"))
    assert exit_code(raised.value) == code
