"""A comparison from its spec to its runs' results: check every run's config, prepare what the runs share, run what is
missing (reading back what earlier invocations finished), and hand the results to the report."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from levanter_mars import versions
from levanter_mars.compare import execute
from levanter_mars.compare.tuning import EndedRun, Plan, RunKey, plan, point_label, run_id
from levanter_mars.compare.layout import Layout
from levanter_mars.compare.records import RunRecord, check_reusable, read_record, status_of, write_record
from levanter_mars.compare.results import RunResult, read_result
from levanter_mars.compare.run_configs import arm_optimizer, config_digest, run_config, write_config
from levanter_mars.training.yaml_sections import deep_merge
from levanter_mars.compare.spec import CompareConfig, SpecError, load_base


@dataclass(frozen=True)
class Budget:
    """What every run trains: read from a run's config as the training program parses it."""

    num_train_steps: int
    tokens_per_step: int
    steps_per_eval: int
    model: dict[str, Any]


@dataclass
class Comparison:
    spec: CompareConfig
    overrides: list[str]
    base: dict[str, Any]
    layout: Layout
    budget: Budget
    records: dict[RunKey, RunRecord] = field(default_factory=dict)
    results: dict[RunKey, RunResult] = field(default_factory=dict)
    failed_now: set[RunKey] = field(default_factory=set)
    """Runs that failed in this invocation: not started again until the next one (a crash may be deterministic)."""
    trained_now: list[str] = field(default_factory=list)
    checked: set[tuple[str, tuple]] = field(default_factory=set)
    """The (arm, point) pairs whose config has been checked: a point added past an edge is checked as it starts."""

    @property
    def remote(self) -> bool:
        return self.spec.tpu_type is not None and self.spec.tpu_type != "cpu"

    def outcomes(self) -> dict[RunKey, EndedRun]:
        return {key: record.outcome(self._final(key)) for key, record in self.records.items()}

    def _final(self, key: RunKey) -> Optional[float]:
        result = self.results.get(key)
        return result.curve.final if result is not None else None

    def plan(self) -> Plan:
        return plan(self.spec, self.outcomes())

    def config_of(self, key: RunKey) -> dict[str, Any]:
        return run_config(self.spec, self.base, self.layout, key)

    def arm_optimizer(self, arm: str) -> dict[str, Any]:
        """The arm's optimizer section before its grid point, as every run of it gets it."""
        return arm_optimizer(self.spec, deep_merge(self.base, self.spec.base_overrides).get("optimizer", {}), arm)


class RunLiveElsewhere(RuntimeError):
    """A run of the comparison is held by another launch (its lease): another comparison, or the runs of one that was
    killed. Exit 8, as the run's own."""


def open_comparison(spec: CompareConfig, overrides: Sequence[str]) -> Comparison:
    """Reads the base and every run's config, checks them with the training program's own validation, and reads back
    the runs earlier invocations finished. Raises :class:`SpecError` before anything runs."""
    base = load_base(spec.base)
    layout = Layout.of(spec, base)
    first = plan(spec, {})
    keys = {RunKey(k.arm, k.point, spec.seeds[0]) for k in first.runs}
    parsed = {key: _checked(spec, base, layout, key, overrides) for key in sorted(keys)}
    first_config = next(iter(parsed.values()))
    budget = _budget(first_config)
    # An override may move the checkpoints (a bucket on a pod): the runs' records are read from where they are.
    layout = dataclasses.replace(layout, checkpoint_base=first_config.trainer.checkpointer.base_path)
    comparison = Comparison(spec, list(overrides), base, layout, budget, checked={(k.arm, k.point) for k in keys})
    if comparison.remote:
        execute.shipped_path(layout.config_path(run_id(spec, first.runs[0])))  # refused now, not at the first launch
    _read_back(comparison)
    return comparison


