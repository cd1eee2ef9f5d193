"""What a finished run reports: its metrics file, losses, checkpoints, loss curve, and where its time went (its
goodput record and timeline). Process 0 only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from levanter_mars.training.config import TrainLmConfig
from levanter_mars.training.run.goodput import GOODPUT_FILENAME, read_record
from levanter_mars.training.run.goodput.report import describe, plot_goodput
from levanter_mars.training.run.identity import checkpoint_dir, run_dir
from levanter_mars.training.run.metrics import METRICS_FILENAME, read_metrics
from levanter_mars.training.run.plots import plot_loss_curves


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    run_dir: str
    checkpoint_dir: str
    metrics_file: str
    steps_completed: int
    final_train_loss: Optional[float]
    first_eval_loss: Optional[float]
    final_eval_loss: Optional[float]
    loss_curve: Optional[str]
    goodput: Optional[dict] = None
    """The goodput record (``goodput.json``), if the run kept one."""
    goodput_plot: Optional[str] = None

    def describe(self) -> str:
        lines = [f"Run {self.run_id}: {self.steps_completed} steps done."]
        if self.final_train_loss is not None:
            lines.append(f"  final train loss: {self.final_train_loss:.4f}")
        if self.final_eval_loss is not None:
            lines.append(f"  eval loss: {self.first_eval_loss:.4f} (first) -> {self.final_eval_loss:.4f} (last)")
        lines.append(f"  metrics:     {self.metrics_file}")
        lines.append(f"  checkpoints: {self.checkpoint_dir}")
        if self.loss_curve:
            lines.append(f"  loss curve:  {self.loss_curve}")
        if self.goodput:
            lines.extend(describe(self.goodput))
        if self.goodput_plot:
            lines.append(f"  timeline:    {self.goodput_plot}")
        return "\n".join(lines)


def summarize(config: TrainLmConfig) -> RunSummary:
    directory = run_dir(config)
    metrics_file = directory / METRICS_FILENAME
    records = read_metrics(metrics_file)
    train_losses = [r["train/loss"] for r in records if isinstance(r.get("train/loss"), float)]
    eval_losses = [r["eval/loss"] for r in records if isinstance(r.get("eval/loss"), float)]
    curve = None
    if config.plot and records:
        curve = plot_loss_curves(
            {config.trainer.id: metrics_file}, directory / "loss_curve.png", title=f"{config.trainer.id}"
        )
    goodput = read_record(directory / GOODPUT_FILENAME)
    timeline = None
    if config.plot and goodput and goodput["attempts"]:
        timeline = plot_goodput(goodput, directory / "goodput.png")
    return RunSummary(
        run_id=config.trainer.id,
        run_dir=str(directory),
        checkpoint_dir=checkpoint_dir(config),
        metrics_file=str(metrics_file),
        steps_completed=max((r["step"] + 1 for r in records), default=0),
        final_train_loss=train_losses[-1] if train_losses else None,
        first_eval_loss=eval_losses[0] if eval_losses else None,
        final_eval_loss=eval_losses[-1] if eval_losses else None,
        loss_curve=curve,
        goodput=goodput,
        goodput_plot=timeline,
    )
