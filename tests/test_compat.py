"""Each test reproduces a defect of a pinned dependency that a piece of levanter_mars.compat works around.

When one of these starts failing, upstream has fixed the defect: delete the workaround and this test.
"""

import contextlib
import importlib.metadata
import inspect
import json
import os
import types
import warnings

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import pytest
from levanter.callbacks import LambdaCallback

from levanter_mars.compat import cli, jax_distributed, levanter_infra, levanter_models, levanter_training, lm_eval_harness
from tests.helpers.pod import run_helper_processes


class _Info:
    step = 7


def test_defect_1_lambda_callback_drops_force(tmp_path):
    seen = []

    def on_step(info, force=False):
        seen.append(force)

    LambdaCallback(on_step).on_step(_Info(), force=True)
    assert seen == [False], "upstream now forwards force: remove forward_force_to_checkpointer"


def test_defect_1_workaround_forwards_force_to_the_checkpointer(tmp_path):
    from levanter.checkpoint import Checkpointer
    from levanter.trainer import _Hook

    class RecordingCheckpointer(Checkpointer):
        def __init__(self):
            super().__init__(tmp_path, None, [])
            self.forced = []

        def on_step(self, info, force=False):
            self.forced.append(force)

    checkpointer = RecordingCheckpointer()
    hooks = [_Hook(LambdaCallback(lambda info: None), 1), _Hook(LambdaCallback(checkpointer.on_step), 1)]
    assert levanter_training.forward_force_to_checkpointer(hooks) is checkpointer
    for hook in hooks:
        hook.fn.on_step(_Info(), force=True)
    assert checkpointer.forced == [True]


def test_defect_2_obj_fun_unpacks_a_pair_the_loss_does_not_return():
    source = inspect.getsource(__import__("levanter.trainer", fromlist=["Trainer"]).Trainer._train_step)
    assert "loss_for_opt, _metrics = result" in source
    from levanter.models.lm_model import compute_next_token_loss

    # The LM loss returns a single value, so that unpacking fails for every Levanter language model.
    assert "tuple" not in str(inspect.signature(compute_next_token_loss).return_annotation).lower()


def test_defect_2_take_train_step_passes_loss_to_the_optimizer():
    import optax
    from levanter.trainer_state import take_train_step

    received = {}

    def update(updates, state, params=None, **extra):
        received.update(extra)
        return updates, state

    tx = optax.GradientTransformationExtraArgs(lambda p: optax.EmptyState(), update)
    params = {"w": jnp.ones(2)}
    take_train_step(tx, params, tx.init(params), params, obj_fun=lambda p: 0.0, loss=1.0)
    assert "loss" in received and "obj_fn" in received, received


def _word_level_tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "<eos>": 1}, unk_token="<eos>")), eos_token="<eos>"
    )


def test_defect_3_gpt2_converter_needs_the_hub_and_the_workaround_does_not():
    from levanter.models.gpt2 import Gpt2Config

    source = inspect.getsource(Gpt2Config.hf_checkpoint_converter)
    assert 'reference_checkpoint="gpt2"' in source
    with pytest.raises(Exception):
        Gpt2Config().hf_checkpoint_converter()  # offline (HF_HUB_OFFLINE=1 and no network in tests)

    tokenizer = _word_level_tokenizer()
    converter = levanter_models.hf_converter(Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1), tokenizer)
    assert converter.reference_checkpoint is None
    assert converter.tokenizer is tokenizer


def test_defect_3_an_hf_export_needs_the_reference_config_and_the_workaround_supplies_it():
    from levanter.compat.hf_checkpoints import HFCheckpointConverter
    from levanter.models.gpt2 import Gpt2Config
    import transformers

    tokenizer = _word_level_tokenizer()
    # What saving (hf_save_path) reads: the reference checkpoint's config, for "architectures".
    stock = HFCheckpointConverter(
        Gpt2Config, reference_checkpoint=None, HfConfigClass=transformers.GPT2Config, tokenizer=tokenizer
    )
    with pytest.raises(ValueError, match="Must provide a reference checkpoint"):
        stock.default_hf_config
    offline = levanter_models.hf_converter(Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1), tokenizer)
    assert offline.default_hf_config.architectures == ["GPT2LMHeadModel"]


def test_defect_5_upstream_train_returns_quietly_when_data_runs_out():
    from levanter.trainer import Trainer

    source = inspect.getsource(Trainer.training_steps)
    assert "Reached end of training data loader" in source and "break" in source
    # train() only complains when *no* step ran; stopping early otherwise goes unreported.
    train_source = inspect.getsource(Trainer.train)
    assert train_source.count("raise") == 1 and "if info is None" in train_source


def test_defect_6_chex_and_gitpython_are_undeclared_but_imported():
    requirements = " ".join(importlib.metadata.requires("levanter") or []).lower()
    assert "chex" not in requirements and "gitpython" not in requirements
    import levanter.optim.mars as levanter_mars_module
    import levanter.tracker.helpers as helpers

    assert "import chex" in inspect.getsource(levanter_mars_module)
    assert "git" in inspect.getsource(helpers).lower()


def test_defect_8_levanter_mars_calls_removed_jax_tree_map():
    from levanter.optim.mars import scale_by_mars

    tx = scale_by_mars(max_grad_norm=1.0)
    params = {"w": jnp.ones((2, 2))}
    with pytest.raises(AttributeError, match="tree_map"):
        tx.update(params, tx.init(params), params)


def test_defect_9_default_tracker_is_online_wandb_and_ours_is_offline():
    from levanter.trainer import TrainerConfig
    from levanter.tracker.wandb import WandbConfig

    from levanter_mars.training.trainer import MarsTrainerConfig

    upstream_tracker = TrainerConfig().tracker
    assert isinstance(upstream_tracker, WandbConfig) and upstream_tracker.mode is None
    assert MarsTrainerConfig().tracker.mode == "offline"


LOCAL_TASK = __import__("pathlib").Path(__file__).parent / "data" / "lm_eval_tasks" / "pydocs_mc.yaml"
REPO_ROOT = LOCAL_TASK.parents[3]


