#!/usr/bin/env bash
# The speed benchmarks on an accelerator (made for one H200; under 6 minutes): bench_optimizer.py on GPT-2 small and
# medium, bench_step.py on GPT-2 small and medium (16 x 1024 tokens a step, bf16 compute). Each writes its JSON to $OUT/<name>.json and its
# tables and progress to $OUT/<name>.log (also shown here).
#
#   OUT=/tmp/out bash scripts/gpu_bench.sh
#
# Runs on jax 0.8+ (the benchmarks do not use Levanter's loss) and without Ray/lm-eval (Levanter's model modules
# are imported without its package __init__ when that fails). Wheels in .whl/ (if present) are installed into
# /tmp/site first; docs/benchmarks.md lists the ones a bare jax image needs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/bench-out}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # so that the allocator's peak reflects what the benchmarks used
export PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import jax; print("jax", jax.__version__, jax.devices())'

run() {
  local name=$1; shift
  echo "== $name $*"
  local start=$SECONDS
  "$PYTHON" "scripts/$name.py" --json "$@" > "$OUT/$name.json" 2> >(tee "$OUT/$name.log" >&2)
  echo "== $name: $((SECONDS - start)) s"
}

# EXTRA_ARGS (e.g. "--quick --sizes nano" for a smoke run on a CPU) are appended to both commands.
run bench_optimizer --sizes small,medium --repeats 5 ${EXTRA_ARGS:-}
run bench_step --sizes small,medium --batch-size 16 --repeats 5 ${EXTRA_ARGS:-}
echo "results in $OUT"
