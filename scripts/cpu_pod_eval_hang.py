"""How often simulated XLA:CPU pods hang in their loss evaluation, with and without the persistent compilation cache.

Starts ``--pods`` local pods at once (2 processes x 2 simulated CPU devices each, joined by jax.distributed over gloo,
as the tests run them), ``--rounds`` times. Each trains the tiny config for 30 steps and evaluates the loss after
every step (8 batches), so a run dispatches about 240 evaluation programs. A pod whose logs all stay still for
``--silence`` seconds while its processes run is hung: its threads' stacks are saved (py-spy and gdb, where
installed) and it is killed. By default each host compiles every program (a pod of XLA:CPU hosts turns the cache off:
``training.compilation_cache.loads_can_deadlock``); ``--cache`` turns that off in the children, so each pod uses its
own cache beside its checkpoints (process 0 stores, every host loads what is there). Prints each round and writes one
JSON record (versions, command, counts) to ``--out``/record.json.

    python scripts/cpu_pod_eval_hang.py --pods 4 --rounds 3 --cache --out /tmp/hang-cache
    python scripts/cpu_pod_eval_hang.py --pods 4 --rounds 4 --out /tmp/hang-compiled
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "src"))

#: Run in each pod process before the entry point: the persistent cache as on a single host.
CACHE_ON = "import levanter_mars.training.compilation_cache as c\nc.loads_can_deadlock = lambda: False\n"
EVERY_STEP = {"trainer": {"steps_per_eval": 1, "max_eval_batches": 8}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=4, help="pods at once (each 2 processes)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--cache", action="store_true", help="load and store programs in a per-pod cache")
    parser.add_argument("--silence", type=float, default=90.0, help="seconds without log output that make a hang")
    parser.add_argument("--out", type=Path, required=True, help="a directory for the pods' files and the record")
    args = parser.parse_args(argv)

    # The pods compile at XLA's defaults, as the recorded hang rates were measured (tests/helpers/xla_flags.py).
    os.environ.setdefault("LEVANTER_MARS_TEST_XLA_DEFAULTS", "1")
    from levanter_mars.bench.report import host_description
    from tests.helpers.pod import start_pod
    from tests.helpers.training import tiny_config

    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # with --cache, each pod's own cache beside its checkpoints
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = []
    for r in range(args.rounds):
        started = time.time()
        pods = []
        for k in range(args.pods):
            workdir = args.out / f"round-{r}" / f"pod-{k}"
            workdir.mkdir(parents=True, exist_ok=True)
            # A corpus per pod: pods that start together would build one token cache at once and fail.
            config = tiny_config(workdir, workdir / "corpus", f"pod-{r}-{k}", EVERY_STEP)
            pods.append((workdir, start_pod(config, log_dir=workdir / "logs", name=f"pod-{k}",
                                            prelude=CACHE_ON if args.cache else "")))
        hung = _watch(pods, args.silence)
        codes = [[proc.poll() for proc in pod.procs] for _, pod in pods]
        rounds.append({"exit_codes": codes, "hung": hung, "wall_s": round(time.time() - started, 1)})
        print(f"round {r}: {rounds[-1]['wall_s']:.0f} s, exit codes {codes}, hung: {hung or 'none'}", flush=True)
    hung = sum(len(r["hung"]) for r in rounds)
    record = {
        "what": "simulated 2-process XLA:CPU pods (gloo) evaluating the loss after every step: hangs per pod",
        "command": "python " + " ".join([Path(__file__).relative_to(REPO).as_posix(), *(argv or sys.argv[1:])]),
        "cache": args.cache, "pods": args.pods * args.rounds,
        "hung": hung, "failed": sum(1 for r in rounds for codes in r["exit_codes"] if codes != [0, 0]) - hung,
        "rounds": rounds, "jax": version("jax"), "jaxlib": version("jaxlib"), **host_description(),
    }
    (args.out / "record.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({key: record[key] for key in ("cache", "pods", "hung", "failed", "jax")}))
    return 0


def _watch(pods, silence_s: float) -> list[int]:
    """Waits for every pod; returns the indices of those that hung (stacks saved, processes killed)."""
    sizes: dict[int, list[int]] = {}
    grew_at: dict[int, float] = {}
    hung = []
    while any(proc.poll() is None for _, pod in pods for proc in pod.procs):
        time.sleep(2)
        for i, (workdir, pod) in enumerate(pods):
            if i in hung or all(proc.poll() is not None for proc in pod.procs):
                continue
            now = pod.log_sizes()
            if sizes.get(i) != now:
                sizes[i], grew_at[i] = now, time.time()
            elif time.time() - grew_at[i] > silence_s:
                hung.append(i)
                for j, proc in enumerate(pod.procs):
                    _save_stacks(proc.pid, workdir / f"stacks-process-{j}.txt")
                pod.kill()
    return hung


def _save_stacks(pid: int, path: Path) -> None:
    tools = [["py-spy", "dump", "--pid", str(pid)], ["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 30"]]
    parts = []
    for command in tools:
        if shutil.which(command[0]):
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            parts.append(f"$ {' '.join(command)}\n{done.stdout}{done.stderr}")
    path.write_text("\n".join(parts) or "no py-spy or gdb on PATH\n")


if __name__ == "__main__":
    raise SystemExit(main())
