"""Defect 49 (``levanter_mars.compat.ray_local_nodes.own_tpu_log_dir``): a Ray node forwards every libtpu log file on
the machine to its jobs' drivers. (Defect 23, of the same module: tests/test_infra_local_ray.py, with a cluster.)"""

import inspect
import os

from levanter_mars.compat.ray_local_nodes import TPU_LOG_DIR, own_tpu_log_dir


def test_defect_49_ray_forwards_every_libtpu_log_on_the_machine_to_the_job(tmp_path):
    import ray._private.node
    from ray._private.log_monitor import LogMonitor

    # A node links $TPU_LOG_DIR (if it is a directory) or /tmp/tpu_logs into its session's logs ...
    source = inspect.getsource(ray._private.node.Node)
    assert '"/tmp/tpu_logs"' in source and f'"{TPU_LOG_DIR}" in os.environ' in source
    # ... and its log monitor tracks every file under that link: another process's libtpu log goes to the driver.
    machine_wide = tmp_path / "tmp-tpu_logs"
    machine_wide.mkdir()
    (machine_wide / "tpu_driver.vm.root.log.INFO.1").write_text("I1207 another user's libtpu\n")
    logs = tmp_path / "session" / "logs"
    logs.mkdir(parents=True)
    os.symlink(machine_wide, logs / "tpu_logs")
    monitor = LogMonitor("127.0.0.1", str(logs), None, lambda pid: True)
    monitor.update_log_filenames()
    assert monitor.log_filenames == {str(logs / "tpu_logs" / "tpu_driver.vm.root.log.INFO.1")}
    # The workaround: the local engine's nodes link their cluster's own directory, which nothing writes to.
    env = own_tpu_log_dir(str(tmp_path / "lm-ray-x"))
    assert os.path.isdir(env[TPU_LOG_DIR]) and not os.listdir(env[TPU_LOG_DIR])
    assert env[TPU_LOG_DIR].startswith(str(tmp_path / "lm-ray-x"))