def _checked(spec: CompareConfig, base, layout: Layout, key: RunKey, overrides: Sequence[str]):
    """The run's config as the training program parses it, checked field by field (no file, device or storage)."""
    from levanter_mars.program_config import parse_train_config
    from levanter_mars.training import validation
    from levanter_mars.training.config import ConfigError

    rid = run_id(spec, key)
    path = write_config(layout, rid, run_config(spec, base, layout, key))
    arm_index = [a.name for a in spec.arms].index(key.arm)
    where = f"arms[{arm_index}] ({key.arm}) at {point_label(key.point)}"
    try:
        config = parse_train_config(["--config_path", path, *overrides])
        validation.check_fields(config)
    except ConfigError as e:
        raise SpecError(f"{where}: the run's training config is bad ({path}): {e}") from e
    trainer = config.trainer
    if not isinstance(trainer.train_batch_size, int) or trainer.train_batch_size < 1:
        raise SpecError(f"{where}: trainer.train_batch_size must be one fixed batch size for a comparison of tokens")
    return config


def _budget(config) -> Budget:
    model = {k: getattr(config.model, k) for k in ("hidden_dim", "num_layers", "num_heads", "seq_len")
             if hasattr(config.model, k)}  # fmt: skip
    model["type"] = type(config.model).__name__
    return Budget(config.trainer.num_train_steps, config.trainer.train_batch_size * config.model.Pos.size,
                  config.trainer.steps_per_eval, model)  # fmt: skip


def prepare_shared(comparison: Comparison) -> None:
    """Local runs share the corpus and the token caches: built once here, before any run, so that parallel runs
    only read them; then the surroundings (data, mesh, storage) are checked once as the training program checks
    them. Runs on a slice are checked by the launcher, each."""
    if comparison.spec.tpu_type not in (None,):
        return
    from levanter_mars.program_config import parse_train_config
    from levanter_mars.training import validation
    from levanter_mars.training.config import ConfigError
    from levanter_mars.training.data import cache_check, pydocs_corpus
    from levanter_mars.training.data import sources as data

    key = comparison.plan().runs[0]
    path = comparison.layout.config_path(run_id(comparison.spec, key))
    config = parse_train_config(["--config_path", path, *comparison.overrides])
    try:
        if config.embedded_corpus:
            pydocs_corpus.prepare(config.embedded_corpus, config.embedded_corpus_sources)
        validation.validate(config)
        cache_check.check_and_prepare(config.data)
        data.build_local_caches(config.data)
    except ConfigError as e:
        raise SpecError(f"base ({comparison.spec.base}): {e}") from e


def _read_back(comparison: Comparison) -> None:
    """The runs of earlier invocations, as long as they trained what the spec asks of them now."""
    spec, layout = comparison.spec, comparison.layout
    records_dir = layout.path("records")
    if not os.path.isdir(records_dir):
        return
    arms = {a.name: a for a in spec.arms}
    for name in sorted(os.listdir(records_dir)):
        if not name.endswith(".json"):
            continue
        record = read_record(layout, name[: -len(".json")])
        arm = arms.get(record.arm) if record else None
        if arm is None or set(record.point) != set(arm.grid):
            continue  # an arm no longer in the spec, or tuned on other fields: not this comparison's run
        key = RunKey(record.arm, tuple((k, record.point[k]) for k in arm.grid), record.seed)
        if run_id(spec, key) != record.run_id:
            continue
        check_reusable(record, config_digest(comparison.config_of(key), comparison.overrides), layout)
        _take(comparison, key, record)


def _take(comparison: Comparison, key: RunKey, record: RunRecord) -> None:
    result = read_result(comparison.layout, record.run_id, comparison.budget.tokens_per_step, comparison.remote)
    if record.status == "ok" and (result is None or result.steps < comparison.budget.num_train_steps):
        record = RunRecord(**{**record.__dict__, "status": "failed"})  # its metrics are gone: train it again
    comparison.records[key] = record
    if result is not None:
        comparison.results[key] = result


