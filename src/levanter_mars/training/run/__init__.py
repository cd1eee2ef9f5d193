"""Run bookkeeping: a run's identity and directory, fresh starts, metrics, loss plots and the end-of-run summary."""
