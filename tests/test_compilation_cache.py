"""The run's compilation cache (training/compilation_cache.py): where it is (config, then $JAX_COMPILATION_CACHE_DIR,
then beside the checkpoints), that a second process loads what the first compiled, on local disk and on gs:// (the
storage emulator), that hits are logged once per program (compat defect 37), and that XLA:CPU's false SIGILL alarms on
loading do not reach the terminal (compat defect 38). Each process here has its own cache, apart from the test
session's ($JAX_COMPILATION_CACHE_DIR, tests/conftest.py). A retry of a killed run loading its programs:
tests/test_infra_local_ray.py (local pod) and tests/test_gcs.py (gs://)."""

import json
import subprocess
import sys
import types

import pytest

from levanter_mars.compat import xla_cpu_loader
from levanter_mars.training.compilation_cache import DEFAULT_DIRECTORY, resolve
from tests.helpers.training import REPO, _env


def _trainer(cache=None, base_path="gs://bucket/ckpt"):
    return types.SimpleNamespace(compilation_cache=cache, checkpointer=types.SimpleNamespace(base_path=base_path))


def test_the_config_wins_then_jax_own_variable_then_beside_the_checkpoints(tmp_path):
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "machine-wide")}
    assert resolve(_trainer("gs://bucket/cc"), env).path == "gs://bucket/cc"
    assert resolve(_trainer(str(tmp_path / "mine")), env).source == "trainer.compilation_cache"
    off = resolve(_trainer("none"), env)
    assert off.path is None and off.source == "trainer.compilation_cache"
    assert resolve(_trainer(), env).path == str(tmp_path / "machine-wide")
    assert resolve(_trainer(), env).source == "$JAX_COMPILATION_CACHE_DIR"
    assert resolve(_trainer(), {}).path == f"gs://bucket/ckpt/{DEFAULT_DIRECTORY}"
    assert resolve(_trainer(base_path="runs/ckpt"), {}).path == str(REPO / "runs" / "ckpt" / DEFAULT_DIRECTORY)


def _child(module: str, *args: str, env=None, text=True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=text,
                          env=_env({"JAX_PLATFORMS": "cpu", **(env or {})}), timeout=300)  # fmt: skip


def _compile_twice(cache: str, env=None) -> list[tuple[dict, str]]:
    runs = []
    for _ in range(2):
        proc = _child("tests.helpers.compile_cache_child", "run", cache, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append((json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr))
    return runs


def test_a_second_process_loads_what_the_first_compiled_and_says_so_once(tmp_path):
    (first, first_log), (second, second_log) = _compile_twice(str(tmp_path / "run-cache"))
    assert first["dir"] == str(tmp_path / "run-cache"), "the run's cache, not the session's $JAX_COMPILATION_CACHE_DIR"
    assert first["cache_use"]["hits"] == 0 and first["cache_use"]["stored"] >= 2
    assert list((tmp_path / "run-cache").glob("jit__lambda-*-cache"))
    assert second["cache_use"]["hits"] >= 2 and second["cache_use"]["stored"] == 0
    assert second_log.count("Compilation cache hit: jit__lambda") == 1, "once per program, not per compilation"
    assert "Compilation cache miss: jit__lambda compiled in" in first_log


def test_the_cache_works_on_gs(gcs):
    """jax reaches gs:// through etils.epath and fsspec (gcsfs, here on the emulator): no patch needed."""
    cache = gcs.gs("compile-cache-test")
    gcs.requests.clear()
    (first, _), (second, second_log) = _compile_twice(cache, env=gcs.env)
    assert first["cache_use"]["stored"] >= 2 and second["cache_use"]["hits"] >= 2, (first, second)
    assert "Compilation cache hit: jit__lambda" in second_log
    assert gcs.requests["POST"] >= 2, "the entries were uploaded to the bucket"


def test_defect_37_jax_reports_a_cache_hit_only_at_debug_and_the_workaround_logs_it(tmp_path):
    cache = str(tmp_path / "cache")
    for _ in range(2):
        proc = _child("tests.helpers.compile_cache_child", "jax", cache)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert list((tmp_path / "cache").glob("jit__lambda-*-cache")), "the second process could load it"
    assert "hit" not in proc.stderr.lower(), proc.stderr[-3000:]  # at INFO, jax says nothing of its hits
    _, ours = _compile_twice(str(tmp_path / "ours"))[1]
    assert ours.count("Compilation cache hit: jit__lambda") == 1


def test_defect_38_xla_cpu_warns_of_sigill_for_a_pseudo_feature_and_the_workaround_keeps_it_off_the_terminal(
    tmp_path,
):
    cache = str(tmp_path / "cache")
    written = _child("tests.helpers.cpu_loader_warning_child", "write", cache)
    assert written.returncode == 0, written.stderr[-3000:]
    plain = _child("tests.helpers.cpu_loader_warning_child", "read", cache)
    filtered = _child("tests.helpers.cpu_loader_warning_child", "read-filtered", cache)
    assert plain.returncode == filtered.returncode == 0, (plain.stderr[-2000:], filtered.stderr[-2000:])
    assert plain.stdout.splitlines()[0] == filtered.stdout.splitlines()[0], "the program runs, warning or not"
    warned = "Target machine feature +fast-gather is not  supported" in plain.stderr
    if xla_cpu_loader.affected():  # jaxlib 0.9: every load of such an entry warns
        assert warned, plain.stderr[-3000:]
    else:  # XLA skips tuning features from jaxlib 0.10: delete the workaround once the lock has no jaxlib 0.9
        assert not warned, "jaxlib >= 0.10 warns again: the workaround must stay on for it"
    assert "+fast-gather" not in filtered.stderr, filtered.stderr[-3000:]


def test_the_filter_drops_only_the_false_alarms_and_keeps_the_last_words_of_an_abort():
    proc = _child("tests.helpers.stderr_filter_child", text=False)
    assert proc.returncode < 0  # aborted
    assert b"+prefer-no-gather" not in proc.stderr and b"Assume version compatibility" not in proc.stderr
    assert b"+avx512f is not  supported" in proc.stderr, "a feature the host really lacks still warns"
    assert proc.stderr.startswith(b"before\n") and b"\rprogress 50%\rprogress 100%\n" in proc.stderr
    assert proc.stderr.rstrip().endswith(b"F1202 the last words before an abort"), proc.stderr


@pytest.mark.parametrize("jaxlib_version,expected", [("0.9.2", True), ("0.10.2", False)])
def test_the_filter_is_on_for_the_affected_jaxlib_only(monkeypatch, jaxlib_version, expected):
    import jaxlib

    monkeypatch.setattr(jaxlib, "__version__", jaxlib_version)
    assert xla_cpu_loader.affected() is expected


def test_where_programs_are_cached_and_what_a_failed_eval_does_leave_a_derived_run_id_unchanged():
    """A run resumes by its derived id: settings that do not change what is trained must not change it, or every run
    started before them would start over."""
    from levanter_mars.program_config import parse_train_config
    from levanter_mars.training.run.identity import stable_run_id

    def derived(*overrides):
        config = parse_train_config(["--config_path", str(REPO / "config" / "gpt2_tiny_mars.yaml"), *overrides])
        config.trainer.id = None
        return stable_run_id(config)

    assert derived() == "gpt2-mars-adamw-c86309e7"  # as 4cb100e derived it
    assert derived("--trainer.compilation_cache", "none", "--eval_harness_failure", "stop") == derived()
    assert derived("--optimizer.amsgrad", "false") == derived() != derived("--optimizer.amsgrad", "true")
    assert derived("--trainer.num_train_steps", "31") != derived()
