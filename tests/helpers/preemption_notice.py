"""One of two processes (``python -m tests.helpers.preemption_notice PORT ID``) started as the training program starts
a pod (``training/pod_start.py``), 2 simulated devices each: they step along (a collective per step, as training
does), process 1 sends itself SIGTERM before step 3, and each asks ``PreemptionNotice.reached`` at every step boundary,
listening as the trainer does. Prints the step where it said yes (None: never, in 200 steps of 0.1 s)."""

import json
import os
import signal
import sys
import time
from types import SimpleNamespace

from levanter.distributed import DistributedConfig

from levanter_mars.training import pod_start

port, process_id = int(sys.argv[1]), int(sys.argv[2])
trainer = SimpleNamespace(distributed=DistributedConfig(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id))
pod_start.start(trainer)

from jax.experimental import multihost_utils  # noqa: E402

from levanter_mars.training.preemption import PreemptionNotice  # noqa: E402

NOTICE_AT = 3
notice = PreemptionNotice()
reached = None
with notice.listening():
    for step in range(200):
        if process_id == 1 and step == NOTICE_AT:
            os.kill(os.getpid(), signal.SIGTERM)
        if notice.reached(step):
            reached = step
            break
        multihost_utils.sync_global_devices(f"step {step}")
        time.sleep(0.5)  # a step takes time: the notice travels through the coordination service meanwhile
print(json.dumps({"reached": reached, "notice_at": NOTICE_AT}))
