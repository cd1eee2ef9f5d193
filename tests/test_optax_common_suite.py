"""optax's own common test suite for contrib optimizers (``optax/contrib/_common_test.py`` of the installed optax),
run unchanged on our optimizers.

The suite's source is read from the installed optax and executed as it is, except for its lists of optimizers under
test, which are replaced by ours (``OPTIMIZERS_UNDER_TEST``); a change in the suite's structure (a list not found
where expected) fails this module loudly instead of testing nothing. optax's own optimizers and its wrappers are left
out: they test optax, not us.

The suite finds a factory by name on ``optax.contrib`` (``_get_opt_factory``), so ours are set there, under the names
of ``FACTORIES``, for this module's tests only. The suite passes the objective (``obj_fn``) to one optimizer name
only, ``sophia``, in every test: exact MARS, which needs that objective, takes that name here (optax's Sophia itself
is not under test), so exact mode runs every check with the loss it needs.

Each entry's learning rate is one at which that optimizer converges on the suite's targets (parabolas, Rosenbrock,
a 2-D matrix, a mix) to the suite's tolerance in its 30,000 steps; the suite's tolerances are not touched.
"""

import ast
import copy
from pathlib import Path

import optax
import optax.contrib
import pytest

from levanter_mars.optim import mars, mars_m

#: 161 small programs compiled one by one: about a CPU-minute in all, so out of `make test-fast`.
pytestmark = pytest.mark.slow

SUITE = Path(optax.contrib.__file__).parent / "_common_test.py"

#: Our factories, by the name the suite's entries use. ``sophia``: see the module docstring.
FACTORIES = {"levanter_mars": mars, "levanter_mars_m": mars_m, "sophia": mars}

#: One entry per line: every MARS variant, the options that change the state or the update's path, MARS-M's forms.
#: Dtypes are given by name: the suite's inject_hyperparams test would take a dtype class (a callable) for a schedule.
#: The suite's float16-float64 stability test runs on a vector only, which MARS routes through its matrix update only
#: with ``optimize_1d`` (tests/test_mars_api.py trains float64 matrices).
OPTIMIZERS_UNDER_TEST = [
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-2, "variant": "adamw"}},
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-3, "variant": "lion"}},
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-3, "variant": "shampoo"}},
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-2, "optimize_1d": True}},
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-2, "mu_dtype": "bfloat16"}},
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-2, "prev_dtype": "bfloat16"}},
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-2, "max_grad_norm": 1.0}},
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-2, "amsgrad": True, "weight_decay_1d": 0.0}},
    {"opt_name": "levanter_mars", "opt_kwargs": {"learning_rate": 1e-2, "amsgrad": True, "optimize_1d": True}},
    {"opt_name": "sophia", "opt_kwargs": {"learning_rate": 1e-2, "exact": True}},
    {"opt_name": "levanter_mars_m", "opt_kwargs": {"learning_rate": 1e-2}},
    {"opt_name": "levanter_mars_m", "opt_kwargs": {"learning_rate": 1e-2, "efficient": True}},
]

#: The suite's list assignments we replace, and with what: ``name = [...]`` and ``name += [...]``, each exactly once.
_REPLACED = {
    ("Assign", "_MAIN_OPTIMIZERS_UNDER_TEST"): "_LEVANTER_MARS_OPTIMIZERS",  # optax's contrib optimizers
    ("AugAssign", "_MAIN_OPTIMIZERS_UNDER_TEST"): "_NOTHING",  # optax's wrappers (mechanize, ...) around sgd
    ("Assign", "_BASE_OPTIMIZERS"): "_NOTHING",  # optax's optimizers, wrapped in mechanize
}


def _suite_namespace() -> dict:
    tree = ast.parse(SUITE.read_text(), filename=str(SUITE))
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AugAssign):
            target = node.target
        else:
            continue
        key = (type(node).__name__, getattr(target, "id", None))
        if key in _REPLACED and isinstance(node.value, ast.List):
            node.value = ast.copy_location(ast.Name(id=_REPLACED[key], ctx=ast.Load()), node.value)
            found.append(key)
    if sorted(found) != sorted(_REPLACED):
        raise RuntimeError(f"{SUITE}: its structure changed; expected one list literal for each of "
                           f"{sorted(_REPLACED)}, replaced {sorted(found)}. Update tests/test_optax_common_suite.py.")
    namespace = {
        "__name__": "optax_contrib_common_test_on_levanter_mars",
        "__file__": str(SUITE),
        "_LEVANTER_MARS_OPTIMIZERS": copy.deepcopy(OPTIMIZERS_UNDER_TEST),  # the suite adds keys to each entry
        "_NOTHING": [],
    }
    exec(compile(tree, str(SUITE), "exec"), namespace)
    if "ContribTest" not in namespace:
        raise RuntimeError(f"{SUITE}: no ContribTest class; update tests/test_optax_common_suite.py.")
    return namespace


_SUITE = _suite_namespace()
ContribTest = _SUITE["ContribTest"]


@pytest.fixture(autouse=True, scope="module")
def _our_factories_on_optax_contrib():
    with pytest.MonkeyPatch.context() as patch:
        for name, factory in FACTORIES.items():
            patch.setattr(optax.contrib, name, factory, raising=name == "sophia")
        yield


def test_the_suite_tests_exactly_our_optimizers():
    names = {entry["opt_name"] for entry in _SUITE["_ALL_OPTIMIZERS_UNDER_TEST"]}
    assert names == set(FACTORIES)
    assert len(_SUITE["_ALL_OPTIMIZERS_UNDER_TEST"]) == len(OPTIMIZERS_UNDER_TEST)
