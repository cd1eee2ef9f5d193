"""``python -m tests.helpers.compile_cache_child MODE CACHE``: one small program compiled with a compilation cache, in
a process of its own (JAX settles its cache once per process). Ends stdout with one JSON line.

MODE ``run``: the run's cache as training sets it (``trainer.compilation_cache: CACHE``, whatever
``$JAX_COMPILATION_CACHE_DIR`` says). MODE ``jax``: jax's own setting only (``jax_compilation_cache_dir``), no
workaround, logging at INFO: what jax itself reports of a hit.
"""

import json
import logging
import sys
import types

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
mode, cache = sys.argv[1], sys.argv[2]
if mode == "run":
    from levanter_mars.training import compilation_cache

    trainer = types.SimpleNamespace(compilation_cache=cache, checkpointer=types.SimpleNamespace(base_path="/unused"))
    compilation_cache.enable(trainer)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

if mode == "jax":
    jax.config.update("jax_compilation_cache_dir", cache)
program = jax.jit(lambda x: jnp.sin(x) @ x.T + 2.5)
program(jnp.ones((64, 64))).block_until_ready()
program(jnp.ones((32, 32))).block_until_ready()  # a second program of the same name

from levanter_mars.compat.jax_compilation import cache_use  # noqa: E402

print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "cache_use": cache_use()}))
