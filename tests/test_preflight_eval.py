"""Pre-flight compiles the in-training eval programs too: the eval loss and the eval harness's scoring batch.

A one-layer GPT-2 (fast compiles) with an eval suite: both programs are compiled and reported per chip, with the
optimizer state that stays resident while they run. A refusal: a train step that fits with an eval batch that cannot
(512 sequences of 1024 tokens per chip, no microbatching for evals) exits 2 naming trainer.per_device_eval_parallelism.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers.preflight import REPO, last_json, refusal_line, run_preflight

ONE_LAYER = ("--model.num_layers", "1", "--model.gradient_checkpointing", "false")


@pytest.fixture(scope="module")
def with_suite(tmp_path_factory):
    # The shipped config plus an eval suite (the harness's rows at 512 tokens, the suite's max_length).
    config = tmp_path_factory.mktemp("preflight") / "small_with_suite.yaml"
    text = (REPO / "config" / "gpt2_small_mars.yaml").read_text()
    text = text.replace("!include data/fineweb_edu.yaml", f"!include {REPO / 'config' / 'data' / 'fineweb_edu.yaml'}")
    config.write_text(text + "eval_harness:\n  task_spec: [piqa]\n  max_length: 512\n")
    proc = run_preflight("--config_path", str(config), "--tpu_type", "v4-8", "--json", "--", *ONE_LAYER,
                         "--trainer.train_batch_size", "32", "--trainer.per_device_parallelism", "4",
                         "--trainer.per_device_eval_parallelism", "8", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, last_json(proc)


@pytest.mark.slow
def test_eval_loss_and_harness_batch_are_compiled_and_reported_per_chip(with_suite):
    proc, report = with_suite
    evals = report["eval"]
    assert set(evals) == {"eval_loss", "eval_harness"}, evals
    for name, e in evals.items():
        assert e["per_device_eval_parallelism"] == 8 and e["eval_batch_size"] == 8 * 4
        assert 0 < e["temporaries"] < e["program_total"]
        # The program's own arguments hold the model; the optimizer state stays resident between train steps.
        assert e["program_total"] >= report["per_chip"]["parameters"]
        assert e["resident_optimizer_state"] == report["per_chip"]["optimizer_state"]
        assert e["total"] == e["program_total"] + e["resident_optimizer_state"]
        assert e["fits"] is True and e["total"] <= report["usable_hbm_bytes_per_chip"]
        assert f"{name:<15} temporary" in proc.stdout
    assert report["fits"] is True


@pytest.fixture(scope="module")
def eval_refusal():
    return run_preflight("--config_path", "config/gpt2_small_mars.yaml", "--tpu_type", "v4-8", "--json", "--",
                         *ONE_LAYER, "--trainer.train_batch_size", "16", "--trainer.per_device_parallelism", "4",
                         "--trainer.per_device_eval_parallelism", "512", timeout=900)


@pytest.mark.slow
def test_an_eval_batch_that_cannot_fit_exits_2_naming_the_eval_field(eval_refusal):
    said = refusal_line(eval_refusal)
    # The whole program's figure (libtpu 0.0.37), or the part the compiler refused it for (0.0.42: temporaries alone).
    assert re.search(r"eval_loss \(between train steps\): (it needs|its temporaries alone need|one buffer alone needs) "
                     r"[0-9.]+ GiB", said), said
    assert "trainer.per_device_eval_parallelism (now 512" in said
    assert "trainer.per_device_parallelism" not in said  # the train step fits: not what to change
    report = last_json(eval_refusal)
    assert report["per_chip"]["total"] <= report["usable_hbm_bytes_per_chip"]
    assert report["fits"] is False and report["eval"]["eval_loss"]["fits"] is False
    assert "Traceback" not in eval_refusal.stderr


def test_a_config_without_eval_data_compiles_no_eval_program():
    from levanter.data.text import LMMixtureDatasetConfig, UrlDatasetSourceConfig

    from levanter_mars.infra.preflight.eval_steps import eval_tags

    train_only = UrlDatasetSourceConfig(train_urls=["a.jsonl"])
    with_urls = UrlDatasetSourceConfig(train_urls=["a.jsonl"], validation_urls=["b.jsonl"], tags=["web"])
    mixture = LMMixtureDatasetConfig(configs={"plain": train_only, "held": train_only, "urls": with_urls},
                                     train_weights={"plain": 1.0, "held": 1.0, "urls": 1.0},
                                     num_validation_sequences={"held": 100})
    assert eval_tags(mixture) == [["held"], ["web", "urls"]]
    assert eval_tags(LMMixtureDatasetConfig(configs={"plain": train_only}, train_weights={"plain": 1.0})) == []
