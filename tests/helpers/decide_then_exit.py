"""``python -m tests.helpers.decide_then_exit PORT PROCESS_ID WAY``: process 0 decides a stop for both processes and
exits the moment it may, as the training program does (``training/distributed.exit_now``); process 1 reads the
decision 2 s late. WAY is ``levanter`` (Levanter's ``multihost_broadcast_sync``) or ``leader_decides`` (ours). Process
1 prints what it got: the decision, or the error reading it (defect 46)."""

import json
import os
import sys
import time

import jax


class _LateReader:
    """The distributed client, reading a key 2 s late (a peer busy elsewhere when process 0 decided)."""

    def __init__(self, client):
        self._client = client

    def blocking_key_value_get(self, *args, **kwargs):
        time.sleep(2.0)
        return self._client.blocking_key_value_get(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


def main(port: str, process_id: str, way: str) -> None:
    import jax._src.distributed as jax_distributed
    from levanter.utils.jax_utils import multihost_broadcast_sync

    from levanter_mars.training import distributed
    from levanter_mars.training.errors import RunLeasedError

    jax.distributed.initialize(f"127.0.0.1:{port}", 2, int(process_id), heartbeat_timeout_seconds=20)
    leader = jax.process_index() == 0
    if not leader:
        jax_distributed.global_state.client = _LateReader(jax_distributed.global_state.client)

    def refuse():
        raise RunLeasedError("the run is live elsewhere")

    if way == "levanter":  # process 0 leaves at once: its coordination service goes with it
        got = multihost_broadcast_sync({"error": "RunLeasedError"} if leader else None, timeout=60)
        print(json.dumps(got), flush=True)
        os._exit(0)
    try:
        distributed.leader_decides(refuse)
    except RunLeasedError as e:  # as the training program leaves after a decided stop (main/train_lm.cli)
        print(json.dumps({"raised": type(e).__name__}), flush=True)
        distributed.exit_now(0, together=e.decided_together)


if __name__ == "__main__":
    main(*sys.argv[1:4])
