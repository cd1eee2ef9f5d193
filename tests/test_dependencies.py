"""Installable beside other JAX stacks: ranges (not pins) in pyproject.toml, the lock in constraints.txt, and an
optimizer package that imports without Levanter.

Also run by .ci/newest, in a venv with the newest jax/optax/equinox/haliax and no Levanter.
"""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
#: What the training stack imports; the optimizer package must import none of it.
TRAINING_STACK = ("levanter", "ray", "transformers", "datasets", "draccus", "wandb", "lm_eval", "tensorstore")
#: Lower bounds below the lock, each tested by a CI check other than `make test`.
TESTED_ELSEWHERE = {"optax": ".ci/marin runs the optimizer's tests on Marin's optax 0.2.6"}


def _requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = [project["dependencies"], *project["optional-dependencies"].values()]
    return [Requirement(line) for group in groups for line in group if not line.startswith("levanter-mars")]


def _lock() -> dict[str, Version]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if "==" in line and not line.startswith("#")]
    return {_normal(name): Version(version.strip()) for name, version in pins}


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def test_direct_dependencies_are_ranges_with_a_lower_bound():
    for requirement in _requirements():
        operators = {spec.operator for spec in requirement.specifier}
        assert not operators & {"==", "==="}, f"pyproject.toml pins {requirement}: state a range, lock in constraints.txt"
        assert ">=" in operators, f"pyproject.toml: {requirement} has no (tested) lower bound"


def test_the_lock_satisfies_every_range_and_holds_each_lower_bound():
    """`make setup` installs the lock, so `make test` tests each lower bound (unless a CI check tests a lower one)."""
    lock = _lock()
    for requirement in _requirements():
        name = _normal(requirement.name)
        assert name in lock, f"{requirement.name} is a direct dependency missing from constraints.txt"
        assert requirement.specifier.contains(lock[name], prereleases=True), f"lock {name}=={lock[name]} vs {requirement}"
        (lower,) = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
        if name not in TESTED_ELSEWHERE:
            assert lower == lock[name], f"{requirement}: the tested lower bound is the lock's {lock[name]}"


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]), JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


_IMPORT_OPTIMIZER = f"""
import sys
import levanter_mars.optim as optim
import jax.numpy as jnp
tx = optim.mars(1e-2)
updates, _ = tx.update({{"w": jnp.ones((3, 2))}}, tx.init({{"w": jnp.ones((3, 2))}}), {{"w": jnp.ones((3, 2))}})
stack = sorted({{m.split(".")[0] for m in sys.modules}} & set({TRAINING_STACK!r}))
print(stack, bool(jnp.all(jnp.isfinite(updates["w"]))))
"""

_NO_LEVANTER = """
import sys
class NoLevanter:
    def find_spec(self, name, path=None, target=None):
        if name == "levanter" or name.startswith("levanter."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, NoLevanter())
"""

_MARS_TYPES = ("mars-adamw", "mars-lion", "mars-shampoo", "mars-m")


def test_the_optimizer_imports_and_steps_without_levanter():
    code = _IMPORT_OPTIMIZER if importlib.util.find_spec("levanter") is None else _NO_LEVANTER + _IMPORT_OPTIMIZER
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[] True"


def test_importing_the_optimizer_imports_no_training_stack_where_it_is_installed():
    """``python -X importtime -c "import levanter_mars.optim"`` lists every module the import loads: with Levanter
    installed (this venv), none of the training stack may be among them (registration with Levanter is explicit)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import levanter_mars.optim"], cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "src"), JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    imported = [line.rsplit("|", 1)[-1].strip() for line in lines if line.startswith("import time:")]
    assert "levanter_mars.optim" in imported  # the listing is the one asked for
    assert [m for m in imported if m.split(".")[0] in TRAINING_STACK] == []


@pytest.mark.slow  # imports Levanter in a subprocess
def test_with_levanter_registration_is_one_explicit_import():
    pytest.importorskip("levanter", reason="this venv has no Levanter (.ci/newest): the tests above cover it")
    proc = _python(
        "import levanter_mars.optim\n"
        "from levanter.optim import OptimizerConfig\n"
        "known = OptimizerConfig.get_known_choices()\n"
        f"print([n for n in {_MARS_TYPES!r} if n in known])\n"
        "import levanter_mars.optim.levanter_config\n"
        f"print([n for n in {_MARS_TYPES!r} if n in known])"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-2:] == ["[]", str(list(_MARS_TYPES))]


@pytest.mark.slow  # imports Levanter in a subprocess
def test_a_levanter_that_cannot_be_imported_leaves_the_optimizer_usable():
    """The benchmarks' GPU image: `import levanter` fails without Ray, its models load without the package `__init__`
    (compat 25); the optimizer must still import, and its configs still register (`levanter.optim` needs no Ray)."""
    try:
        importlib.metadata.version("levanter")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("not the pinned `levanter` (.ci/newest has none; Marin's marin-levanter imports without Ray)")
    proc = _python(
        "import sys\n"
        "class NoRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ImportError('no ray here')\n"
        "sys.meta_path.insert(0, NoRay())\n"
        "from levanter_mars.compat import newer_jax\n"
        "print(newer_jax.levanter_importable())\n"
        "import levanter_mars.optim\n"
        "import levanter_mars.optim.levanter_config\n"
        "from levanter.models.gpt2 import Gpt2Config\n"
        "from levanter.optim import OptimizerConfig\n"
        "print('mars-m' in OptimizerConfig.get_known_choices(),\n"
        "      Gpt2Config(hidden_dim=32, num_heads=2, num_layers=1).Embed.size)"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-2:] == ["models only", "True 32"]