@pytest.mark.slow  # indexes lm-eval's ~14,000 built-in tasks
def test_defect_11_levanter_cannot_load_a_local_task_yaml(monkeypatch):
    from levanter.eval_harness import LmEvalHarnessConfig

    monkeypatch.chdir(REPO_ROOT)  # the task's data_files are relative to the working directory
    assert "tasks.TaskManager()" in inspect.getsource(LmEvalHarnessConfig.to_task_dict)
    with pytest.raises(ValueError, match="Failed to load task"):
        LmEvalHarnessConfig(task_spec=[str(LOCAL_TASK)]).to_task_dict()


def test_defect_11_workaround_indexes_local_task_directories(monkeypatch):
    import lm_eval.tasks
    from levanter.eval_harness import LmEvalHarnessConfig

    monkeypatch.chdir(REPO_ROOT)
    original = lm_eval.tasks.TaskManager
    with lm_eval_harness.lm_eval_task_manager([str(LOCAL_TASK.parent)], include_defaults=False):
        tasks = LmEvalHarnessConfig(task_spec=["pydocs_mc"]).to_task_dict()
    assert list(tasks) == ["pydocs_mc"]
    assert len(tasks["pydocs_mc"].test_docs()) == 48
    assert lm_eval.tasks.TaskManager is original


def test_defect_12_final_hooks_are_forced_twice_and_the_harness_hook_logs_without_a_step():
    import levanter.eval_harness
    import levanter.main.train_lm as train_lm
    from levanter.trainer import Trainer

    assert "self.run_hooks(info, force=True)" in inspect.getsource(Trainer.train)
    main_source = inspect.getsource(train_lm.main)
    assert "trainer.train(state, train_loader)" in main_source
    assert "trainer.run_hooks(last_info, force=True)" in main_source
    # The upstream hook itself has no memory of the steps it evaluated, and logs its results with step=None.
    hook_source = inspect.getsource(levanter.eval_harness.lm_eval_harness)
    assert "if step.step == 0 and not force" in hook_source and "_evaluated" not in hook_source
    assert "step=None" in inspect.getsource(levanter.eval_harness.log_report_to_tracker)


def test_defect_12_workaround_evaluates_each_step_once(monkeypatch, tmp_path):
    import levanter.eval_harness

    from levanter_mars.eval.in_training import EvalHarnessHook, results_dir
    from levanter_mars.eval.suite import EvalSuiteConfig

    monkeypatch.chdir(REPO_ROOT)
    calls = []

    def evaluate(config, model, tasks, *args):
        calls.append(model)
        return {"results": {"pydocs_mc": {"acc,none": 0.5}}, "n-samples": {"pydocs_mc": {"effective": 48}}}

    monkeypatch.setattr(levanter.eval_harness, "_actually_run_eval_harness", evaluate)

    class Info:
        def __init__(self, step):
            self.step, self.eval_model = step, f"model@{step}"

    hook = EvalHarnessHook(
        EvalSuiteConfig(task_spec=[str(LOCAL_TASK)]), None, None, {}, None, run_dir=str(tmp_path), run_name="r"
    )
    from levanter.tracker import NoopTracker, current_tracker

    with current_tracker(NoopTracker()):
        for step, force in [(0, False), (10, False), (19, False), (19, True), (19, True)]:
            hook.on_step(Info(step), force=force)
    assert calls == ["model@10", "model@19"]
    assert (tmp_path / "eval" / "in_training" / "step-19" / "results.md").exists()
    assert results_dir(str(tmp_path), 10).endswith("eval/in_training/step-10")


@pytest.mark.multidevice
def test_defect_13_eval_harness_fails_on_a_multi_device_mesh_and_the_workaround_places_the_batch():
    (result,) = run_helper_processes("tests.helpers.multidevice_eval_dispatch", devices=2, timeout=600)
    assert "incompatible devices" in result["without"], result
    assert result["with"]["finite"] and result["with"]["segments"].count(0) == 2, result


def test_defect_14_preemption_probe_needs_the_gce_metadata_server(monkeypatch):
    import levanter.infra.ray_tpu as ray_tpu
    import levanter.infra.tpus as tpus
    import requests

    def no_metadata_server(*args, **kwargs):
        raise requests.ConnectionError("no metadata.google.internal off GCE")

    monkeypatch.setattr(tpus.requests, "get", no_metadata_server)
    monkeypatch.setattr(tpus, "get_current_tpu_is_preempted", tpus.get_current_tpu_is_preempted)  # restored after
    with pytest.raises(requests.ConnectionError):
        tpus.get_current_tpu_is_preempted()
    # run_on_pod's slice and host health checks call it.
    assert inspect.getsource(ray_tpu).count("get_current_tpu_is_preempted()") >= 3

    levanter_infra.preemption_probe_off_gce()
    assert tpus.get_current_tpu_is_preempted() is False


def _temporary_checkpoint(path):
    os.makedirs(path)
    with open(os.path.join(path, "metadata.json"), "w") as f:
        json.dump({"step": 1, "is_temporary": True}, f)
    return path


def test_defect_15_a_relative_base_path_keeps_every_temporary_checkpoint(tmp_path, monkeypatch):
    from levanter.checkpoint import Checkpointer

    monkeypatch.chdir(tmp_path)
    checkpointer = Checkpointer("ckpts/run", None, [])
    # Checkpointer.on_step records the temporary checkpoint as join(base_path, "step-N") and later deletes that.
    temporary = _temporary_checkpoint(os.path.join(checkpointer.base_path, "step-1"))
    checkpointer._do_rm_checkpoint(temporary)
    assert os.path.isdir(temporary), "upstream now deletes it: remove checkpointer_base_path"


