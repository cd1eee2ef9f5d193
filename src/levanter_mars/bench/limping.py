"""A run that limps, end to end on this machine: the scenario behind docs/benchmarks/limping_tiny.json
(``scripts/limping_record.py``) and tests/test_infra_local_limping.py.

The launcher's local engine trains the tiny config on 2 slices x 1 host x 2 devices with ``--num_slices 2,1``. Once
step ``preempt_after`` is logged, slice 1 is preempted (``local_cluster preempt``: its Ray node and training process
go away); the launch restarts on the one slice left, from the newest checkpoint, with the same global batch in two
microbatches. Once that attempt has trained a few steps the slice is restored (``local_cluster restore``); the
driver asks the run to stop at its next checkpoint and the last attempt finishes on 2 slices again. Then, as an
independent reference for the steps the run took on one slice, a plain one-process run of 2 devices resumes from
the checkpoint the 1-slice attempt started from and trains the same steps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from levanter_mars.training.run.metrics import read_metrics

POLL_S = 0.5
DCN_REPLICAS = ("--trainer.replica_dcn_axis_size", "-1")


@dataclass
class LimpedRun:
    workdir: Path
    run_id: str
    config: Path
    returncode: int
    log: str
    wall_seconds: float
    repo: Optional[Path] = None
    """The working directory of the launch (relative paths of the config)."""
    steps: int = 0

    @property
    def run_dir(self) -> Path:
        return self.workdir / "runs" / self.run_id

    @property
    def checkpoints(self) -> Path:
        return self.workdir / "ckpt" / self.run_id

    def goodput(self) -> dict:
        return json.loads((self.run_dir / "goodput.json").read_text())

    def losses(self) -> list[tuple[int, float]]:
        """Every logged (step, training loss), in the order of metrics.jsonl."""
        rows = read_metrics(self.run_dir / "metrics.jsonl")
        return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


def _run_overrides(workdir: Path, run_id: str, steps: int) -> list[str]:
    return ["--trainer.id", run_id, "--trainer.log_dir", str(workdir / "runs"), "--trainer.checkpointer.base_path",
            str(workdir / "ckpt"), "--trainer.num_train_steps", str(steps)]  # fmt: skip


def _wait_for(what: str, ready, proc: subprocess.Popen, log: Path, timeout: float):
    deadline = time.monotonic() + timeout
    while (value := ready()) is None:
        if proc.poll() is not None:
            raise RuntimeError(f"the launch ended ({proc.returncode}) while waiting for {what}:\n"
                               f"{log.read_text()[-6000:]}")  # fmt: skip
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s:\n{log.read_text()[-6000:]}")
        time.sleep(POLL_S)
    return value


def _local_cluster(*args: str, env: dict) -> None:
    done = subprocess.run([sys.executable, "-m", "levanter_mars.infra.local_cluster", *args], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"local_cluster {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")


def limp(workdir: Path, config: Path, run_id: str = "limping", steps: int = 400, preempt_after: int = 12,
         steps_on_one_slice: int = 5, timeout: float = 1200, repo: Optional[Path] = None) -> LimpedRun:  # fmt: skip
    """Runs the scenario of the module docstring; returns the launch's outcome (it does not judge it)."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "levanter_mars.infra.launch", "--config_path", str(config), "--tpu_type", "cpu",
               "--num_slices", "2,1", "--num_hosts", "1", "--devices_per_host", "2", "--scale_up_wait_s", "0",
               "--retries", "0", "--", *DCN_REPLICAS, *_run_overrides(workdir, run_id, steps)]  # fmt: skip
    log_path = workdir / f"{run_id}.launch.log"
    run = LimpedRun(workdir, run_id, config, -1, "", 0.0, repo, steps)
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        temp_dir = _wait_for("the private cluster", lambda: _cluster_dir(log_path), proc, log_path, timeout)
        _wait_for(f"step {preempt_after}", lambda: _logged_step(run, preempt_after), proc, log_path, timeout)
        _local_cluster("preempt", "--temp_dir", temp_dir, "--slice", "1", env=env)
        _wait_for(f"{steps_on_one_slice} steps on one slice", lambda: _on_one_slice(run, steps_on_one_slice), proc,
                  log_path, timeout)  # fmt: skip
        _local_cluster("restore", "--temp_dir", temp_dir, "--slice", "1", env=env)
        run.returncode = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    run.wall_seconds = time.monotonic() - started
    run.log = log_path.read_text()
    return run


def _cluster_dir(log: Path) -> Optional[str]:
    found = re.search(r"starting a private Ray cluster .* in (\S+)", log.read_text())
    return found.group(1) if found else None


def _logged_step(run: LimpedRun, step: int) -> Optional[int]:
    metrics = run.run_dir / "metrics.jsonl"
    if not metrics.exists():
        return None
    steps = [r["step"] for r in read_metrics(metrics) if "train/loss" in r]
    return max(steps) if steps and max(steps) >= step else None


def _on_one_slice(run: LimpedRun, steps: int) -> Optional[dict]:
    try:
        attempts = run.goodput()["attempts"]
    except (OSError, ValueError, KeyError):
        return None
    limping = [a for a in attempts if a.get("slices") == 1 and a.get("first_step") is not None]
    if limping and (limping[-1].get("last_step") or 0) >= limping[-1]["first_step"] + steps:
        return limping[-1]
    return None


def _pinned(config: Path) -> tuple[str, ...]:
    """The examples per device and microbatch the launcher pinned for 2 slices x 2 devices (infra/limping.py)."""
    from levanter_mars.infra.limping import pinned_microbatch
    from levanter_mars.program_config import parse_train_config

    trainer = parse_train_config(["--config_path", str(config), *DCN_REPLICAS]).trainer
    return pinned_microbatch(trainer, 2, (2, 1))


def one_slice_reference(run: LimpedRun, resumed_from: int, last_step: int, timeout: float = 900) -> dict[int, float]:
    """A plain one-process run of 2 devices resumed from the limped run's checkpoint ``step-{resumed_from}`` with the
    same config (its learning-rate schedule spans the run's steps), stopped once it has logged ``last_step``: its
    training loss of each step after the checkpoint."""
    workdir = run.workdir / "reference"
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(run.checkpoints / f"step-{resumed_from}", workdir / "ckpt" / run.run_id / f"step-{resumed_from}")
    from levanter_mars.infra.host import with_device_count

    # The launcher's host keeps the other XLA flags of its environment (tests': a cheaper codegen): so does this run.
    env = {**os.environ, "XLA_FLAGS": with_device_count(os.environ.get("XLA_FLAGS", ""), 2), "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-m", "levanter_mars.main.train_lm", "--config_path", str(run.config), *DCN_REPLICAS,
               *_pinned(run.config), *_run_overrides(workdir, run.run_id, run.steps)]  # fmt: skip
    log_path = workdir / "reference.log"
    reference = LimpedRun(workdir, run.run_id, run.config, -1, "", 0.0, run.repo, run.steps)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=run.repo, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for(f"step {last_step}", lambda: _logged_step(reference, last_step), proc, log_path, timeout)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return {step: loss for step, loss in reference.losses() if resumed_from < step <= last_step}
