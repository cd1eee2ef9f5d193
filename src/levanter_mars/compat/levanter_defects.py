"""The compat index's rows for the pinned Levanter (read them when the pin moves)."""

from __future__ import annotations

from levanter_mars.compat.defect import COMPAT_TESTS, LEVANTER, Defect

DEFECTS: tuple[Defect, ...] = (
    Defect(
        1,
        LEVANTER,
        "LambdaCallback.on_step(info, force) drops force: the end-of-training checkpoint is never written",
        "compat.levanter_training.forward_force_to_checkpointer",
        COMPAT_TESTS + "test_levanter_training.py::test_defect_1_lambda_callback_drops_force",
    ),
    Defect(
        2,
        LEVANTER,
        "Trainer._train_step's obj_fun unpacks (loss, metrics) from a loss that returns one value, is not "
        "microbatched, and take_train_step passes loss= along; our copy of _train_step fails on any upstream change "
        "(COPIED_TRAIN_STEP_SHA256)",
        "compat.levanter_training.FixedTrainer",
        COMPAT_TESTS + "test_levanter_training.py::test_defect_2_obj_fun_unpacks_a_pair_the_loss_does_not_return",
    ),
    Defect(
        3,
        LEVANTER,
        "Gpt2Config.hf_checkpoint_converter hard-codes reference_checkpoint='gpt2' and contacts the HF hub",
        "compat.levanter_models.hf_converter",
        COMPAT_TESTS + "test_levanter_models.py::"
        "test_defect_3_gpt2_converter_needs_the_hub_and_the_workaround_does_not",
    ),
    Defect(
        5,
        LEVANTER,
        "training ends quietly when the data runs out before num_train_steps",
        "training.trainer.MarsTrainer.train",
        COMPAT_TESTS + "test_levanter_training.py::test_defect_5_upstream_train_returns_quietly_when_data_runs_out",
    ),
    Defect(
        6,
        LEVANTER,
        "chex and GitPython are imported but not declared",
        "pyproject.toml",
        COMPAT_TESTS + "test_levanter_dependencies.py::test_defect_6_chex_and_gitpython_are_undeclared_but_imported",
    ),
    Defect(
        7,
        LEVANTER,
        "the LM loss passes a float where= mask: a deprecation warning on jax 0.7, an error from jax 0.8",
        "compat.levanter_loss.boolean_loss_masks",
        COMPAT_TESTS + "test_levanter_loss.py::"
        "test_defect_7_levanter_loss_passes_a_float_where_mask_and_the_workaround_casts_it",
    ),
    Defect(
        8,
        LEVANTER,
        "Levanter's own mars calls jax.tree_map, removed from jax (we register mars-* names instead)",
        "compat.levanter_optimizers.jax_tree_map_restored",
        COMPAT_TESTS + "test_levanter_optimizers.py::test_defect_8_levanter_mars_calls_removed_jax_tree_map",
    ),
    Defect(
        9,
        LEVANTER,
        "the default tracker (wandb, online) fails without an API key",
        "compat.tracking.wandb_offline_unless_configured",
        COMPAT_TESTS + "test_tracking.py::test_defect_9_default_tracker_is_online_wandb_and_ours_is_offline",
    ),
    Defect(
        10,
        LEVANTER,
        "DataLoaderIterator prefetches on a thread it offers no public way to stop; a process exiting while it reads "
        "aborts (exit 134)",
        "compat.levanter_training.stop_data_loader",
        COMPAT_TESTS + "test_levanter_training.py::test_defect_10_data_loader_prefetch_thread_has_no_public_stop",
    ),
    Defect(
        11,
        LEVANTER,
        "LmEvalHarnessConfig.to_task_dict builds TaskManager() without include_path: a local task YAML cannot be "
        "evaluated",
        "compat.lm_eval_harness.lm_eval_task_manager",
        COMPAT_TESTS + "test_lm_eval_harness.py::test_defect_11_levanter_cannot_load_a_local_task_yaml",
    ),
    Defect(
        12,
        LEVANTER,
        "train_lm.main forces the final hooks twice and the harness hook logs with step=None; our hook reaches "
        "Levanter's private evaluation",
        "compat.lm_eval_harness.run_eval_harness",
        COMPAT_TESTS + "test_lm_eval_harness.py::"
        "test_defect_12_final_hooks_are_forced_twice_and_the_harness_hook_logs_without_a_step",
    ),
    Defect(
        13,
        LEVANTER,
        "the eval harness fails on a mesh of more than one device (incompatible devices)",
        "compat.lm_eval_harness.eval_harness_on_mesh",
        COMPAT_TESTS + "test_lm_eval_harness.py::"
        "test_defect_13_eval_harness_fails_on_a_multi_device_mesh_and_the_workaround_places_the_batch",
    ),
    Defect(
        14,
        LEVANTER,
        "get_current_tpu_is_preempted asks the GCE metadata server without a timeout",
        "compat.levanter_infra.preemption_probe_off_gce",
        COMPAT_TESTS + "test_levanter_infra.py::test_defect_14_preemption_probe_needs_the_gce_metadata_server",
    ),
    Defect(
        15,
        LEVANTER,
        "Checkpointer deletes a superseded temporary checkpoint at join(base_path, path), path already starting with "
        "base_path: with a relative base path every temporary checkpoint stays",
        "compat.levanter_training.checkpointer_base_path",
        COMPAT_TESTS + "test_levanter_training_checkpoints.py::"
        "test_defect_15_a_relative_base_path_keeps_every_temporary_checkpoint",
    ),
    Defect(
        18,
        LEVANTER,
        "DistributedConfig.initialize gives jax.distributed a 100 s heartbeat and no way to change it",
        "compat.jax_distributed.start",
        COMPAT_TESTS + "test_jax_distributed.py::"
        "test_defect_18_levanter_starts_jax_distributed_with_the_default_heartbeat",
    ),
    Defect(
        20,
        LEVANTER,
        "the eval harness packs requests without restarting their positions, splits context and continuation "
        "otherwise than lm-eval, and truncates one token shorter than lm-eval's hf backend",
        "compat.lm_eval_scoring.score_as_lm_eval",
        COMPAT_TESTS + "test_lm_eval_scoring.py::"
        "test_defect_20_levanter_scores_a_packed_request_at_the_positions_of_the_pack",
    ),
    Defect(
        22,
        LEVANTER,
        "on several processes the harness's broadcast_shard fails under jax.set_mesh (inputs come out replicated over"
        " a not fully addressable mesh)",
        "compat.lm_eval_harness.broadcasts_across_processes",
        COMPAT_TESTS + "test_lm_eval_harness.py::test_defect_22_eval_broadcasts_fail_across_processes_under_set_mesh"
        "_and_the_workaround_delivers_them",
    ),
    Defect(
        25,
        LEVANTER,
        "Levanter's package __init__ fails to import on jax 0.11, though its model code works (benchmarks' GPU image "
        "only)",
        "compat.newer_jax.levanter_importable",
        COMPAT_TESTS + "test_newer_jax.py::"
        "test_defect_25_levanter_models_load_when_the_levanter_package_cannot_be_imported",
    ),
    Defect(
        27,
        LEVANTER,
        "a task that fails to load is not named in Levanter's error (lm-eval pops its name first)",
        "compat.lm_eval_harness.TaskErrorsNamed",
        COMPAT_TESTS + "test_lm_eval_harness.py::"
        "test_defect_27_a_task_that_fails_to_load_is_not_named_and_the_workaround_names_it",
    ),
    Defect(
        28,
        LEVANTER,
        "TrainerConfig.initialize passes f'{id}.log' to init_logging, which appends .log again: <run id>.log.log",
        "compat.levanter_logging.log_file_named_by_run_id",
        COMPAT_TESTS + "test_levanter_logging.py::test_defect_28_levanter_names_its_log_file_run_id_dot_log_dot_log",
    ),
    Defect(
        29,
        LEVANTER,
        "WandbConfig.init hard-codes mode='offline' on every process but 0, so each host of a pod writes a whole "
        "W&B run",
        "compat.tracking.only_process_zero_tracks",
        COMPAT_TESTS + "test_tracking.py::test_defect_29_levanter_gives_every_other_process_an_offline_wandb_run",
    ),
    Defect(
        30,
        LEVANTER,
        "the eval harness logs the whole traceback of a task that fails to load, then raises it anyway",
        "compat.lm_eval_harness.task_load_failures_unlogged",
        COMPAT_TESTS + "test_lm_eval_harness.py::"
        "test_defect_30_levanter_logs_the_traceback_of_a_task_that_fails_to_load",
    ),
    Defect(
        31,
        LEVANTER,
        "Gpt2Config.to_hf_config omits resid_pdrop and the MLP width: an HF export's config.json says transformers' "
        "defaults (dropout 0.1)",
        "compat.levanter_models.gpt2_hf_fields_levanter_omits",
        COMPAT_TESTS + "test_levanter_models.py::"
        "test_defect_31_levanters_gpt2_hf_config_omits_resid_pdrop_and_the_mlp_width",
    ),
    Defect(
        32,
        LEVANTER,
        "Trainer keeps its jitted train step private (_jit_train_step_fn), and the eval loss's running state "
        "(levanter.eval._EvalRunningMeans, built only inside TaggedEvaluator.evaluate); pre-flight lowers those very "
        "programs for a TPU topology (the state's half: compat.levanter_training.eval_loss_running_state)",
        "compat.levanter_training.jitted_train_step",
        COMPAT_TESTS + "test_levanter_training.py::test_defect_32_the_jitted_train_step_has_no_public_handle",
    ),
    Defect(
        33,
        LEVANTER,
        "every other family's hf_checkpoint_converter (Llama, Mistral, Qwen, Gemma, OLMo 2, Mixtral) loads its "
        "reference checkpoint's tokenizer and config from the hub as it is built (meta-llama/Llama-2-7b-hf: 51 s of "
        "retries, then OSError)",
        "compat.levanter_models.offline_family_converter",
        COMPAT_TESTS + "test_levanter_models.py::"
        "test_defect_33_family_converters_need_the_hub_and_the_workaround_does_not",
    ),
    Defect(
        34,
        LEVANTER,
        "Mixtral's transformer calls levanter.tracker.jit_log inside the loss, an io_callback with no JVP rule (IO "
        "callbacks do not support JVP)",
        "compat.levanter_models.differentiable_loss",
        COMPAT_TESTS + "test_levanter_models.py::"
        "test_defect_34_mixtral_loss_cannot_be_differentiated_and_the_workaround_can",
    ),
    Defect(
        35,
        LEVANTER,
        "the data loader stacks each batch under a one-CPU mesh made by jax.make_mesh without axis_types (Explicit "
        "axes from jax 0.9): stacking elements that carry the trainer's Auto mesh fails (mesh mismatch; on several "
        "devices, incompatible devices; on a pod, elements no host can address), which on jax 0.10 every batch does",
        "compat.levanter_data_mesh.auto_axes_data_mesh",
        COMPAT_TESTS + "test_levanter_data_mesh.py::"
        "test_defect_35_the_loader_mesh_has_explicit_axes_and_the_workaround_stacks",
    ),
    Defect(
        36,
        LEVANTER,
        "a checkpoint that does not store some paths of the state raises the same FileNotFoundError as a missing "
        "checkpoint or a storage failure, told apart only by its message ('Missing paths: [...]')",
        "compat.levanter_training.missing_checkpoint_paths",
        COMPAT_TESTS + "test_levanter_training_checkpoints.py::"
        "test_defect_36_levanter_tells_missing_paths_from_a_missing_checkpoint_only_by_the_message",
    ),
    Defect(
        39,
        LEVANTER,
        "when lm-eval fails on process 0 the eval harness never sends its other processes STOP (a pod hangs), and "
        "lm-eval does not say which task failed",
        "compat.lm_eval_harness.workers_released_on_failure",
        COMPAT_TESTS + "test_lm_eval_harness.py::"
        "test_defect_39_a_failure_in_lm_eval_never_releases_the_harness_workers_and_the_workaround_does",
    ),
    Defect(
        40,
        LEVANTER,
        "a superseded temporary checkpoint is deleted with one recursive delete in listing order: cut short, it can "
        "leave metadata.json beside part of the arrays, a checkpoint that looks whole and reads deleted chunks as zeros",
        "compat.levanter_training.RemovesItsMarkersFirst",
        COMPAT_TESTS + "test_levanter_training_checkpoints.py::"
        "test_defect_40_levanter_deletes_a_checkpoint_in_one_recursive_delete_and_the_workaround_unmarks_it",
    ),
    Defect(
        41,
        LEVANTER,
        "a fresh TrainerState's step is weakly typed, a loaded one strongly: the jit hooks' `step % every` traces to "
        "another program, so a resumed attempt compiles a training step its first attempt had stored",
        "compat.levanter_training.strongly_typed_step",
        COMPAT_TESTS + "test_levanter_training_checkpoints.py::"
        "test_defect_41_a_fresh_trainer_states_step_is_weakly_typed_a_loaded_one_not_and_the_workaround_"
        "aligns_them",
    ),
    Defect(
        42,
        LEVANTER,
        "slices are counted only from device.slice_index, which CPU devices lack (or hold as 0 in a pod): the "
        "launcher's MEGASCALE_NUM_SLICES is ignored, and a multi-slice local pod trains as one slice, its DCN axes "
        "dropped or refused",
        "compat.levanter_slices.create_fsdp_mesh",
        COMPAT_TESTS + "test_levanter_slices.py::test_defect_42_levanter_counts_no_slices_of_cpu_processes_and_the_"
        "workaround_does",
    ),
    Defect(
        43,
        LEVANTER,
        "restoring a state warns `Unknown leaf type <class 'NoneType'>` for each of its None leaves (16 per resume), "
        "which it then skips, as it should",
        "compat.levanter_logging.none_leaf_warnings_dropped",
        COMPAT_TESTS + "test_levanter_logging_restores.py::"
        "test_defect_43_levanter_warns_of_every_none_leaf_it_restores",
    ),
    Defect(45, LEVANTER, "run_on_pod with a list of slice counts waits up to a week for the largest count, scales up "
           "only after 12 h by killing the run between checkpoints, tells a preemption past its budget only by "
           "message, and counts a slice lost with its hosts (OwnerDiedError) as a failure",
           "compat.levanter_infra.run_on_slices",
           COMPAT_TESTS + "test_levanter_infra.py::"
           "test_defect_45_run_on_pod_waits_a_week_for_missing_slices_and_scales_up_only_after_12_hours"),
    Defect(46, LEVANTER, "multihost_broadcast_sync returns on the source before its peers read the value: a process 0 "
           "that then stops takes the coordination service with it, and its peers crash reading the decision",
           "training.distributed.exit_now", COMPAT_TESTS + "test_levanter_distributed.py::"
           "test_defect_46_a_peer_cannot_read_a_decision_once_process_0_has_stopped_and_the_workaround_waits"),
    Defect(47, LEVANTER, "build_caches opens every source (datasets.load_dataset: the hub) before it looks for its "
           "finished cache: each training start contacts the hub, and cannot start while it is unreachable",
           "training.data.cached_first.finished_caches_first", COMPAT_TESTS + "test_levanter_data_sources.py::"
           "test_defect_47_levanter_opens_the_hub_for_a_finished_cache_and_the_workaround_does_not"),
)
