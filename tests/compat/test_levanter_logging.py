"""Defect 28 of the pinned Levanter's logging, which ``levanter_mars.compat.levanter_logging`` works around."""

import contextlib
import inspect


@contextlib.contextmanager
def _root_logging_restored():
    import logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:], root.level = handlers, level


def test_defect_28_levanter_names_its_log_file_run_id_dot_log_dot_log(tmp_path):
    import levanter.utils.logging as levanter_logging
    from levanter.trainer import TrainerConfig

    assert 'init_logging(self.log_dir, f"{id}.log")' in inspect.getsource(TrainerConfig.initialize)
    with _root_logging_restored():
        levanter_logging.init_logging(tmp_path, "run-1.log")
    assert [p.name for p in tmp_path.iterdir()] == ["run-1.log.log"]


def test_defect_28_workaround_names_it_run_id_dot_log(tmp_path):
    import levanter.utils.logging as levanter_logging

    from levanter_mars.compat.levanter_logging import log_file_named_by_run_id

    with _root_logging_restored(), log_file_named_by_run_id():
        levanter_logging.init_logging(tmp_path, "run-1.log")  # as TrainerConfig.initialize calls it
    assert [p.name for p in tmp_path.iterdir()] == ["run-1.log"]
    assert levanter_logging.init_logging.__name__ == "init_logging", "the patch outlived Levanter's initialize"