def test_defect_15_workaround_deletes_superseded_temporary_checkpoints(tmp_path, monkeypatch):
    from levanter_mars.training.checkpointing.writer import VerifiedCheckpointerConfig

    monkeypatch.chdir(tmp_path)
    checkpointer = VerifiedCheckpointerConfig(base_path="ckpts").create("run")
    assert checkpointer.base_path == os.path.join(os.getcwd(), "ckpts", "run")
    temporary = _temporary_checkpoint(os.path.join(checkpointer.base_path, "step-1"))
    checkpointer._do_rm_checkpoint(temporary)
    assert not os.path.exists(temporary)
    assert levanter_training.checkpointer_base_path("gs://bucket/ckpts/run") == "gs://bucket/ckpts/run"


def test_defect_18_levanter_starts_jax_distributed_with_the_default_heartbeat():
    from levanter.distributed import DistributedConfig

    assert "heartbeat_timeout" not in inspect.getsource(DistributedConfig.initialize)
    default = inspect.signature(jax.distributed.initialize).parameters["heartbeat_timeout_seconds"].default
    assert default >= 100, "jax now notices a dead peer quickly by default: reconsider jax_distributed.start"


def test_defect_18_start_passes_our_timeouts_and_hands_levanter_a_started_config(monkeypatch):
    from levanter.distributed import DistributedConfig

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *args, **kwargs: calls.append((args, kwargs)))
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    config = DistributedConfig(coordinator_address="127.0.0.1:1", num_processes=2, process_id=1)
    started = jax_distributed.start(config, heartbeat_timeout_s=7, initialization_timeout_s=9)
    (args, kwargs), = calls
    assert args[:3] == ("127.0.0.1:1", 2, 1)
    assert kwargs == {"initialization_timeout": 9, "heartbeat_timeout_seconds": 7}
    assert started.initialize_jax_distributed is False and started.coordinator_address == "127.0.0.1:1"
    assert jax_distributed.start(DistributedConfig(), heartbeat_timeout_s=7, initialization_timeout_s=9) == DistributedConfig()
    assert len(calls) == 1


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


def _tiny_gpt2(seq_len=16):
    from levanter.models.gpt2 import Gpt2Config

    config = Gpt2Config(seq_len=seq_len, hidden_dim=16, num_layers=1, num_heads=2, gradient_checkpointing=False)
    model = config.build(hax.Axis("vocab", 32), key=jax.random.PRNGKey(3))
    # Weights as large as a trained model's (not 0.02), so that the model is far from uniform.
    return jax.tree.map(lambda x: x * 20 if eqx.is_inexact_array(x) else x, model)


@contextlib.contextmanager
def _one_device_mesh():
    import numpy as np
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    with hax.partitioning.set_mesh(mesh), hax.axis_mapping({"batch": "data"}):
        yield


def _alone(model, tokens, n_scored, first_position=0):
    """log p(last n_scored tokens | the rest): the request alone in its own sequence, positions from first_position."""
    from levanter.layers.attention import AttentionMask

    Pos = hax.Axis("position", len(tokens) - 1)
    positions = hax.arange(Pos) + first_position
    logits = model(hax.named(jnp.array(tokens[:-1]), Pos), AttentionMask.causal(), pos_ids=positions).array
    log_probs = jax.nn.log_softmax(logits, axis=-1)[jnp.arange(len(tokens) - 1), jnp.array(tokens[1:])]
    return float(log_probs[-n_scored:].sum())


@pytest.mark.slow  # compiles a GPT-2 forward
def test_defect_20_levanter_scores_a_packed_request_at_the_positions_of_the_pack():
    from levanter.data.packing import PromptCompletion, greedy_pack_prompt_completions
    from levanter.eval_harness import _LmEvalHarnessWorker

    model = _tiny_gpt2()
    Batch, Pos = hax.Axis("batch", 1), model.Pos
    first, second = [5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15]  # prompt: 3 and 2 tokens
    packed = greedy_pack_prompt_completions(
        Pos, [PromptCompletion(first, 3, 0), PromptCompletion(second, 2, 1)], pad_token=0
    )
    assert len(packed) == 1, "both requests in one row"
    batch = jax.tree.map(lambda x: hax.stack(Batch, [x]) if isinstance(x, hax.NamedArray) else x, packed[0],
                         is_leaf=lambda x: isinstance(x, hax.NamedArray))
    with _one_device_mesh():
        worker = _LmEvalHarnessWorker(Batch, Pos, model, {}, None, None, max_packed_segments=2)
        segments, loglikelihoods, _ = worker.process_loglikelihood(batch)
    scores = dict(zip(segments.array.tolist(), loglikelihoods.array.tolist()))
    assert scores[0] == pytest.approx(_alone(model, first, 2), abs=1e-3)  # first in its row: right
    # The second request is scored at positions 5.. (behind the first), not at 0.. as lm-eval scores it.
    assert abs(scores[1] - _alone(model, second, 4)) > 1e-2
    assert scores[1] == pytest.approx(_alone(model, second, 4, first_position=len(first)), abs=1e-3)


@pytest.mark.slow  # compiles a GPT-2 forward per batch shape
def test_defect_20_workaround_scores_each_request_alone_and_truncates_as_lm_eval():
    from levanter.eval_harness import LevanterHarnessLM, _LmEvalHarnessWorker

    from levanter_mars.compat import lm_eval_scoring

    model = _tiny_gpt2()
    Batch, Pos = hax.Axis("batch", 2), model.Pos
    long_context = list(range(1, 25))  # 24 + 3 tokens > seq_len 16: lm-eval keeps the last 17, scores 3
    requests = [(("", ""), [5, 6, 7], [8, 9]), (("", ""), [10, 11], [12, 13, 14, 15])]
    requests += [(("", ""), long_context, [30, 31, 29])]
    requests += [(("", ""), [3] * (i + 1), [4, 5]) for i in range(5)]  # more rows than one batch
    with _one_device_mesh(), lm_eval_scoring.score_as_lm_eval():
        worker = _LmEvalHarnessWorker(Batch, Pos, model, {}, None, None, max_packed_segments=64)
        results = LevanterHarnessLM(worker)._loglikelihood_tokens(requests)
    for (_, context, continuation), (loglikelihood, _) in zip(requests, results):
        window = (context + continuation)[-(Pos.size + 1):]
        assert loglikelihood == pytest.approx(_alone(model, window, len(continuation)), abs=1e-3)
    # Requests share rows: the first two are packed together.
    arrays, where = lm_eval_scoring.pack_windows(
        [lm_eval_scoring.lm_eval_window(c, x, Pos.size) for _, c, x in requests], Pos.size, 64
    )
    assert where[0][0] == where[1][0] and len(arrays[0]) < len(requests)


