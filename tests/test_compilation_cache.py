"""The run's compilation cache (training/compilation_cache.py): where it is (config, then $JAX_COMPILATION_CACHE_DIR,
then beside the checkpoints), that a second process loads what the first compiled, on local disk and on gs:// (the
storage emulator), that hits are logged once per program (compat defect 37), and that loading a cached program prints
no false SIGILL alarm. Each process here has its own cache, apart from the test
session's ($JAX_COMPILATION_CACHE_DIR, tests/conftest.py). A retry of a killed run loading its programs:
tests/test_infra_local_ray.py (local pod) and tests/test_gcs.py (gs://)."""

import json
import subprocess
import sys
import types

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


def test_a_cached_program_with_a_tuning_pseudo_feature_loads_without_a_sigill_alarm(tmp_path):
    """jaxlib 0.9's XLA:CPU printed "Target machine feature +fast-gather is not supported ... could lead to execution
    errors such as SIGILL" for every cached program whose compile recorded an LLVM tuning pseudo-feature (pages per
    run; compat defect 38 filtered them). jaxlib 0.10 skips tuning features, and the lock requires it: no filter."""
    cache = str(tmp_path / "cache")
    written = _child("tests.helpers.cpu_loader_warning_child", "write", cache)
    assert written.returncode == 0, written.stderr[-3000:]
    assert "recorded +fast-gather" in written.stdout, "the entry holds the pseudo-feature"
    read = _child("tests.helpers.cpu_loader_warning_child", "read", cache)
    assert read.returncode == 0, read.stderr[-3000:]
    assert read.stdout.splitlines()[0] == written.stdout.splitlines()[0], "the program runs from the cache"
    assert "+fast-gather" not in read.stderr and "SIGILL" not in read.stderr, read.stderr[-3000:]


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
