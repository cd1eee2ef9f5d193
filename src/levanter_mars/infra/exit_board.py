"""Where the hosts of one attempt post how their training process ended, as each ends.

Levanter's ``run_on_pod`` returns every host's result only when the whole attempt ends well; when a slice is lost it
raises, and the results of the hosts that had ended are gone with it. A run that decided a stop (process 0 decides,
its peers are torn down, and a slice goes with them) would then read as a preemption and be retried. So each host task
also posts its result here; after a lost slice the driver judges what was posted, the hosts that posted nothing as
lost (``infra/pod.py``). The actor's class imports nothing: the worker that runs it imports this module.
"""

from __future__ import annotations


class ExitBoard:
    """The results posted so far (``returncode``, ``process``, ...), in the order they came."""

    def __init__(self) -> None:
        self._results: list[dict] = []

    def post(self, result: dict) -> None:
        self._results.append(dict(result))

    def results(self) -> list[dict]:
        return list(self._results)


def start_exit_board() -> tuple[str, object]:
    """Starts an attempt's board; returns its name and handle (it lives while the handle does)."""
    from levanter_mars.infra.rendezvous import start_named

    return start_named(ExitBoard, "exit-board")


def post_to(name: str, result: dict) -> None:
    """Posts a host's result to the board ``name`` (from the host task)."""
    import ray

    from levanter_mars.infra.rendezvous import named

    ray.get(named(name).post.remote(result))