@pytest.mark.multidevice
def test_defect_22_eval_broadcasts_fail_across_processes_under_set_mesh_and_the_workaround_delivers_them():
    for result in run_helper_processes("tests.helpers.multiprocess_broadcast", num_processes=2, devices=2):
        assert "fully addressable" in result["without"], result
        assert result["with"] == "7", result


def test_defect_24_haliax_calls_a_jax_name_newer_jax_removed_and_the_workaround_restores_it(monkeypatch):
    import haliax.jax_utils
    import jax.core

    from levanter_mars.compat import newer_jax

    assert "jax.core.is_constant_dim" in inspect.getsource(haliax.jax_utils)
    original = jax.core.is_constant_dim  # the pinned jax has it (a deprecated alias since 0.10)
    newer_jax.restore_jax_names_haliax_uses()
    assert jax.core.is_constant_dim is original  # nothing changes

    def no_such_name(name):
        raise AttributeError(f"module 'jax.core' has no attribute {name!r}")

    # As in jax 0.11: neither an attribute nor a deprecated alias (served by the module's __getattr__ on 0.10).
    monkeypatch.setattr(jax.core, "is_constant_dim", None, raising=False)  # undone last: the module as it was
    monkeypatch.delattr(jax.core, "is_constant_dim")
    monkeypatch.setattr(jax.core, "__getattr__", no_such_name, raising=False)
    assert not hasattr(jax.core, "is_constant_dim")
    newer_jax.restore_jax_names_haliax_uses()
    assert jax.core.is_constant_dim(3) and not jax.core.is_constant_dim(object())


