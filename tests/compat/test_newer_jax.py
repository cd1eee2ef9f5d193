"""Defects that newer jax releases bring to the pinned haliax and Levanter, which ``levanter_mars.compat.newer_jax``
works around."""

import inspect

from tests.helpers.processes import REPO


def test_defect_24_haliax_calls_a_jax_name_newer_jax_removed_and_the_workaround_restores_it(monkeypatch):
    import haliax.jax_utils
    import jax.core

    from levanter_mars.compat import newer_jax

    assert "jax.core.is_constant_dim" in inspect.getsource(haliax.jax_utils)
    original = jax.core.is_constant_dim  # the pinned jax has it (a deprecated alias since 0.10)
    newer_jax.restore_jax_names_haliax_uses()
    assert jax.core.is_constant_dim is original  # nothing changes

    def no_such_name(name):
        raise AttributeError(f"module 'jax.core' has no attribute {name!r}")

    # As in jax 0.11: neither an attribute nor a deprecated alias (served by the module's __getattr__ on 0.10).
    monkeypatch.setattr(jax.core, "is_constant_dim", None, raising=False)  # undone last: the module as it was
    monkeypatch.delattr(jax.core, "is_constant_dim")
    monkeypatch.setattr(jax.core, "__getattr__", no_such_name, raising=False)
    assert not hasattr(jax.core, "is_constant_dim")
    newer_jax.restore_jax_names_haliax_uses()
    assert jax.core.is_constant_dim(3) and not jax.core.is_constant_dim(object())


def test_defect_25_levanter_models_load_when_the_levanter_package_cannot_be_imported():
    import subprocess
    import sys

    # A GPU image without Ray: `import levanter` fails, its GPT-2 model must still load.
    code = """
import sys
class NoRay:
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("no ray here")
sys.meta_path.insert(0, NoRay())
try:
    import levanter
except ImportError:
    pass
else:
    raise SystemExit("levanter imported without ray: the workaround may be unnecessary")
from levanter_mars.compat import newer_jax
assert newer_jax.levanter_importable() == "models only"
from levanter.models.gpt2 import Gpt2Config
print(Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1).Embed.size)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "32"
