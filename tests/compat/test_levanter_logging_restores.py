"""Levanter's logging (compat/levanter_logging.py): the log file's name (defect 28, the standalone evaluation's own
log) and the warning of every None leaf a restore skips (defect 43)."""

import logging

import jax.numpy as jnp
import pytest

from levanter_mars.compat import levanter_logging


@pytest.fixture
def root_handlers(monkeypatch):
    """``init_logging`` replaces the root logger's handlers: here a list of the test's own, closed after it."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    yield
    for handler in root.handlers:
        handler.close()


def test_defect_28_workaround_gives_another_program_its_own_log(tmp_path, root_handlers):
    import levanter.utils.logging as upstream_logging

    with levanter_logging.log_file_named_by_run_id("run-1.eval"):
        upstream_logging.init_logging(tmp_path, "run-1.log")  # as TrainerConfig.initialize calls it
    assert [p.name for p in tmp_path.iterdir()] == ["run-1.eval.log"]


def _restore_a_state_with_none_leaves(directory) -> dict:
    """Saves and restores a state with a None leaf, as a checkpoint's model and optimizer state have them, and a
    leaf of another type Levanter does not know (a string)."""
    from levanter import tensorstore_serialization as serialization

    serialization.tree_serialize_leaves_tensorstore(str(directory), {"weight": jnp.ones(3), "bias": None})
    exemplar = {"weight": jnp.zeros(3), "bias": None, "name": "x"}
    return serialization.tree_deserialize_leaves_tensorstore(str(directory), exemplar)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == levanter_logging.SERIALIZATION_LOGGER and r.levelno >= logging.WARNING]  # fmt: skip


@pytest.fixture
def serialization_logger(monkeypatch):
    """Levanter's serialization logger without any filter (an earlier test's program may have installed ours)."""
    logger = logging.getLogger(levanter_logging.SERIALIZATION_LOGGER)
    monkeypatch.setattr(logger, "filters", [])
    return logger


def test_defect_43_levanter_warns_of_every_none_leaf_it_restores(tmp_path, caplog, serialization_logger):
    restored = _restore_a_state_with_none_leaves(tmp_path)
    assert restored["bias"] is None and restored["weight"].tolist() == [1.0, 1.0, 1.0]  # nothing was wrong
    assert _warnings(caplog) == [levanter_logging.NONE_LEAF_WARNING, "Unknown leaf type <class 'str'>"]


def test_defect_43_workaround_drops_exactly_that_warning(tmp_path, caplog, serialization_logger):
    from levanter_mars.program_logging import set_up_program_logging

    set_up_program_logging()  # what training and the standalone evaluation do first
    set_up_program_logging()  # once is enough: no second filter
    assert len(serialization_logger.filters) == 1
    _restore_a_state_with_none_leaves(tmp_path)
    assert _warnings(caplog) == ["Unknown leaf type <class 'str'>"]  # another unknown leaf type still warns
