# Sourced by .ci/newest and .ci/marin: each keeps a venv under .cache/, rebuilt when CI or FRESH is set or when the
# files that define it change, and installs into it with uv (pinned in constraints.txt; pip only installs uv): the
# same distributions as pip would install there, in a fraction of its time (docs/testing.md).
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"

venv_stamp() {  # venv_stamp FILE...: what a venv built from these files records
  cat "$@" .ci/side_venv.sh | sha256sum | cut -c1-16
}

venv_is_current() {  # venv_is_current VENV FILE...: built from these files as they are now, and no rebuild asked
  [[ -z "${FRESH:-}${CI:-}" && "$(cat "$1/.stamp" 2>/dev/null)" == "$(venv_stamp "${@:2}")" ]]
}

fresh_venv() {  # fresh_venv VENV: an empty venv holding uv
  rm -rf "$1"
  "$PYTHON" -m venv "$1"
  "$1/bin/pip" install --quiet -c constraints.txt uv
}

uv_install() {  # uv_install VENV ARG...: `uv pip install ARG...` into VENV, bytecode compiled as pip does
  "$1/bin/uv" pip install --quiet --compile-bytecode --python "$1/bin/python" "${@:2}"
}