def test_defect_25_levanter_models_load_when_the_levanter_package_cannot_be_imported():
    import subprocess
    import sys

    # A GPU image without Ray: `import levanter` fails, its GPT-2 model must still load.
    code = """
import sys
class NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("no ray here")
sys.meta_path.insert(0, NoRay())
try:
    import levanter
except ImportError:
    pass
else:
    raise SystemExit("levanter imported without ray: the workaround may be unnecessary")
from levanter_mars.compat import newer_jax
assert newer_jax.levanter_importable() == "models only"
from levanter.models.gpt2 import Gpt2Config
print(Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1).Embed.size)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "32"


def test_defect_26_ray_names_the_job_config_variable_only_privately():
    import ray.job_submission

    from levanter_mars.compat.ray_jobs import RAY_JOB_CONFIG_JSON_ENV_VAR

    assert RAY_JOB_CONFIG_JSON_ENV_VAR == "RAY_JOB_CONFIG_JSON_ENV_VAR"
    public = [getattr(module, name) for module in (ray, ray.job_submission) for name in dir(module)]
    assert RAY_JOB_CONFIG_JSON_ENV_VAR not in [v for v in public if isinstance(v, str)]


def test_defect_27_a_task_that_fails_to_load_is_not_named_and_the_workaround_names_it(monkeypatch):
    import lm_eval.tasks
    from levanter.eval_harness import LmEvalHarnessConfig

    def failing_load(task_list, manager):
        task_list[0].pop("task")  # as lm-eval does with a dict entry, before its dataset fails to load
        raise FileNotFoundError("data file missing")

    monkeypatch.setattr(lm_eval.tasks, "get_task_dict", failing_load)
    with pytest.raises(FileNotFoundError) as upstream_error:
        LmEvalHarnessConfig(task_spec=[])._get_task_and_rename(None, "my_alias", {"task": "broken_mc"})
    assert "my_alias" not in str(upstream_error.value)
    with pytest.raises(ValueError, match="Failed to load task my_alias") as ours:
        lm_eval_harness.TaskErrorsNamed(task_spec=[])._get_task_and_rename(None, "my_alias", {"task": "broken_mc"})
    assert isinstance(ours.value.__cause__, FileNotFoundError)


def test_defect_2_the_copied_train_step_fails_loudly_when_upstreams_changes(monkeypatch):
    from levanter.trainer import Trainer

    levanter_training.check_copied_train_step_is_current()  # the pinned Levanter: the copy is of this very source
    original = Trainer._train_step

    def changed(self, state, batch, batch_kwargs, _no_hooks=False):  # what any upstream edit looks like to the hash
        return original(self, state, batch, batch_kwargs, _no_hooks)

    monkeypatch.setattr(Trainer, "_train_step", changed)
    with pytest.raises(RuntimeError, match="Trainer._train_step changed"):
        levanter_training.check_copied_train_step_is_current()
    with pytest.raises(RuntimeError, match="COPIED_TRAIN_STEP_SHA256"):  # before the trainer uses any argument
        levanter_training.FixedTrainer(None, None, None)


def test_defect_10_data_loader_prefetch_thread_has_no_public_stop():
    import numpy as np
    from levanter.data import DataLoader
    from levanter.data.dataset import ListAsyncDataset

    with _one_device_mesh():
        data = ListAsyncDataset([np.arange(4, dtype=np.int32)] * 64, is_complete=True)
        iterator = iter(DataLoader(data, batch_size=2, max_buffered_batches=2))
        next(iterator)
        thread = iterator._batches.thread
        assert thread.is_alive()  # blocked on its full queue, 31 batches to go
        assert not [name for name in ("stop", "close", "shutdown") if hasattr(iterator, name)]
        levanter_training.stop_data_loader(iterator)
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_defect_16_datasets_reports_each_packaged_builder_load_to_s3(monkeypatch, tmp_path):
    import datasets.config
    import datasets.load

    heads = []

    class _Session:
        def head(self, url, **kwargs):
            heads.append(url)

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # as outside the tests (conftest sets it)
    monkeypatch.setattr(datasets.load, "get_session", _Session)
    datasets.load.PackagedDatasetModuleFactory("json", data_files=str(tmp_path / "x.jsonl"))
    assert heads and "s3.amazonaws.com" in heads[0], heads
    heads.clear()
    with lm_eval_harness.no_datasets_download_counts():
        datasets.load.PackagedDatasetModuleFactory("json", data_files=str(tmp_path / "x.jsonl"))
    assert heads == []


def _node_exists(node_id: str) -> bool:
    import ast
    from pathlib import Path

    path, function = node_id.split("::")
    file = Path(__file__).resolve().parent.parent / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    return any(isinstance(n, ast.FunctionDef) and n.name == function for n in tree.body)


def _workaround_exists(name: str) -> bool:
    import importlib
    from pathlib import Path

    if (Path(__file__).resolve().parent.parent / name).is_file():
        return True
    parts = f"levanter_mars.{name}".split(".")
    for split in range(len(parts), 1, -1):
        try:
            target = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for attribute in parts[split:]:
                target = getattr(target, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_every_compat_entry_names_the_installed_version_a_workaround_and_a_reproducing_test_that_exist():
    from levanter_mars.compat import DEFECTS

    numbers = [d.number for d in DEFECTS]
    assert len(numbers) == len(set(numbers)), numbers
    for defect in DEFECTS:
        package, version = defect.upstream.split("==")
        installed = ".".join(map(str, __import__("sys").version_info[:2])) if package == "python" else (
            importlib.metadata.version(package)
        )
        assert installed == version, (defect.number, defect.upstream, installed)
        assert _workaround_exists(defect.workaround), (defect.number, defect.workaround)
        assert _node_exists(defect.test), (defect.number, defect.test)
        assert f"defect_{defect.number}_" in defect.test or defect.number == 17, (defect.number, defect.test)


def test_every_defect_the_compat_modules_cite_is_in_the_index():
    import re
    from pathlib import Path

    from levanter_mars.compat import DEFECTS

    listed = {d.number for d in DEFECTS}
    package = Path(levanter_training.__file__).parent
    cited = set()
    for module in package.glob("*.py"):
        for group in re.findall(r"[Dd]efects? ([\d, and]+)", module.read_text()):
            cited.update(int(n) for n in re.findall(r"\d+", group))
    assert cited <= listed, sorted(cited - listed)
    assert cited, "no module cites a defect: the pattern is stale"
@contextlib.contextmanager
def _root_logging_restored():
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:], root.level = handlers, level


def test_defect_28_levanter_names_its_log_file_run_id_dot_log_dot_log(tmp_path):
    import levanter.utils.logging as levanter_logging
    from levanter.trainer import TrainerConfig

    assert 'init_logging(self.log_dir, f"{id}.log")' in inspect.getsource(TrainerConfig.initialize)
    with _root_logging_restored():
        levanter_logging.init_logging(tmp_path, "run-1.log")
    assert [p.name for p in tmp_path.iterdir()] == ["run-1.log.log"]


def test_defect_28_workaround_names_it_run_id_dot_log(tmp_path):
    import levanter.utils.logging as levanter_logging

    from levanter_mars.compat.levanter_logging import log_file_named_by_run_id

    with _root_logging_restored(), log_file_named_by_run_id():
        levanter_logging.init_logging(tmp_path, "run-1.log")  # as TrainerConfig.initialize calls it
    assert [p.name for p in tmp_path.iterdir()] == ["run-1.log"]
    assert levanter_logging.init_logging.__name__ == "init_logging", "the patch outlived Levanter's initialize"


def test_defect_29_levanter_gives_every_other_process_an_offline_wandb_run(monkeypatch):
    import levanter.tracker.wandb as levanter_wandb
    import wandb

    asked = []

    class Stop(Exception):
        pass

    def init(**kwargs):
        asked.append(kwargs["mode"])
        raise Stop  # what it asked for is all that matters

    monkeypatch.setattr(levanter_wandb.jax, "process_index", lambda: 1)
    monkeypatch.setattr(wandb, "init", init)
    with pytest.raises(Stop):
        levanter_wandb.WandbConfig(mode="disabled").init("run-1")
    assert asked == ["offline"], "process 1 writes an offline W&B run, whatever the config says"


def test_defect_29_workaround_leaves_wandb_to_process_zero(monkeypatch):
    from levanter.tracker.tracker import NoopConfig, NoopTracker
    from levanter.tracker.wandb import WandbConfig

    from levanter_mars.compat import tracking
    from levanter_mars.training.trainer import MarsTrainerConfig

    wandb_and_noop = MarsTrainerConfig(tracker=(WandbConfig(mode="offline"), NoopConfig()))
    single = MarsTrainerConfig(tracker=WandbConfig(mode="offline"))
    tracking.only_process_zero_tracks(single)  # process 0 (this test): unchanged
    assert isinstance(single.tracker, WandbConfig)

    monkeypatch.setattr(tracking.jax, "process_index", lambda: 1)
    joined = []
    monkeypatch.setattr(tracking.jax, "process_count", lambda: 2)
    monkeypatch.setattr(tracking, "multihost_broadcast_sync", lambda obj, is_source: joined.append(is_source) or {})
    tracking.only_process_zero_tracks(single)
    tracking.only_process_zero_tracks(wandb_and_noop)
    assert isinstance(single.tracker, tracking.WandbOnProcessZeroOnly)
    assert [type(t) for t in wandb_and_noop.tracker] == [tracking.WandbOnProcessZeroOnly, NoopConfig]
    assert isinstance(single.tracker.init("run-1"), NoopTracker)
    assert joined == [False], "process 1 must join process 0's broadcast of the run's W&B identity"
    import draccus

    assert draccus.encode(single)["tracker"] == {"type": "wandb_on_process_zero_only"}  # configs get encoded


def test_defect_30_levanter_logs_the_traceback_of_a_task_that_fails_to_load(caplog):
    """The reason for levanter_mars.compat.lm_eval_harness.task_load_failures_unlogged (the workaround is shown
    by tests/test_eval_suites.py::test_an_unknown_task_is_one_line_naming_it_and_its_near_names): Levanter logs the
    whole traceback, then raises the same failure."""
    from levanter.eval_harness import LmEvalHarnessConfig

    with pytest.raises(ValueError, match="Failed to load task no_such_task"):
        LmEvalHarnessConfig(task_spec=["no_such_task"]).to_task_dict()
    logged = [r for r in caplog.records if r.name == "levanter.eval_harness" and r.exc_info]
    assert logged and logged[0].getMessage() == "Failed to load task no_such_task"


def test_defect_31_levanters_gpt2_hf_config_omits_resid_pdrop_and_the_mlp_width():
    from levanter.models.gpt2 import Gpt2Config

    hf = Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1, resid_pdrop=0.0, mlp_scale=2).to_hf_config(100)
    assert hf.resid_pdrop == 0.1, "transformers' default, not the trained 0.0"
    assert hf.n_inner is None  # read as 4 x n_embd = 128, not the trained 2 x 32


def test_defect_31_workaround_the_export_config_json_holds_what_was_trained(tmp_path):
    """Every field of an export's config.json that describes the model, read back by transformers, against the
    trained Levanter config (non-default values wherever the field allows)."""
    import transformers
    from levanter.models.gpt2 import Gpt2Config, Gpt2LMHeadModel

    tokenizer = _word_level_tokenizer()
    trained = Gpt2Config(
        seq_len=64, hidden_dim=32, num_heads=2, num_layers=3, mlp_scale=2, initializer_range=0.03,
        embed_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-6,
        scale_attn_by_inverse_layer_idx=True, upcast_attn=True,
    )  # fmt: skip
    Vocab = hax.Axis("vocab", len(tokenizer))
    model = Gpt2LMHeadModel.init(Vocab, trained, key=jax.random.PRNGKey(0))
    converter = levanter_models.hf_converter(trained, tokenizer)
    with jax.set_mesh(jax.sharding.Mesh(jax.devices()[:1], ("data",))):  # as the trainer's export hook runs
        converter.save_pretrained(model, str(tmp_path), save_reference_code=False)
    exported = transformers.GPT2Config.from_pretrained(str(tmp_path))
    expected = {
        "vocab_size": len(tokenizer), "n_positions": 64, "n_embd": 32, "n_head": 2, "n_layer": 3, "n_inner": 64,
        "initializer_range": 0.03, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "attn_pdrop": 0.0,
        "layer_norm_epsilon": 1e-6, "activation_function": "gelu_new", "scale_attn_by_inverse_layer_idx": True,
        "reorder_and_upcast_attn": True, "architectures": ["GPT2LMHeadModel"],
    }  # fmt: skip
    assert {k: getattr(exported, k) for k in expected} == expected


def _next_token_loss_inputs():
    Batch, Pos, Embed, Vocab = hax.Axis("b", 2), hax.Axis("position", 6), hax.Axis("embed", 4), hax.Axis("vocab", 7)
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    embeddings = hax.random.normal(k1, (Batch, Pos, Embed))
    lm_head = hax.random.normal(k2, (Embed, Vocab))
    ids = hax.named(jax.random.randint(k3, (2, 6), 0, 7), (Batch, Pos))
    float_mask = hax.named(jnp.array([[1, 1, 0, 1, 1, 1], [0, 1, 1, 1, 0, 1]], dtype=jnp.float32), (Batch, Pos))
    return (Pos, Embed, Vocab, embeddings, lm_head, ids), float_mask


def _plain_next_token_loss(embeddings, lm_head, ids, mask) -> float:
    """Mean cross-entropy of the next token over the masked positions but the last, in plain jnp."""
    logits = embeddings.array @ lm_head.array
    targets = jnp.roll(ids.array, -1, axis=1)
    token_loss = jax.nn.logsumexp(logits, axis=-1) - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
    keep = (mask.array != 0).at[:, -1].set(False)
    return float(jnp.sum(jnp.where(keep, token_loss, 0.0)) / jnp.sum(keep))


def test_defect_7_levanter_loss_passes_a_float_where_mask_and_the_workaround_casts_it(monkeypatch):
    from levanter.models import loss as levanter_loss

    from levanter_mars.compat import levanter_loss as loss_fix

    upstream = {name: inspect.unwrap(getattr(levanter_loss, name)) for name in loss_fix.MASKED_LOSSES}
    for name, function in upstream.items():  # however an earlier test left the module
        monkeypatch.setattr(levanter_loss, name, function)
    args, float_mask = _next_token_loss_inputs()

    def loss_and_messages():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = levanter_loss.maybe_fused_next_token_loss(*args, loss_mask=float_mask, reduction=hax.mean)
            except (TypeError, ValueError) as error:  # jax >= 0.8
                return None, [str(error)]
        return float(value.array), [str(w.message) for w in caught]

    _, upstream_messages = loss_and_messages()  # jax 0.7: a deprecation warning; jax >= 0.8: an error
    assert any("where must be None or a boolean array" in m for m in upstream_messages), upstream_messages
    loss_fix.boolean_loss_masks()
    loss_fix.boolean_loss_masks()  # idempotent: wraps once
    assert all(getattr(levanter_loss, name).__wrapped__ is function for name, function in upstream.items())
    value, messages = loss_and_messages()
    assert not any("where must be None" in m for m in messages), messages
    assert value == pytest.approx(_plain_next_token_loss(*args[3:], float_mask), rel=1e-5)


def test_defect_32_the_jitted_train_step_has_no_public_handle():
    import functools

    from levanter.trainer import Trainer

    assert not [name for name in dir(Trainer) if "jit" in name and not name.startswith("_")]
    assert isinstance(Trainer.__dict__["_jit_train_step_fn"], functools.cached_property)
    assert levanter_training.jitted_train_step.__doc__.startswith("Defect 32")
    import levanter.eval

    assert not [name for name in dir(levanter.eval) if "RunningMeans" in name and not name.startswith("_")]
    public = [name for name in dir(levanter.eval.TaggedEvaluator) if not name.startswith("_")]
    assert not [name for name in public if "state" in name or "zeros" in name], public
    assert levanter_training.eval_loss_running_state.__doc__.startswith("Defect 32")


def _trainer_like_mesh():
    """One device, Auto axes, as Levanter's Trainer builds its mesh (``jax.sharding.Mesh``) on every jax.

    ``jax.make_mesh``'s default axis type was Auto on jax 0.7.2 and is Explicit on 0.9.2, under which Mixtral's
    ``ragged_dot_general`` has no sharding rule: the axis type is stated, not left to the jax version."""
    return jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen", "gemma", "olmo2", "mixtral"])
def test_defect_33_family_converters_need_the_hub_and_the_workaround_does_not(family, tmp_path):
    from haliax.partitioning import set_mesh
    from levanter.models.lm_model import LmConfig

    config = LmConfig.get_choice_class(family)(
        hidden_dim=32, intermediate_dim=32, num_layers=1, num_heads=2, num_kv_heads=1, seq_len=16
    )
    with pytest.raises(Exception):
        config.hf_checkpoint_converter()  # loads the reference checkpoint's tokenizer (offline in tests)

    tokenizer = _word_level_tokenizer()
    converter = levanter_models.hf_converter(config, tokenizer)
    assert converter.reference_checkpoint is None and converter.tokenizer is tokenizer
    model = config.build(hax.Axis("vocab", len(tokenizer)), key=jax.random.PRNGKey(0))
    with set_mesh(_trainer_like_mesh()):
        converter.save_pretrained(model, str(tmp_path), save_tokenizer=False)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == [converter.default_hf_config.architectures[0]]
    assert saved["architectures"][0].endswith("ForCausalLM") and saved["vocab_size"] == len(tokenizer)


def test_defect_33_a_family_without_a_converter_is_refused_by_name():
    from levanter.models.gpt2_hyena import Gpt2HyenaConfig

    assert "no HF converter for Gpt2HyenaConfig" in levanter_models.hf_export_refusal(Gpt2HyenaConfig())
    assert levanter_models.hf_converter(Gpt2HyenaConfig(), _word_level_tokenizer()) is None


@pytest.mark.slow  # compiles a Mixtral gradient
def test_defect_34_mixtral_loss_cannot_be_differentiated_and_the_workaround_can(monkeypatch):
    from haliax.partitioning import set_mesh
    from levanter.models import loss as levanter_loss

    from levanter_mars.compat import levanter_loss as loss_fix
    from levanter.models.lm_model import LmExample, compute_next_token_loss
    from levanter.models.mixtral import MixtralConfig
    import levanter.tracker
    from levanter.tracker import NoopTracker

    config = MixtralConfig(hidden_dim=16, intermediate_dim=16, num_layers=1, num_heads=2, num_kv_heads=1, seq_len=8,
                           n_routed_experts=2, num_experts_per_tok=1, use_flash_attention=False)
    model = config.build(hax.Axis("vocab", 11), key=jax.random.PRNGKey(0))
    tokens = hax.named(jnp.arange(8) % 11, config.Pos)
    example = LmExample.causal(tokens)

    def grad_of(loss_fn):
        return eqx.filter_grad(lambda m: loss_fn(m, example, key=None).scalar())(model)

    levanter.tracker.set_global_tracker(NoopTracker())
    for name in loss_fix.MASKED_LOSSES:  # put back after the test, however it leaves them
        monkeypatch.setattr(levanter_loss, name, getattr(levanter_loss, name))
    loss_fix.boolean_loss_masks()  # as the stack does (defect 7): jax >= 0.8 rejects the float mask before the JVP
    with set_mesh(_trainer_like_mesh()):
        with pytest.raises(ValueError, match="IO callbacks do not support JVP"):
            grad_of(compute_next_token_loss)
        grads = grad_of(levanter_models.differentiable_loss(compute_next_token_loss))
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree.leaves(grads))


def test_defect_36_levanter_tells_missing_paths_from_a_missing_checkpoint_only_by_the_message(tmp_path):
    from levanter.checkpoint import load_checkpoint
    from levanter.tensorstore_serialization import tree_deserialize_leaves_tensorstore, tree_serialize_leaves_tensorstore

    tree_serialize_leaves_tensorstore(str(tmp_path / "ckpt"), {"a": jnp.zeros(3)})
    with pytest.raises(FileNotFoundError) as not_stored:
        tree_deserialize_leaves_tensorstore(str(tmp_path / "ckpt"), {"a": jnp.zeros(3), "b": jnp.zeros(2)})
    with pytest.raises(FileNotFoundError) as no_checkpoint:
        load_checkpoint({"a": jnp.zeros(3)}, str(tmp_path / "gone"), discover_latest=False)
    assert type(not_stored.value) is type(no_checkpoint.value), "one class for both"
    assert levanter_training.missing_checkpoint_paths(not_stored.value) == [str(tmp_path / "ckpt" / "b")]
    assert levanter_training.missing_checkpoint_paths(no_checkpoint.value) is None
    assert levanter_training.missing_checkpoint_paths(FileNotFoundError("Missing paths: not a list")) is None


class _Worker:
    """Stands in for Levanter's harness worker: records whether process 0 released the others (STOP)."""

    stops: list = []

    def __init__(self, *args, **kwargs):
        self.sample_logging_config = self.profiler_config = None

    def make_harness_lm(self):
        return types.SimpleNamespace(leader=self, clear_sample_outputs=lambda: None)

    def stop(self):
        _Worker.stops.append(True)


