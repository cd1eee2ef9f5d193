"""Where units are tokenized: in this process one after another, or as tasks of a Ray cluster, one CPU each.

The Ray cluster is the one ``--address`` names (the local pod's, a TPU pod's, a CPU cluster's: started as the
launcher starts them), or one this process starts on this machine with ``workers`` CPUs. A task whose worker dies
(``kill -9``, a preempted host) is run again by Ray, up to ``max_retries`` times; the unit it was tokenizing has no
done marker yet, so nothing of it counts. A unit whose source cannot be read stops the build: every other task is
cancelled and the error, naming the file, comes back to the driver as it was raised.
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from typing import Iterator, Optional, Sequence

from levanter_mars.pretokenize.units import Unit
from levanter_mars.pretokenize.worker import WORKER_ENVIRONMENT, TokenizeJob, UnitResult, tokenize_unit

logger = logging.getLogger(__name__)


class SerialExecutor:
    """Every unit in this process, in order: the reference a parallel build must equal."""

    workers = 1
    description = "this process (serial)"

    def run(self, units: Sequence[Unit], job: TokenizeJob, tick_s: float) -> Iterator[Optional[UnitResult]]:
        for name, value in WORKER_ENVIRONMENT.items():
            os.environ[name] = value
        for unit in units:
            yield tokenize_unit(unit, job)

    def close(self) -> None:
        pass


#: A Ray worker process's jobs, by key: the job (its tokenizer) is unpickled once per process, not once per unit.
_JOBS: dict[str, TokenizeJob] = {}


def tokenize_unit_on_worker(unit: Unit, key: str, boxed_job: list) -> UnitResult:
    """A Ray task: the job arrives as a reference inside a list, which Ray does not resolve, so it is fetched only the
    first time this worker process sees its key."""
    if key not in _JOBS:
        import ray

        _JOBS.clear()
        _JOBS[key] = ray.get(boxed_job[0])
    return tokenize_unit(unit, _JOBS[key])


class RayExecutor:
    """Units as Ray tasks of one CPU each, ``workers`` at a time, in plan order (a cluster's logical CPUs may be more
    than its cores: the local pod declares 8 per host)."""

    def __init__(self, address: Optional[str], workers: Optional[int], max_retries: int = 3):
        import ray

        self.ray = ray
        self.max_retries = max_retries
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        runtime_env = {"env_vars": dict(WORKER_ENVIRONMENT)}
        # ray.init installs its own SIGTERM handler, which aborts the process (exit 134) and leaves its daemons
        # behind: the data step's own (a stop, exit 130, Ray shut down on the way out) is put back.
        on_sigterm = signal.getsignal(signal.SIGTERM)
        if address and "://" in address:
            from levanter_mars.training.config import ConfigError

            raise ConfigError(f"--address {address}: a Ray cluster's GCS address (host:port, or auto on one of its "
                              "nodes), not a dashboard or job URL")  # fmt: skip
        if address:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False)
            self.workers = int(workers or ray.cluster_resources().get("CPU", 1))
            self.description = f"Ray cluster at {address}, {self.workers} worker(s)"
        else:
            self.workers = int(workers or os.cpu_count() or 1)
            # "local": a Ray of its own, whatever RAY_ADDRESS says (the local pod's variables name its dashboard)
            ray.init(address="local", num_cpus=self.workers, include_dashboard=False, runtime_env=runtime_env,
                     log_to_driver=False, object_store_memory=100 * 10**6)  # fmt: skip
            self.description = f"a local Ray of {self.workers} worker(s)"
        if on_sigterm is not None:
            signal.signal(signal.SIGTERM, on_sigterm)

    def run(self, units: Sequence[Unit], job: TokenizeJob, tick_s: float) -> Iterator[Optional[UnitResult]]:
        """Yields each unit's result as it finishes (any order), and None every ``tick_s`` seconds without one."""
        ray = self.ray
        task = ray.remote(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False)(tokenize_unit_on_worker)
        job_ref, key = ray.put(job), uuid.uuid4().hex
        queue = list(units)
        running: dict = {}
        try:
            while queue or running:
                while queue and len(running) < self.workers:
                    unit = queue.pop(0)
                    running[task.remote(unit, key, [job_ref])] = unit
                ready, _ = ray.wait(list(running), num_returns=1, timeout=tick_s)
                if not ready:
                    yield None
                    continue
                for ref in ready:
                    unit = running.pop(ref)
                    yield self._result(ref, unit)
        finally:
            for ref in running:
                ray.cancel(ref, force=True)

    def _result(self, ref, unit: Unit) -> UnitResult:
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from None
            raise RuntimeError(f"unit {unit.name} ({unit.file}): its task failed: {e}") from None
        except ray.exceptions.RayError as e:  # the worker died more often than Ray retries
            raise RuntimeError(f"unit {unit.name} ({unit.file}): its worker died {self.max_retries + 1} times: "
                               f"{type(e).__name__}: {e}") from None  # fmt: skip

    def close(self) -> None:
        self.ray.shutdown()


def executor(serial: bool, address: Optional[str], workers: Optional[int]):
    return SerialExecutor() if serial else RayExecutor(address, workers)
