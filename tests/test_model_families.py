"""Levanter's LM families through the CLI: refusals before anything compiles, the role audit CLI, and (slow) nano
Llama and nano Mixtral trained offline with MARS-AdamW and MARS-M, with the audit in the log, the eval loss, an HF
export, the eval harness (nano Llama MARS-M) and a bitwise resume after kill -9 (MARS-M, both families)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from levanter_mars.optim import role_audit
from levanter_mars.training.run.metrics import read_metrics
from tests.helpers.evals import include_suite
from tests.helpers.scenarios import copy_of_run
from tests.helpers.training import (
    REPO,
    describe_failure,
    losses,
    output,
    run_cli,
    run_cli_in_process,
    run_paths,
    tiny_config,
)


def _config(tmp_path, corpus, run_id, model, extra=None):
    """The tiny config with its ``model:`` section replaced by ``model`` (not merged into GPT-2's)."""
    config = tiny_config(tmp_path, corpus, run_id, extra)
    text = yaml.safe_load(config.read_text())
    text["model"] = model
    config.write_text(yaml.safe_dump(text, sort_keys=False))
    return config


@pytest.mark.parametrize(
    "model,extra,expected",
    [
        ({"type": "whisper"}, {}, "model.type=whisper is not supported"),
        ({"type": "llama", "hidden_dim": 48, "num_heads": 4, "num_kv_heads": 3}, {},
         "num_heads=4 not divisible by num_kv_heads=3"),  # Levanter's own check, reported as a config error
        ({"type": "gpt2_hyena"}, {"hf_save_path": "hf", "hf_save_steps": 5},
         "hf_save_path is set, but model.type=gpt2_hyena cannot be exported to HF offline"),
    ],
)
def test_unsupported_families_and_features_are_refused_naming_them(tmp_path, pydocs_corpus, capsys, model, extra,
                                                                   expected):
    config = _config(tmp_path, pydocs_corpus, "refused", model, extra)
    code, out = run_cli_in_process(capsys, config)
    assert code == 2 and expected in out and "model" in out, out[-2000:]
    assert not run_paths(tmp_path, "refused")["metrics"].exists()


def test_role_audit_cli_prints_the_table_without_training(capsys):
    code = role_audit.main(["--config_path", str(REPO / "config" / "nano_mixtral_mars_m.yaml"), "--vocab_size", "4096"])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = {line.split("  ")[0].strip(): line for line in out.splitlines()}
    assert "MARS-M" in lines["MARS matrix"] and "AdamW" in lines["embedding/head"]
    # 2 layers x (q, k, v, o, router) + 2 layers x 4 experts x (w1, w2, w3) per-layer matrices.
    assert lines["MARS matrix"].split()[3:5] == ["8", "34"], lines["MARS matrix"]
    counted = int(lines["total"].split()[3].replace(",", ""))
    assert f"(model: {counted:,})" in lines["total"]


def test_role_audit_cli_verbose_lists_every_parameter_with_its_branch_shape_and_per_tensor_axes(capsys):
    code = role_audit.main(["--config_path", str(REPO / "config" / "nano_mixtral_mars_m.yaml"), "--vocab_size", "4096",
                       "--verbose"])
    out = capsys.readouterr().out
    assert code == 0, out
    listed = {line.split()[0]: line.split("  ") for line in out.splitlines() if line.startswith(".")}
    assert len(listed) == 13  # every tensor of the table's total
    cells = {path: [c.strip() for c in row if c.strip()] for path, row in listed.items()}
    w1 = cells[".transformer.layers.stacked.block_sparse_moe.experts.w1.weight"]
    assert w1[1:] == ["MARS matrix", "layers=2 experts=4 embed=64 mlp=64", "layers, experts", "(mlp) x (embed)"], w1
    gate = cells[".transformer.layers.stacked.block_sparse_moe.gate.weight"]
    assert gate[1:] == ["MARS matrix", "layers=2 experts=4 embed=64", "layers", "(experts) x (embed)"], gate
    assert cells[".lm_head.weight"][1] == "embedding/head" and cells[".transformer.norm.weight"][1:4] == [
        "AdamW/1-D", "embed=64", "-"]


def test_role_audit_cli_never_contacts_the_hub_for_a_tokenizer(capsys):
    code = role_audit.main(["--config_path", str(REPO / "config" / "gpt2_small_mars.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and "data.tokenizer 'gpt2' is not a local tokenizer directory" in err and "--vocab_size" in err


LADDER = {"150m": 74.3e6, "300m": 179.8e6, "600m": 442.7e6, "1_4b": 1111.9e6}


@pytest.mark.parametrize("size", sorted(LADDER))
def test_llama_ladder_configs_share_model_and_trainer_across_optimizers(size):
    from levanter_mars.optim.role_audit import audit_model
    from levanter_mars.training.config import parse_config

    configs = {opt: parse_config(["--config_path", str(REPO / "config" / f"llama_{size}_{opt}.yaml")])
               for opt in ("mars", "mars_m", "adamw")}
    assert {type(c.optimizer).__name__ for c in configs.values()} == {"MarsAdamWConfig", "MarsMConfig", "AdamConfig"}
    models = {c.model for c in configs.values()}
    assert len(models) == 1 and type(configs["mars"].model).__name__ == "LlamaConfig"
    assert len({(c.trainer.train_batch_size, c.trainer.num_train_steps) for c in configs.values()}) == 1
    audit = audit_model(configs["mars"].model, configs["mars"].optimizer, 50257)
    assert audit.total_parameters == pytest.approx(LADDER[size], rel=1e-3)
    assert audit.warnings == ()


PREFLIGHT = re.compile(r"# Pre-flight \(TPU compiler, docs/pods.md\): ([\d.]+) GiB per chip of (\d+) on (\S+) "
                       r"at (\d+) sequences per chip: (fits|DOES NOT FIT)\.")


@pytest.mark.parametrize("size,optimizer", [(s, o) for s in sorted(LADDER) for o in ("mars", "mars_m", "adamw")])
def test_llama_ladder_header_states_its_own_preflight_verdict(size, optimizer):
    """The header's pre-flight figure is this config's own compile (docs/pods/<config>__<slice>.json) for the slice
    its launch line names, at the batch and sequences per chip the config sets."""
    from levanter_mars.training.config import parse_config

    path = REPO / "config" / f"llama_{size}_{optimizer}.yaml"
    header = path.read_text()
    slice_ = re.search(r"--tpu_type (\S+)", header).group(1)
    match = PREFLIGHT.search(header)
    assert match, f"{path.name}: no pre-flight line"
    gib, hbm, tpu_type, per_chip, verdict = match.groups()
    report = json.loads((REPO / "docs" / "pods" / f"{path.stem}__{slice_}.json").read_text())
    assert report["config"] == f"config/{path.name}" and report["tpu_type"] == tpu_type == slice_
    assert float(gib) == round(report["per_chip"]["total"] / 2**30, 1)
    assert int(hbm) == report["hbm_bytes_per_chip"] >> 30
    assert verdict == ("fits" if report["fits"] else "DOES NOT FIT")
    trainer = parse_config(["--config_path", str(path)]).trainer
    assert report["train_batch_size"] == trainer.train_batch_size
    assert report["per_device_parallelism"] == trainer.per_device_parallelism == int(per_chip)


# --- Training (slow): nano Llama and nano Mixtral, each with MARS-AdamW and MARS-M, a few steps each. -------------

NANO = {
    (family, optimizer): REPO / "config" / f"nano_{family}_{optimizer}.yaml"
    for family in ("llama", "mixtral")
    for optimizer in ("mars", "mars_m")
}
STEPS = 6
#: The run that also runs the eval harness (the offline task of tests/data/lm_eval_tasks) at its last step.
HARNESS_RUN = ("llama", "mars_m")


def _nano_config(workdir: Path, corpus: Path, family: str, optimizer: str, run_id: str) -> Path:
    """The shipped nano config, shrunk to a few steps, pointing into ``workdir``."""
    base = yaml.safe_load(NANO[family, optimizer].read_text())
    overrides = {
        "model": dict(base["model"], seq_len=64),
        "optimizer": base["optimizer"],
        "trainer": {"train_batch_size": 8, "num_train_steps": STEPS, "steps_per_eval": 3, "max_eval_batches": 2,
                    "checkpointer": {"keep": [{"every": 3}]}},
        "hf_save_path": str(workdir / "hf" / run_id),
        "hf_save_steps": STEPS,
    }
    return tiny_config(workdir, corpus, run_id, overrides)


@pytest.fixture(scope="module")
def nano_runs(tmp_path_factory, pydocs_corpus):
    """``(workdir, run)``: ``run(family, optimizer)`` trains that nano config once per module, on first use (each test
    pays for its own run, so no single test outlives the per-test timeout)."""
    workdir = tmp_path_factory.mktemp("families")
    runs = {}

    def run(family: str, optimizer: str):
        if (family, optimizer) not in runs:
            run_id = f"nano-{family}-{optimizer}"
            config = _nano_config(workdir, pydocs_corpus, family, optimizer, run_id)
            if (family, optimizer) == HARNESS_RUN:
                include_suite(config)
            proc = run_cli(config)
            assert proc.returncode == 0, describe_failure(proc)
            runs[family, optimizer] = (config, proc, run_paths(workdir, run_id), workdir / "hf" / run_id)
        return runs[family, optimizer]

    return workdir, run


@pytest.mark.slow
@pytest.mark.parametrize("family,optimizer", sorted(NANO))
def test_nano_family_trains_offline_evaluates_and_exports(nano_runs, family, optimizer):
    _, run = nano_runs
    config, proc, paths, hf_dir = run(family, optimizer)
    log = output(proc)
    train = losses(paths["metrics"])
    evals = losses(paths["metrics"], "eval/loss")
    assert sorted(train) == list(range(STEPS)) and all(v == v for v in train.values())
    assert len(evals) >= 2 and evals[max(evals)] < evals[min(evals)], evals
    # The role audit before training; Mixtral's experts among the MARS matrices.
    assert "Tensor roles of model.type=" in log and "MARS matrix" in log
    matrices = next(line for line in log.splitlines() if line.startswith("MARS matrix"))
    assert matrices.split()[3:5] == (["8", "34"] if family == "mixtral" else ["7", "14"]), matrices
    hf_config = json.loads(next(hf_dir.rglob("config.json")).read_text())
    assert hf_config["architectures"] == [{"llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM"}[family]]
    assert hf_config["vocab_size"] >= 4096  # the corpus's own tokenizer, not Llama-2's 32000
    assert "huggingface.co" not in log


@pytest.mark.slow
def test_nano_llama_runs_the_eval_harness_at_its_last_step(nano_runs):
    _, run = nano_runs
    _, _, paths, _ = run(*HARNESS_RUN)
    acc = {r["step"]: r["lm_eval/pydocs_mc/acc"] for r in read_metrics(paths["metrics"]) if "lm_eval/pydocs_mc/acc" in r}
    assert list(acc) == [STEPS - 1] and 0.0 <= acc[STEPS - 1] <= 1.0, acc
    results = json.loads((paths["run_dir"] / "eval" / "in_training" / f"step-{STEPS - 1}" / "results.json").read_text())
    assert len(results["samples"]["pydocs_mc"]) == 48  # every question of the local task was scored
    assert results["results"]["pydocs_mc"]["acc,none"] == acc[STEPS - 1]


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_nano_family_resumes_bitwise_from_a_checkpoint(nano_runs, family):
    """The family's MARS-M run's files up to its step-3 checkpoint (what a kill right after that checkpoint leaves;
    kills themselves: tests/test_reliability.py) resume to the uninterrupted run's losses bit for bit."""
    workdir, run = nano_runs
    config, _, reference, _ = run(family, "mars_m")
    resumed_dir = workdir / f"resumed-{family}"
    copy, paths = copy_of_run(config, reference, resumed_dir, up_to_step=3)
    assert not (paths["checkpoints"] / "step-5").exists()
    rerun = run_cli(copy, "--hf_save_path", str(resumed_dir / "hf"))
    assert rerun.returncode == 0, describe_failure(rerun)
    assert "Resuming from" in output(rerun) and "step-3" in output(rerun), output(rerun)[-3000:]
    assert losses(paths["metrics"]) == losses(reference["metrics"])
