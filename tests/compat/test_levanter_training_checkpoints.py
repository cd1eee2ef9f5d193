"""Defects of the pinned Levanter's checkpoints that ``levanter_mars.compat.levanter_training`` works around:
temporary checkpoints, missing paths, interrupted deletes and the step's type."""

import json
import os

import jax
import jax.numpy as jnp
import pytest

from levanter_mars.compat import levanter_training
from tests.helpers.compat import one_device_mesh


def _temporary_checkpoint(path):
    os.makedirs(path)
    with open(os.path.join(path, "metadata.json"), "w") as f:
        json.dump({"step": 1, "is_temporary": True}, f)
    return path


def test_defect_15_a_relative_base_path_keeps_every_temporary_checkpoint(tmp_path, monkeypatch):
    from levanter.checkpoint import Checkpointer

    monkeypatch.chdir(tmp_path)
    checkpointer = Checkpointer("ckpts/run", None, [])
    # Checkpointer.on_step records the temporary checkpoint as join(base_path, "step-N") and later deletes that.
    temporary = _temporary_checkpoint(os.path.join(checkpointer.base_path, "step-1"))
    checkpointer._do_rm_checkpoint(temporary)
    assert os.path.isdir(temporary), "upstream now deletes it: remove checkpointer_base_path"


def test_defect_15_workaround_deletes_superseded_temporary_checkpoints(tmp_path, monkeypatch):
    from levanter_mars.training.checkpointing.writer import VerifiedCheckpointerConfig

    monkeypatch.chdir(tmp_path)
    checkpointer = VerifiedCheckpointerConfig(base_path="ckpts").create("run")
    assert checkpointer.base_path == os.path.join(os.getcwd(), "ckpts", "run")
    temporary = _temporary_checkpoint(os.path.join(checkpointer.base_path, "step-1"))
    checkpointer._do_rm_checkpoint(temporary)
    assert not os.path.exists(temporary)
    assert levanter_training.checkpointer_base_path("gs://bucket/ckpts/run") == "gs://bucket/ckpts/run"


def test_defect_36_levanter_tells_missing_paths_from_a_missing_checkpoint_only_by_the_message(tmp_path):
    from levanter.checkpoint import load_checkpoint
    from levanter.tensorstore_serialization import tree_deserialize_leaves_tensorstore, tree_serialize_leaves_tensorstore

    tree_serialize_leaves_tensorstore(str(tmp_path / "ckpt"), {"a": jnp.zeros(3)})
    with pytest.raises(FileNotFoundError) as not_stored:
        tree_deserialize_leaves_tensorstore(str(tmp_path / "ckpt"), {"a": jnp.zeros(3), "b": jnp.zeros(2)})
    with pytest.raises(FileNotFoundError) as no_checkpoint:
        load_checkpoint({"a": jnp.zeros(3)}, str(tmp_path / "gone"), discover_latest=False)
    assert type(not_stored.value) is type(no_checkpoint.value), "one class for both"
    assert levanter_training.missing_checkpoint_paths(not_stored.value) == [str(tmp_path / "ckpt" / "b")]
    assert levanter_training.missing_checkpoint_paths(no_checkpoint.value) is None
    assert levanter_training.missing_checkpoint_paths(FileNotFoundError("Missing paths: not a list")) is None


def _checkpoint_with_arrays(path):
    """A committed temporary checkpoint: metadata, manifest and array chunks, named so that a listing order puts
    some chunks before the metadata."""
    _temporary_checkpoint(path)
    for name in ("a/0.0", "a/.zarray", "manifest.json", "z/0.0"):
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        with open(os.path.join(path, name), "w") as f:
            f.write("x")
    return path


class _Interrupted(Exception):
    pass