def test_defect_39_a_failure_in_lm_eval_never_releases_the_harness_workers_and_the_workaround_does(monkeypatch):
    import levanter.eval_harness as harness

    def failing_evaluate(lm, *args, **kwargs):
        raise ValueError("a task failed while scoring")

    monkeypatch.setattr(harness, "_LmEvalHarnessWorker", _Worker)
    monkeypatch.setattr(harness.evaluator, "evaluate", failing_evaluate)
    model = types.SimpleNamespace(Pos=hax.Axis("position", 8))
    run = lambda: harness._actually_run_eval_harness(  # noqa: E731
        harness.LmEvalHarnessConfig(task_spec=[]), model, {}, None, hax.Axis("batch", 2), {}, None
    )
    _Worker.stops.clear()
    with pytest.raises(ValueError, match="while scoring"):
        run()
    assert _Worker.stops == [], "the other processes would wait for requests forever"
    with pytest.raises(ValueError, match="while scoring"), lm_eval_harness.workers_released_on_failure():
        run()
    assert _Worker.stops == [True]


def test_defect_39_lm_eval_does_not_name_the_task_that_failed_and_the_workaround_finds_it(monkeypatch):
    from levanter.eval_harness import LmEvalHarnessConfig

    monkeypatch.chdir(REPO_ROOT)
    with lm_eval_harness.lm_eval_task_manager([str(LOCAL_TASK.parent)], include_defaults=False):
        task = LmEvalHarnessConfig(task_spec=["pydocs_mc"]).to_task_dict()["pydocs_mc"]
    doc = task.test_docs()[0]
    with pytest.raises(Exception) as error:  # scoring with results of the wrong shape fails inside the task
        task.process_results(doc, [None])
    assert "pydocs_mc" not in str(error.value)
    assert lm_eval_harness.failing_task(error.value) == "pydocs_mc"
    assert lm_eval_harness.failing_task(ValueError("the model failed")) is None


