"""Running the training CLI on the tiny config, as a user would, for end-to-end tests."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, Optional

import yaml

from levanter_mars.training.yaml_sections import deep_merge
from levanter_mars.training.data import pydocs_corpus
from levanter_mars.training.run.metrics import read_metrics
from tests.helpers import zygote
from tests.helpers.processes import REPO, _env, run_python  # noqa: F401 - run_python: the helpers' one import

TINY_CONFIG = REPO / "config" / "gpt2_tiny_mars.yaml"
#: How often a test looks at a running process (its metrics, its files). Faster polling steals CPU from the
#: trainers it watches (several can share 2 cores) and makes a test depend on catching a short window.
POLL_S = 0.5
#: The modes the session-wide reference runs cover (tests/conftest.py: reference_runs).
REFERENCE_MODES = {"approx": {}, "exact": {"optimizer": {"exact": True}}}


def tiny_config(
    workdir: Path, corpus: Path, run_id: str, overrides: Optional[dict] = None, base: Path = TINY_CONFIG
) -> Path:
    """Writes the tiny config with every path pointing into ``workdir``/``corpus``; returns its path."""
    config = yaml.safe_load(base.read_text())
    config = deep_merge(config, pydocs_corpus.config_section(corpus))
    config = deep_merge(
        config,
        {
            "trainer": {
                "id": run_id,
                "log_dir": str(workdir / "runs"),
                "checkpointer": {"base_path": str(workdir / "checkpoints")},
            },
        },
    )
    config = deep_merge(config, overrides or {})
    path = workdir / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_paths(workdir: Path, run_id: str) -> dict[str, Path]:
    return {
        "metrics": workdir / "runs" / run_id / "metrics.jsonl",
        "run_dir": workdir / "runs" / run_id,
        "checkpoints": workdir / "checkpoints" / run_id,
    }


def cli_arguments(config_path: Path, *extra: str, prelude: str = "") -> list[str]:
    """The training CLI's arguments to ``python``: ``prelude`` (fault injection) runs first, in the same process."""
    code = f"{prelude}\nimport sys\nfrom levanter_mars.main.train_lm import cli\nsys.exit(cli(sys.argv[1:]))"
    return ["-c", code, "--config_path", str(config_path), *extra]


def run_cli(
    config_path: Path, *extra: str, prelude: str = "", timeout: float = 600, env: Optional[dict[str, str]] = None,
    fresh_interpreter: bool = False,
) -> subprocess.CompletedProcess:
    """Runs the training CLI to completion in a process of its own, forked from the test zygote (or, with
    ``fresh_interpreter``, started as a user starts it). ``prelude`` is Python run first (fault injection in tests);
    ``env`` adds environment variables (e.g. simulated devices)."""
    return zygote.run(cli_arguments(config_path, *extra, prelude=prelude), cwd=REPO, env=_env(env), timeout=timeout,
                      fork=not fresh_interpreter)


def start_cli(
    config_path: Path, *extra: str, prelude: str = "", log_path: Optional[Path] = None,
    env: Optional[dict[str, str]] = None,
) -> subprocess.Popen:
    arguments = cli_arguments(config_path, *extra, prelude=prelude)
    if log_path is None:
        return zygote.popen(arguments, cwd=REPO, env=_env(env), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    with open(log_path, "w") as log:
        return zygote.popen(arguments, cwd=REPO, env=_env(env), stdout=log, stderr=subprocess.STDOUT)


def last_step(metrics_path: Path) -> int:
    records = read_metrics(metrics_path)
    return max((r["step"] for r in records), default=-1)


def losses(metrics_path: Path, key: str = "train/loss") -> dict[int, Any]:
    return {r["step"]: r[key] for r in read_metrics(metrics_path) if key in r}


def run_cli_in_process(capsys, config_path: Path, *extra: str) -> tuple[int, str]:
    """Runs the training CLI in the test process (no interpreter start-up): for runs that stop before training.
    Returns the exit code and everything printed."""
    from levanter_mars.main.train_lm import cli

    try:
        code = cli(["--config_path", str(config_path), *extra])
    except SystemExit as e:  # argparse rejects unknown flags itself
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def describe_failure(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


def output(proc: subprocess.CompletedProcess) -> str:
    """Everything a run printed (Levanter sends its log to stdout and stderr)."""
    return proc.stdout + proc.stderr


def rerun_matches_reference(config, paths, reference_runs, mode="approx", resumed_from=None, unverified=()):
    """Reruns ``config`` to the end and checks its losses are bitwise the uninterrupted reference run's (and, with
    ``resumed_from``, that it resumed from that step), and that every checkpoint left verifies."""
    from levanter_mars.training.checkpointing.audit import audit_run

    rerun = run_cli(config)
    assert rerun.returncode == 0, describe_failure(rerun)
    if resumed_from is not None:
        assert f"step-{resumed_from}" in output(rerun) and "Resuming from" in output(rerun), output(rerun)[-3000:]
    got, reference = losses(paths["metrics"]), losses(reference_runs[mode][2]["metrics"])
    assert sorted(got) == list(range(30))
    assert got == reference, {s: (got[s], reference[s]) for s in reference if got.get(s) != reference[s]}
    for status in audit_run(str(paths["checkpoints"])):
        expected = "unverified" if status.step in unverified else "verified"
        assert status.state == expected, status
    return rerun


def process_record(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    """What a finished run's ``CompletedProcess`` holds, as JSON (tests/helpers/shared.py)."""
    return {"args": [str(a) for a in proc.args], "returncode": proc.returncode, "stdout": proc.stdout,
            "stderr": proc.stderr}


def finished_process(record: dict[str, Any]) -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess(**record)
