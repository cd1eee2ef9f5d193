"""Pre-flight: the train step compiled by the TPU compiler for a slice, on this CPU machine (needs the libtpu wheel).

The shipped GPT-2 small MARS config on v4-32 is compiled once per session (a few minutes on 2 cores) and every check
of its report shares that run. Refusals are cheap: a one-layer model whose microbatch cannot fit (the compiler's own
out-of-memory verdict), a batch that does not divide (refused before anything compiles), and no TPU compiler.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest
from levanter.infra.ray_tpu import TPU_CONFIGS

from levanter_mars.infra.preflight.step import ONE_BUFFER, TEMPORARIES, out_of_memory
from levanter_mars.infra.preflight.topology import GiB, abstract_devices, tpu_target
from levanter_mars.infra.slices import slice_type
from tests.helpers.preflight import REPO, last_json, refusal_line, run_preflight

SMALL_MARS = "config/gpt2_small_mars.yaml"


# ------------------------------------------------------------------------------------------------ topology mapping
# Google Cloud's published topologies ("TPU versions" pages): the independent reference for the mapping rule.
PUBLISHED = {
    "v4-8": ("v4:2x2x1", 4), "v4-16": ("v4:2x2x2", 8), "v4-32": ("v4:2x2x4", 16), "v4-64": ("v4:2x4x4", 32),
    "v4-128": ("v4:4x4x4", 64), "v4-256": ("v4:4x4x8", 128), "v4-512": ("v4:4x8x8", 256),
    "v4-1024": ("v4:8x8x8", 512), "v4-2048": ("v4:8x8x16", 1024), "v4-4096": ("v4:8x16x16", 2048),
    "v5p-8": ("v5p:2x2x1", 4), "v5p-128": ("v5p:4x4x4", 64), "v5p-12288": ("v5p:16x16x24", 6144),
    "v5litepod-1": ("v5e:1x1", 1), "v5litepod-4": ("v5e:2x2", 4), "v5litepod-8": ("v5e:2x4", 8),
    "v5litepod-16": ("v5e:4x4", 16), "v5litepod-256": ("v5e:16x16", 256),
    "v6e-1": ("v6e:1x1", 1), "v6e-8": ("v6e:2x4", 8), "v6e-16": ("v6e:4x4", 16), "v6e-256": ("v6e:16x16", 256),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_slice_maps_to_the_published_topology(name):
    target = tpu_target(slice_type(name))
    assert (target.topology, target.chips) == PUBLISHED[name]
    # The name counts TensorCores on v4/v5p (2 per chip) and chips on v5e/v6e.
    assert int(name.split("-")[1]) == (target.chips * 2 if name.startswith(("v4", "v5p")) else target.chips)


@pytest.mark.parametrize("name", [c.name for c in TPU_CONFIGS])
def test_every_launcher_slice_name_counts_cores_on_v4_v5p_and_chips_on_v5e_v6e(name):
    target = tpu_target(slice_type(name))
    counted = int(name.split("-")[1])
    if name.startswith(("v4-", "v5p-")):
        assert (counted, target.cores_per_chip, target.megacore) == (2 * target.chips, 2, True)
    else:
        assert (counted, target.cores_per_chip, target.megacore) == (target.chips, 1, False)
    dims = [int(d) for d in target.topology.split(":")[1].split("x")]
    assert target.devices == target.chips == int(np.prod(dims))
    assert target.hbm_bytes_per_chip == {"v4": 32, "v5litepod": 16, "v5p": 95, "v6e": 32}[name.split("-")[0]] * GiB


@pytest.mark.parametrize("name", [c.name for c in TPU_CONFIGS if c.chip_count <= 64])
def test_every_launcher_slice_up_to_64_chips_is_a_topology_with_one_device_per_chip(name):
    target = tpu_target(slice_type(name))
    devices = abstract_devices(target)
    # The compiler's own count of devices and cores: one JAX device per chip, as JAX on a real pod sees them
    # (v4/v5p: megacore, 2 TensorCores per device).
    assert len(devices) == target.chips
    assert {d.num_cores for d in devices} == {target.cores_per_chip}


# ------------------------------------------------------------------------------------ the shipped config, compiled
@pytest.fixture(scope="module")
def small_mars_on_v4_32():
    proc = run_preflight("--config_path", SMALL_MARS, "--tpu_type", "v4-32", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, last_json(proc)


def _gpt2_parameters(vocab: int, hidden: int, layers: int, seq_len: int) -> int:
    """GPT-2 without biases (use_bias: false), tied embeddings: token and position embeddings, per layer the
    attention (q, k, v, o: 4 h^2), the MLP (2 x h x 4h) and two layer-norm scales, and the final layer norm."""
    return vocab * hidden + seq_len * hidden + layers * (4 * hidden**2 + 8 * hidden**2 + 2 * hidden) + hidden


@pytest.mark.slow
@pytest.mark.extended  # CI budget (200 s): in CI, pre-flight compiles smaller slices below
def test_small_mars_on_v4_32_fits_with_figures(small_mars_on_v4_32):
    proc, report = small_mars_on_v4_32
    for key in ("tpu_type", "topology", "chips", "hbm_bytes_per_chip", "per_chip", "fits", "flops_per_step",
                "compile_seconds"):
        assert key in report
    assert (report["tpu_type"], report["topology"], report["chips"]) == ("v4-32", "v4:2x2x4", 16)
    assert report["hbm_bytes_per_chip"] == 32 * GiB
    # Judged against what the compiler lets a program use (less than the nominal), stated by its refusal of a probe.
    usable = report["usable_hbm_bytes_per_chip"]
    assert 0.9 * 32 * GiB <= usable < 32 * GiB and "refusal of a probe" in report["usable_hbm_source"]
    assert report["fits"] is True
    per_chip = report["per_chip"]
    assert 0 < per_chip["temporaries"] < per_chip["total"] <= usable
    assert report["headroom_bytes"] == usable - per_chip["total"]
    assert per_chip["total"] >= per_chip["parameters"] + per_chip["optimizer_state"] + per_chip["temporaries"]
    # Forward and backward of 480 x 1024 tokens of a 124M-parameter model: about 6 N T, attention adding some.
    assert 6 * 124e6 * 480 * 1024 <= report["flops_per_step"] <= 1.5 * 6 * 124e6 * 480 * 1024
    assert report["compiler_flops_per_chip"] > 0
    # The record names the compiler that produced it: the installed jax and libtpu, as pip reports them.
    from importlib.metadata import version

    assert report["compiler"] == {"jax": version("jax"), "libtpu": version("libtpu")}
    # ... and the command that makes it again (scripts/stale_tpu_figures.py prints it when the lock moves).
    assert report["command"] == f"python -m levanter_mars.main.preflight --config_path {SMALL_MARS} --tpu_type v4-32 --json"
    assert "verdict         fits" in proc.stdout


@pytest.mark.slow
@pytest.mark.extended  # the v4-32 compile above
def test_parameters_and_optimizer_state_per_chip_match_a_hand_count(small_mars_on_v4_32):
    _, report = small_mars_on_v4_32
    # The vocabulary (50257) is padded to a multiple of the 16-way FSDP axis; every tensor is split 16 ways.
    vocab = -(-50257 // 16) * 16
    parameters = _gpt2_parameters(vocab, hidden=768, layers=12, seq_len=1024)
    shards, fp32 = 16, 4
    # MARS-AdamW (approx) keeps three fp32 tensors per parameter: both moments and the previous gradient.
    assert report["per_chip"]["parameters"] == pytest.approx(parameters * fp32 / shards, rel=0.02)
    assert report["per_chip"]["optimizer_state"] == pytest.approx(3 * parameters * fp32 / shards, rel=0.02)


# ---------------------------------------------------------------------------------------------------- refusals
# One layer (a fast compile) and 512 sequences of 1024 tokens per chip without remat: the attention scores alone are
# 512 x 12 x 1024^2 floats, far beyond a v4 chip.
_REFUSAL = (
    "--config_path", SMALL_MARS, "--tpu_type", "v4-8", "--json", "--",
    "--model.num_layers", "1", "--model.gradient_checkpointing", "false",
    "--trainer.train_batch_size", "2048", "--trainer.per_device_parallelism", "512",
)


@pytest.fixture(scope="module")
def refusal():
    return run_preflight(*_REFUSAL, timeout=600)


@pytest.mark.slow
def test_a_step_that_cannot_fit_exits_2_naming_what_to_change(refusal):
    said = refusal_line(refusal)
    for field in ("trainer.per_device_parallelism", "model.gradient_checkpointing", "--tpu_type (v4-16)"):
        assert field in said
    report = last_json(refusal)
    assert report["fits"] is False
    # The whole program's figure (libtpu 0.0.37) exceeds the usable HBM; a part's (0.0.42's temporaries alone) is kept
    # apart from the total, which the compiler did not state. Either way no positive headroom.
    per_chip = report["per_chip"]
    if per_chip["total"] is None:
        assert per_chip["partial"]["bytes"] > report["usable_hbm_bytes_per_chip"]
        assert report["headroom_bytes"] is None
    else:
        assert report["headroom_bytes"] == report["usable_hbm_bytes_per_chip"] - per_chip["total"] < 0
    assert "Traceback" not in refusal.stderr
    # Its verdict, not libtpu's startup noise (tests/test_preflight_quiet.py).
    assert "unexpected worker hostname" not in refusal.stderr and "host bounds" not in refusal.stderr, refusal.stderr


@pytest.mark.slow
def test_hbm_table_matches_the_compilers_capacity(refusal):
    """The compiler's out-of-memory verdict states what one device can hold: a whole v4 chip (megacore), at most the
    table's 32 GiB (less what the runtime reserves) and far over one TensorCore's half. The refused program's own
    statement is the usable HBM it is judged against."""
    report = last_json(refusal)
    capacity = report["usable_hbm_bytes_per_chip"]
    assert 0.9 * 32 * GiB <= capacity < 32 * GiB, capacity
    # A refusal of one buffer alone states the physical 32 GiB: then the probe's refusal says what a program may use.
    one_buffer = report["per_chip"].get("partial", {}).get("counts") == ONE_BUFFER
    assert ("refusal of a probe" if one_buffer else "this program") in report["usable_hbm_source"], report


@pytest.mark.slow  # runs pre-flight in a subprocess
def test_a_batch_that_does_not_divide_is_refused_before_compiling():
    proc = run_preflight("--config_path", SMALL_MARS, "--tpu_type", "v4-32", "--", "--trainer.train_batch_size", "100",
                         timeout=300)
    assert proc.returncode == 2
    assert "trainer.train_batch_size=100" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # runs pre-flight in a subprocess
def test_an_unknown_slice_is_refused():
    proc = run_preflight("--config_path", SMALL_MARS, "--tpu_type", "v4-33", timeout=300)
    assert proc.returncode == 2 and "--tpu_type" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow  # runs pre-flight in a subprocess
def test_without_the_tpu_compiler_it_says_so_and_exits_2(tmp_path):
    # A libtpu package that cannot load shadows the real one, as on a platform with no wheel.
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "__init__.py").write_text("raise ImportError('no libtpu for this platform')\n")
    # (Importing jax here set TPU_LIBRARY_PATH to the real library: the child must not inherit it.)
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "TPU_LIBRARY_PATH": None}
    proc = run_preflight("--config_path", SMALL_MARS, "--tpu_type", "v4-32", env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "libtpu" in proc.stderr and "Traceback" not in proc.stderr


def test_libtpu_extra_is_the_version_the_pinned_jax_declares():
    import importlib.metadata
    import tomllib

    from packaging.requirements import Requirement

    # jax pins libtpu exactly (0.7: libtpu==0.0.23) or to one release's patches (0.9: libtpu==0.0.37.*, 0.10:
    # libtpu==0.0.42.*).
    declared = [Requirement(r.split(";")[0]) for r in importlib.metadata.requires("jax") if r.startswith("libtpu")]
    locked = [line.strip() for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith("libtpu==")]
    assert len(declared) == len(locked) == 1, (declared, locked)
    assert declared[0].specifier.contains(locked[0].removeprefix("libtpu==")), (declared, locked)
    ours = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tpu"]
    assert [r.split(";")[0].strip() for r in ours] == ["jax[tpu]>=0.10.2"]
    assert "'.[test,tpu]'" in (REPO / "Makefile").read_text()


# ------------------------------------------------------------------------------------------------ the launcher
BUCKET = ["--trainer.checkpointer.base_path", "gs://b/ckpt", "--data.cache_dir", "gs://b/tok"]


def test_launch_dry_run_says_when_pre_flight_is_skipped(capsys, monkeypatch):
    import yaml

    from levanter_mars.infra import launch

    def refuse(*args, **kwargs):
        raise AssertionError(f"started a process: {args!r}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)  # skipped means no pre-flight process
    code = launch.cli(["--dry_run", "--skip_preflight", "--config_path", SMALL_MARS, "--tpu_type", "v4-32", "--",
                       *BUCKET])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = next(yaml.safe_load_all(out))
    assert plan["preflight"].startswith("skipped (--skip_preflight)")


@pytest.mark.slow  # runs pre-flight in a subprocess
def test_launch_refuses_before_submitting_when_pre_flight_refuses(capsys, tmp_path, monkeypatch):
    from levanter_mars.infra import launch, ray_job

    def refuse(*args, **kwargs):
        raise AssertionError("submitted a job")

    monkeypatch.setattr(ray_job, "submit", refuse)
    # No TPU compiler (see the test above): pre-flight refuses in seconds, and the launcher must stop there.
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "__init__.py").write_text("raise ImportError('no libtpu for this platform')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO / "src"), str(REPO)]))
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    # A real launch probes the storage it names (here fsspec's in-memory one: no network in tests).
    in_memory = ["--trainer.checkpointer.base_path", "memory://b/ckpt", "--data.cache_dir", "memory://b/tok"]
    code = launch.cli(["--config_path", SMALL_MARS, "--tpu_type", "v4-32", "--address", "http://127.0.0.1:1", "--",
                       *in_memory])
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "error: pre-flight refused, nothing was submitted: error: cannot build the TPU topology" in err


def test_the_compilers_out_of_memory_verdict_is_read_as_bytes():
    # libtpu 0.0.42.1's words for the refusal case above: its temporaries, estimated before it places the program.
    said = ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for "
            "HLO temporaries (56.39G) exceeds available HBM (30.75G).")
    verdict = out_of_memory(said)
    assert verdict[:2] == (int(56.39 * GiB), int(30.75 * GiB)) and verdict.counts == TEMPORARIES
    assert verdict.line.startswith("RESOURCE_EXHAUSTED: Ran out of memory on HBM")
    # libtpu 0.0.37's form: the whole program's peak.
    assert out_of_memory("RESOURCE_EXHAUSTED: Used 49.09G of 30.75G hbm.")[:2] == (int(49.09 * GiB), int(30.75 * GiB))
    assert out_of_memory("RESOURCE_EXHAUSTED: Allocation (size=40) would exceed memory (size=32)")[:2] == (40, 32)
    assert out_of_memory("INVALID_ARGUMENT: no HBM here") is None


def _preflight_that(tmp_path, monkeypatch, body: str):
    """A stand-in for pre-flight (``python -m <module>`` in the working directory) that does ``body``."""
    import types

    from levanter_mars.infra.preflight import launch_check

    (tmp_path / "fake_preflight.py").write_text(body)
    monkeypatch.setattr(launch_check, "PREFLIGHT_MODULE", "fake_preflight")
    run = types.SimpleNamespace(run_id="r", slice=slice_type("v4-8"), job=types.SimpleNamespace(slice_counts=(1,)),
                                train_argv=("--config_path", "c.yaml", "--trainer.id", "r"))  # fmt: skip
    return launch_check.preflight_run(run, str(tmp_path), skip=False)


@pytest.mark.parametrize("body,how", [
    ("raise RuntimeError('the compiler crashed')\n", "exit 1"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "signal SIGKILL"),  # a compile killed for memory
])  # fmt: skip
def test_a_pre_flight_that_crashes_is_no_refusal_and_names_its_log(tmp_path, monkeypatch, body, how):
    """On 4cb100e any non-zero pre-flight was "refused, nothing was submitted" and exit 2, which says the config is
    bad and is never retried."""
    code, text = _preflight_that(tmp_path, monkeypatch, body)
    assert code == 1 and text.startswith(f"crashed ({how}") and "no verdict on the config" in text, text
    log = text.split("Its log: ")[1].split(". ")[0]
    if how == "exit 1":
        assert "RuntimeError: the compiler crashed" in open(log).read()
    code, text = _preflight_that(tmp_path, monkeypatch, "import sys\nprint('does not fit: 3 GiB too many', "
                                                        "file=sys.stderr)\nsys.exit(2)\n")  # fmt: skip
    assert (code, text) == (2, "refused, nothing was submitted: does not fit: 3 GiB too many")


def test_pre_flight_runs_the_training_programs_own_validation(tmp_path, pydocs_corpus):
    from levanter_mars.main import preflight
    from levanter_mars.program_config import parse_train_config
    from levanter_mars.training.config import ConfigError
    from tests.helpers.training import tiny_config

    data = {"train_urls": [str(tmp_path / "missing.jsonl")], "cache_dir": str(tmp_path / "tokenized")}
    config = parse_train_config(["--config_path", str(tiny_config(tmp_path, pydocs_corpus, "pf", {"data": data}))])
    with pytest.raises(ConfigError, match=r"data.train_urls\[0\]: no such file"):
        preflight.check(config, 4)


def test_pre_flight_sizes_a_shipped_config_whose_bucket_is_still_the_placeholder():
    """The documented first step (README, docs/pods.md) is pre-flight on a shipped config, before its bucket is set:
    where a run will write is the launcher's and training's check, not a reason to refuse to size the program."""
    from levanter_mars.main import preflight
    from levanter_mars.program_config import parse_train_config
    from levanter_mars.training.config import ConfigError
    from levanter_mars.training.validation import validate

    config = parse_train_config(["--config_path", SMALL_MARS])
    assert "YOUR-BUCKET" in config.data.cache_dir
    preflight.check(config, 16)
    with pytest.raises(ConfigError, match="data.cache_dir is still the placeholder"):
        validate(config, device_count=16, offline=True, elsewhere=True)
