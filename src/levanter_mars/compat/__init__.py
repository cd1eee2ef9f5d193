"""Every monkeypatch and private-name use of a dependency (Levanter, lm-eval, datasets, wandb, jax, argparse).

Each piece names the defect it works around; ``tests/test_compat.py`` reproduces each defect against the installed
packages, so that the day upstream fixes one, its test fails and the workaround can be deleted. Nothing outside this
package patches a dependency or reaches for a private name.

Levanter 1.2.dev1644:

1. ``LambdaCallback.on_step(info, force)`` drops ``force``, so the end-of-training checkpoint is never written:
   :func:`levanter_training.forward_force_to_checkpointer`.
2. ``Trainer._train_step``'s ``obj_fun`` unpacks ``(loss, metrics)`` from a loss function that returns one value,
   is not microbatched, and ``take_train_step`` passes ``loss=`` along: our trainer overrides the step
   (:func:`levanter_training.microbatched_gradients` reaches the private microbatching), and MARS calls
   ``obj_fn(params)`` only.
3. ``Gpt2Config.hf_checkpoint_converter`` hard-codes ``reference_checkpoint="gpt2"`` and so contacts the HF hub:
   :func:`levanter_models.hf_converter` builds GPT-2's converter offline (training and the standalone eval both use it;
   no patch since the entry point builds the converter itself).
4. *Retired:* ``train_lm.main`` hard-codes ``Trainer``. Our own entry point builds ``MarsTrainer`` itself.
5. Training ends quietly when the data runs out before ``num_train_steps``: ``MarsTrainer.train`` raises instead.
6. Not declared by Levanter: ``chex`` and ``GitPython``: pinned in ``pyproject.toml``.
7. Levanter's loss passes a float ``where=`` mask, an error from jax 0.8: ``jax==0.7.2`` is pinned.
8. Levanter's own ``mars`` calls ``jax.tree_map`` (removed from jax): we register ``mars-*`` names instead, and the
   benchmarks build and trace it under :func:`levanter_optimizers.jax_tree_map_restored`.
9. The default tracker (wandb, online) fails without an API key: :func:`tracking.wandb_offline_unless_configured`.
10. ``DataLoaderIterator`` starts a prefetch thread and has no public way to stop it; if the process exits while it
    reads, the interpreter aborts (exit 134): :func:`levanter_training.stop_data_loader`.
11. ``LmEvalHarnessConfig.to_task_dict`` builds ``TaskManager()`` with no ``include_path``, so a local task YAML
    cannot be evaluated: :func:`lm_eval_harness.lm_eval_task_manager`.
12. *Patch retired:* ``train_lm.main`` forced the final hooks twice and Levanter's harness hook logged with
    ``step=None``; our entry point installs :class:`levanter_mars.eval.in_training.EvalHarnessHook` itself, which
    reaches Levanter's private evaluation through :func:`lm_eval_harness.run_eval_harness`.
13. The eval harness fails on a mesh of more than one device ("Received incompatible devices for jitted
    computation"): :func:`lm_eval_harness.eval_harness_on_mesh`.
14. ``levanter.infra.tpus.get_current_tpu_is_preempted`` asks the GCE metadata server without a timeout:
    :func:`levanter_infra.preemption_probe_off_gce` (local-engine Ray workers only).
15. ``Checkpointer`` deletes a superseded temporary checkpoint at ``join(base_path, path)`` where ``path`` already
    starts with ``base_path``: with a relative base path every temporary checkpoint stays on disk:
    :func:`levanter_training.checkpointer_base_path`.
18. ``DistributedConfig.initialize`` gives ``jax.distributed`` a 100 s heartbeat and no way to change it, so a host
    outlives a dead peer by minutes: :func:`jax_distributed.start` starts it with short, stated timeouts.
20. The eval harness packs requests into one sequence but does not restart their positions (every request after the
    first in a pack is scored at shifted positions by a model with absolute position embeddings), splits context and
    continuation otherwise than lm-eval, and truncates a long request to one token less than lm-eval's ``hf``
    backend: :func:`lm_eval_scoring.score_as_lm_eval` (entered by :func:`lm_eval_harness.run_eval_harness`).
22. On more than one process, the eval harness's ``broadcast_shard`` (process 0 sending each message and batch to the
    other processes) fails under ``jax.set_mesh``, which Levanter's trainer enters: ``jnp`` inputs come out replicated
    over the whole, not fully addressable, mesh: :func:`lm_eval_harness.broadcasts_across_processes`.

24, 25. Newer jax than pinned, for the benchmarks' GPU image: :mod:`newer_jax`.
26. Ray's job config reaches the driver through an environment variable named only privately: :mod:`ray_jobs`.
27. A task that fails to load is not named in Levanter's error (lm-eval pops its name first):
    :class:`lm_eval_harness.TaskErrorsNamed`.
28. Every other family's ``hf_checkpoint_converter`` (Llama, Mistral, Qwen, Gemma, OLMo 2, Mixtral) loads its reference
    checkpoint's tokenizer and config from the hub as it is built (``meta-llama/Llama-2-7b-hf``: 51 s of retries,
    then ``OSError``): :func:`levanter_models.hf_converter` builds them from the model config and the data's tokenizer
    (:func:`levanter_models.offline_family_converter`); :func:`levanter_models.hf_export_refusal` names a family with
    no converter before anything compiles.
29. Mixtral's transformer calls ``levanter.tracker.jit_log`` inside the loss, an ``io_callback`` with no JVP rule
    ("IO callbacks do not support JVP"): :func:`levanter_models.differentiable_loss` defers it (the expert-load
    metrics are dropped).

Other pinned dependencies:

23. Ray 2.60's ``ray start --address`` refuses to add a node while ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, the one
    setting that keeps every listener on 127.0.0.1, so a local pod cannot have one Ray node per simulated host:
    ``python -m levanter_mars.compat.ray_local_nodes`` (reproduced in ``tests/test_infra_local_ray.py``, which needs
    a Ray cluster).

16. ``datasets`` sends a HEAD request to s3.amazonaws.com for every load of a packaged builder unless
    ``HF_HUB_OFFLINE`` is set: :func:`lm_eval_harness.no_datasets_download_counts`.
17. wandb 0.31's ``wandb-core`` resolves its API host at shutdown when offline mode comes only from
    ``wandb.init(mode=...)``: :func:`tracking.wandb_offline_unless_configured` also sets ``WANDB_MODE``.
19. argparse's ``error`` prints the whole usage (some 240 lines of fields) before the line that matters:
    :func:`cli.argparse_errors_raise`.
"""
