"""The compat index's rows for every pinned dependency but Levanter: jax, Haliax, Ray, W&B, datasets, draccus,
Python."""

from __future__ import annotations

from levanter_mars.compat.defect import COMPAT_TESTS, Defect

DEFECTS: tuple[Defect, ...] = (
    Defect(
        16,
        "datasets==4.8.5",
        "every load of a packaged builder sends a HEAD request to s3.amazonaws.com unless HF_HUB_OFFLINE is set",
        "compat.lm_eval_harness.no_datasets_download_counts",
        COMPAT_TESTS + "test_lm_eval_harness.py::test_defect_16_datasets_reports_each_packaged_builder_load_to_s3",
    ),
    Defect(
        17,
        "wandb==0.31.0",
        "wandb-core reaches for its API host (api.forge.coreweave.com) at shutdown when offline mode comes only from"
        " wandb.init(mode=...)",
        "compat.tracking.wandb_offline_unless_configured",
        COMPAT_TESTS + "test_tracking_wandb_offline.py::test_defect_17_offline_by_init_alone_reaches_for_the_api_host",
    ),
    Defect(
        19,
        "python==3.11",
        "argparse's error prints the whole usage (240 lines of fields) before the line that matters",
        "compat.cli.argparse_errors_raise",
        COMPAT_TESTS + "test_cli.py::"
        "test_defect_19_argparse_prints_its_whole_usage_and_exits_and_the_workaround_raises",
    ),
    Defect(
        23,
        "ray==2.60.0",
        "ray start --address refuses to add a node while RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, the one setting that "
        "keeps every listener on 127.0.0.1",
        "compat.ray_local_nodes",
        "tests/test_infra_local_ray.py::test_defect_23_ray_start_refuses_to_add_a_node_whose_listeners_stay_on_loopback",
    ),
    Defect(
        24,
        "haliax==1.4.dev453",
        "haliax calls jax.core.is_constant_dim, which jax 0.11 removed (benchmarks' GPU image only)",
        "compat.newer_jax.restore_jax_names_haliax_uses",
        COMPAT_TESTS + "test_newer_jax.py::"
        "test_defect_24_haliax_calls_a_jax_name_newer_jax_removed_and_the_workaround_restores_it",
    ),
    Defect(
        26,
        "ray==2.60.0",
        "the job config reaches the driver through an environment variable named only privately",
        "compat.ray_jobs.RAY_JOB_CONFIG_JSON_ENV_VAR",
        COMPAT_TESTS + "test_ray_jobs.py::test_defect_26_ray_names_the_job_config_variable_only_privately",
    ),
    Defect(
        37,
        "jax==0.10.2",
        "persistent-cache hits and misses are logged at DEBUG only (WARNING only with flags that also log every "
        "compilation), and the compilation stages' monitoring events are named in a private module",
        "compat.jax_compilation",
        "tests/test_compilation_cache.py::"
        "test_defect_37_jax_reports_a_cache_hit_only_at_debug_and_the_workaround_logs_it",
    ),
    Defect(
        44,
        "draccus==0.11.6",
        "--help lists the config-file option of every nested dataclass field twice (--sample_logging of the eval "
        "harness; --data, --trainer, ... of training): registered twice, and the replaced one kept for the help",
        "compat.cli.help_lists_each_option_once",
        COMPAT_TESTS + "test_cli_help.py::test_defect_44_draccus_lists_a_nested_fields_config_option_twice",
    ),
    Defect(
        48,
        "jax==0.10.2",
        "with libtpu installed, jax loads it to look for a TPU on a machine whose PCI scan found none: libtpu's "
        "start-up noise (Failed to find host bounds, E0000 ... unexpected worker hostname) on every command's "
        "stderr, and /tmp/libtpu_lockfile taken",
        "compat.jax_tpu_probe.no_tpu_probe_without_a_tpu",
        COMPAT_TESTS + "test_jax_tpu_probe.py::"
        "test_defect_48_jax_loads_libtpu_on_a_machine_without_a_tpu_and_the_package_keeps_it_quiet",
    ),
    Defect(
        49,
        "ray==2.60.0",
        "every node links /tmp/tpu_logs (libtpu's logs of any process on the machine) into its session and forwards "
        "each file there to every job's driver log",
        "compat.ray_local_nodes.own_tpu_log_dir",
        COMPAT_TESTS + "test_ray_local_nodes.py::test_defect_49_ray_forwards_every_libtpu_log_on_the_machine_to_the_job",
    ),
    Defect(
        50,
        "jax==0.10.2",
        "every checkpoint save's written chunks stay in host memory (the writer's tensorstore context keeps a 10 GB "
        "chunk cache): RSS grows by about the state's size per save",
        "compat.tensorstore_writes.writes_keep_no_chunk_cache",
        COMPAT_TESTS + "test_tensorstore_writes.py::"
        "test_defect_50_each_save_stays_in_jax_writers_chunk_cache_and_the_workaround_keeps_none",
    ),
)