def describe_plan(comparison: Comparison, plan: Plan) -> str:
    """The runs planned so far (the best points' seeds follow once tuning has ended), each with its command."""
    spec, layout = comparison.spec, comparison.layout
    lines = [f"{len(plan.runs)} run(s) planned so far, {len(plan.pending)} to train ({execute.where(spec)}):"]
    for key in plan.runs:
        rid = run_id(spec, key)
        state = comparison.records[key].status if key in comparison.records else "to train"
        command = execute.training_command(spec, layout.config_path(rid), comparison.overrides)
        lines.append(f"  {rid}: {state}\n    {' '.join(command)}")
    later = [a for a, arm_plan in plan.arms.items() if not arm_plan.tuned]
    if later:
        lines.append(f"then each arm's best point on seeds {[s for s in spec.seeds if s not in spec.tuning_seeds]} "
                     f"(arms still tuning: {', '.join(later)})")  # fmt: skip
    return "\n".join(lines)


def run_missing(comparison: Comparison, report: Callable[[str], None]) -> Plan:
    """Runs what the plan still needs until it needs nothing more (or only what failed here). Returns the plan."""
    spec = comparison.spec
    pool = execute.Pool(spec.parallel, spec.run_timeout, report)
    try:
        while True:
            current = comparison.plan()
            startable = [k for k in current.pending if k not in pool.running and k not in comparison.failed_now]
            while startable and not pool.full:
                _start(comparison, pool, startable.pop(0), report)
            if not pool.running:
                return current
            done = sum(1 for k in current.runs if k in comparison.records and comparison.records[k].status != "failed")
            for ended in pool.wait(done, len(current.runs)):
                _ended(comparison, ended, report)
    finally:
        pool.stop_all()


def _start(comparison: Comparison, pool: execute.Pool, key: RunKey, report: Callable[[str], None]) -> None:
    spec, layout = comparison.spec, comparison.layout
    rid = run_id(spec, key)
    config = comparison.config_of(key)
    path = write_config(layout, rid, config)
    if (key.arm, key.point) not in comparison.checked:
        _checked(spec, comparison.base, layout, key, comparison.overrides)
        comparison.checked.add((key.arm, key.point))
    command = execute.training_command(spec, path, comparison.overrides)
    metrics = None if comparison.remote else layout.metrics_path(rid)
    report(f"starting {rid} ({execute.where(spec)}); log: {layout.log_path(rid)}")
    pool.start(key, rid, command, layout.log_path(rid), metrics, comparison.budget.num_train_steps)


def _ended(comparison: Comparison, ended: execute.Ended, report: Callable[[str], None]) -> None:
    spec, layout, budget = comparison.spec, comparison.layout, comparison.budget
    result = read_result(layout, ended.run_id, budget.tokens_per_step, comparison.remote)
    status = status_of(ended.exit_code, result, budget.num_train_steps)
    if status == "live_elsewhere":  # no outcome of this comparison's: nothing is recorded
        raise RunLiveElsewhere(f"run {ended.run_id} is live elsewhere: another launch holds its lease (another "
                               f"comparison in {spec.output_dir}, or a run left by one that was killed); see "
                               f"{layout.log_path(ended.run_id)}")  # fmt: skip
    record = RunRecord(
        run_id=ended.run_id, arm=ended.key.arm, point=dict(ended.key.point), seed=ended.key.seed, status=status,
        exit_code=ended.exit_code, config_digest=config_digest(comparison.config_of(ended.key), comparison.overrides),
        seconds=ended.seconds, where=execute.where(spec), log=layout.log_path(ended.run_id),
        trained_by=versions.source_commit(),
    )  # fmt: skip
    write_record(layout, record)
    comparison.records[ended.key] = record
    if result is not None:
        comparison.results[ended.key] = result
    comparison.trained_now.append(ended.run_id)
    final = result.curve.final if result is not None else None
    report(f"{ended.run_id}: {status} (exit {ended.exit_code}, {ended.seconds:.0f} s"
           f"{f', final val loss {final:.4f}' if final is not None else ''})")  # fmt: skip
    if status == "config_error":
        raise SpecError(f"run {ended.run_id} refused its config (exit 2): see {record.log}")
    if status == "failed":
        comparison.failed_now.add(ended.key)