def _checkpoint_with_arrays(path):
    """A committed temporary checkpoint: metadata, manifest and array chunks, named so that a listing order puts
    some chunks before the metadata."""
    _temporary_checkpoint(path)
    for name in ("a/0.0", "a/.zarray", "manifest.json", "z/0.0"):
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        with open(os.path.join(path, name), "w") as f:
            f.write("x")
    return path


class _Interrupted(Exception):
    pass


def _delete_cut_short_after(monkeypatch, deletions: int):
    """Every delete through fsspec's local filesystem raises (a kill) once ``deletions`` files are gone."""
    from fsspec.implementations.local import LocalFileSystem

    gone = []
    real_rm_file = LocalFileSystem.rm_file

    def rm_file(self, path):
        if len(gone) == deletions:
            raise _Interrupted(path)
        real_rm_file(self, path)
        gone.append(path)

    def rm(self, path, recursive=False, maxdepth=None):  # as object storage does: file by file, in listing order
        for file in sorted(self.find(path)):
            self.rm_file(file)
        real_rm_file_tree(path)

    import shutil

    real_rm_file_tree = shutil.rmtree
    monkeypatch.setattr(LocalFileSystem, "rm_file", rm_file)
    monkeypatch.setattr(LocalFileSystem, "rm", rm)
    return gone


