"""How a launcher that retries tells the training program which launch an attempt belongs to (light: imported by
the Ray host task, which must not import JAX)."""

#: A launch's id, the same for every attempt of it; unset for a plain command, where each invocation is a launch.
LAUNCH_ID_ENV = "LEVANTER_MARS_LAUNCH_ID"
#: When the launcher started this attempt (seconds since the epoch): the goodput record's start of the attempt.
ATTEMPT_STARTED_ENV = "LEVANTER_MARS_ATTEMPT_STARTED"
#: Why this attempt runs on another slice count than the one before it (the launcher's words; unset: no change).
SLICE_CHANGE_ENV = "LEVANTER_MARS_SLICE_CHANGE"


def new_launch_id() -> str:
    """Names one launch (a pod driver, a plain-gcloud launcher), for every attempt it makes."""
    import time
    import uuid

    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