def _delete_cut_short_after(monkeypatch, deletions: int):
    """Every delete through fsspec's local filesystem raises (a kill) once ``deletions`` files are gone."""
    from fsspec.implementations.local import LocalFileSystem

    gone = []
    real_rm_file = LocalFileSystem.rm_file

    def rm_file(self, path):
        if len(gone) == deletions:
            raise _Interrupted(path)
        real_rm_file(self, path)
        gone.append(path)

    def rm(self, path, recursive=False, maxdepth=None):  # as object storage does: file by file, in listing order
        for file in sorted(self.find(path)):
            self.rm_file(file)
        real_rm_file_tree(path)

    import shutil

    real_rm_file_tree = shutil.rmtree
    monkeypatch.setattr(LocalFileSystem, "rm_file", rm_file)
    monkeypatch.setattr(LocalFileSystem, "rm", rm)
    return gone


def test_defect_40_levanter_deletes_a_checkpoint_in_one_recursive_delete_and_the_workaround_unmarks_it(
    tmp_path, monkeypatch
):
    from levanter.checkpoint import Checkpointer

    from levanter_mars.training.checkpointing.audit import audit_checkpoint
    from levanter_mars.training.checkpointing.writer import VerifiedCheckpointerConfig

    # Levanter's delete, cut short after its first file: metadata.json is still there, a chunk is not.
    upstream = Checkpointer(str(tmp_path / "upstream"), None, [])
    torn = _checkpoint_with_arrays(str(tmp_path / "upstream" / "step-1"))
    _delete_cut_short_after(monkeypatch, 1)
    upstream._do_rm_checkpoint(torn)  # logs the failure, as Levanter does
    assert not os.path.exists(os.path.join(torn, "a", ".zarray"))
    assert os.path.exists(os.path.join(torn, "metadata.json")), "upstream now deletes metadata first: remove defect 40"

    # Ours, cut short after its first file: the metadata went first, and the audit sees an incomplete checkpoint.
    ours = VerifiedCheckpointerConfig(base_path=str(tmp_path / "ours")).create("run")
    cut = _checkpoint_with_arrays(os.path.join(ours.base_path, "step-1"))
    monkeypatch.undo()
    _delete_cut_short_after(monkeypatch, 1)
    with pytest.raises(_Interrupted):
        ours._do_rm_checkpoint(cut)
    assert not os.path.exists(os.path.join(cut, "metadata.json"))
    assert audit_checkpoint(cut).state == "incomplete"
    # Not cut short, it deletes everything.
    monkeypatch.undo()
    ours._do_rm_checkpoint(cut)
    assert not os.path.exists(cut)


def test_defect_41_a_fresh_trainer_states_step_is_weakly_typed_a_loaded_one_not_and_the_workaround_aligns_them(
    tmp_path,
):
    import equinox as eqx
    import haliax as hax
    import optax
    from levanter.checkpoint import load_checkpoint, save_checkpoint
    from levanter.trainer_state import TrainerState

    from levanter_mars.compat.levanter_training import strongly_typed_step

    class Tiny(eqx.Module):
        w: hax.NamedArray

    model = Tiny(hax.ones(hax.Axis("d", 4)))
    fresh = TrainerState.init(optax.sgd(0.1), model, key=jax.random.PRNGKey(0), is_trainable=True)
    assert fresh.step.weak_type, "upstream now makes the step strongly typed: remove defect 41"
    save_checkpoint(fresh, step=0, checkpoint_path=str(tmp_path / "step-0"))
    with one_device_mesh():
        loaded = load_checkpoint(fresh, str(tmp_path / "step-0"))
    assert not loaded.step.weak_type

    # The jit hooks' `step % every` is another program for each type: another persistent-cache key.
    def due(step):
        return step % 10 == 0

    def typed(step):
        return jax.ShapeDtypeStruct(step.shape, step.dtype, weak_type=step.weak_type)

    program = {name: jax.jit(due).lower(typed(s.step)).as_text(debug_info=False) for name, s in
               [("fresh", fresh), ("loaded", loaded), ("workaround", strongly_typed_step(fresh))]}  # fmt: skip
    assert program["fresh"] != program["loaded"]
    assert program["workaround"] == program["loaded"]
    fixed = strongly_typed_step(fresh)
    assert not fixed.step.weak_type and int(fixed.step) == 0 and fixed.step.dtype == loaded.step.dtype
    assert strongly_typed_step(loaded) is loaded