def test_defect_40_levanter_deletes_a_checkpoint_in_one_recursive_delete_and_the_workaround_unmarks_it(
    tmp_path, monkeypatch
):
    from levanter.checkpoint import Checkpointer

    from levanter_mars.training.checkpointing.audit import audit_checkpoint
    from levanter_mars.training.checkpointing.writer import VerifiedCheckpointerConfig

    # Levanter's delete, cut short after its first file: metadata.json is still there, a chunk is not.
    upstream = Checkpointer(str(tmp_path / "upstream"), None, [])
    torn = _checkpoint_with_arrays(str(tmp_path / "upstream" / "step-1"))
    _delete_cut_short_after(monkeypatch, 1)
    upstream._do_rm_checkpoint(torn)  # logs the failure, as Levanter does
    assert not os.path.exists(os.path.join(torn, "a", ".zarray"))
    assert os.path.exists(os.path.join(torn, "metadata.json")), "upstream now deletes metadata first: remove defect 40"

    # Ours, cut short after its first file: the metadata went first, and the audit sees an incomplete checkpoint.
    ours = VerifiedCheckpointerConfig(base_path=str(tmp_path / "ours")).create("run")
    cut = _checkpoint_with_arrays(os.path.join(ours.base_path, "step-1"))
    monkeypatch.undo()
    _delete_cut_short_after(monkeypatch, 1)
    with pytest.raises(_Interrupted):
        ours._do_rm_checkpoint(cut)
    assert not os.path.exists(os.path.join(cut, "metadata.json"))
    assert audit_checkpoint(cut).state == "incomplete"
    # Not cut short, it deletes everything.
    monkeypatch.undo()
    ours._do_rm_checkpoint(cut)
    assert not os.path.exists(cut)


def test_defect_41_a_fresh_trainer_states_step_is_weakly_typed_a_loaded_one_not_and_the_workaround_aligns_them(
    tmp_path,
):
    import equinox as eqx
    import haliax as hax
    import optax
    from levanter.checkpoint import load_checkpoint, save_checkpoint
    from levanter.trainer_state import TrainerState

    from levanter_mars.compat.levanter_training import strongly_typed_step

    class Tiny(eqx.Module):
        w: hax.NamedArray

    model = Tiny(hax.ones(hax.Axis("d", 4)))
    fresh = TrainerState.init(optax.sgd(0.1), model, key=jax.random.PRNGKey(0), is_trainable=True)
    assert fresh.step.weak_type, "upstream now makes the step strongly typed: remove defect 41"
    save_checkpoint(fresh, step=0, checkpoint_path=str(tmp_path / "step-0"))
    with _one_device_mesh():
        loaded = load_checkpoint(fresh, str(tmp_path / "step-0"))
    assert not loaded.step.weak_type

    # The jit hooks' `step % every` is another program for each type: another persistent-cache key.
    def due(step):
        return step % 10 == 0

    def typed(step):
        return jax.ShapeDtypeStruct(step.shape, step.dtype, weak_type=step.weak_type)

    program = {name: jax.jit(due).lower(typed(s.step)).as_text(debug_info=False) for name, s in
               [("fresh", fresh), ("loaded", loaded), ("workaround", strongly_typed_step(fresh))]}  # fmt: skip
    assert program["fresh"] != program["loaded"]
    assert program["workaround"] == program["loaded"]
    fixed = strongly_typed_step(fresh)
    assert not fixed.step.weak_type and int(fixed.step) == 0 and fixed.step.dtype == loaded.step.dtype
    assert strongly_typed_step(loaded) is loaded
