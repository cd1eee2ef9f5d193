"""A plain re-implementation of the comparison's per-seed speed-up (``compare.measure.seed_speedup``), for tests to
hold the comparison's figures to."""

from __future__ import annotations


def reach(tokens, losses, target):
    """The tokens at which ``losses`` first get to ``target``, linearly interpolated (None: never)."""
    for j, loss in enumerate(losses):
        if loss is None:
            return None
        if loss <= target:
            if j == 0 or losses[j - 1] == loss:
                return tokens[j]
            l0 = losses[j - 1]
            return tokens[j - 1] + (l0 - target) / (l0 - loss) * (tokens[j] - tokens[j - 1])
    return None


def seed_speedups(reference, arm):
    """Seed by seed (lists of (tokens, losses)): the reference's tokens to its own final loss over the arm's."""
    out = []
    for (rt, rl), (at, al) in zip(reference, arm):
        ta = reach(at, al, rl[-1])
        out.append(None if ta is None else reach(rt, rl, rl[-1]) / ta)
    return out
