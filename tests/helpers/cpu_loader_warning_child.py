"""``python -m tests.helpers.cpu_loader_warning_child write|read CACHE``: compiles one program into a compilation
cache (``write``), recording in it, as a machine with LLVM tuning features would, a pseudo-feature the host cannot
have; then loads it from there (``read``)."""

import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax._src import compilation_cache as jax_cache

mode, cache = sys.argv[1], sys.argv[2]

jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
program = jax.jit(lambda x: jnp.tanh(x) @ x + 3.0)
print("result", float(program(jnp.ones((64, 64))).sum()), flush=True)
if mode == "write":
    (entry,) = Path(cache).glob("jit__lambda*-cache")
    data = jax_cache.decompress_executable(entry.read_bytes())
    features = re.search(rb"[+-][a-z0-9.\-]+(?:,[+-][a-z0-9.\-]+){5,}", data).group().split(b",")
    pseudo = b"+fast-gather"  # an LLVM tuning feature; no host lists it
    disabled = next(f for f in features if f.startswith(b"-") and len(f) == len(pseudo))  # same length: same proto
    entry.write_bytes(jax_cache.compress_executable(data.replace(disabled, pseudo, 1)))
    print("recorded", pseudo.decode(), "in place of", disabled.decode())
