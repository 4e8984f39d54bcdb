# Sourced by the set-up scripts: makes sure .venv exists (python3 -m venv, installing the Debian
# package python3-venv if the module is missing) with maturin and pytest, and, with
# TENSORZIP_NEED_TORCH=1, torch (and numpy) from PyPI (the CUDA build PyPI serves; on a machine
# without a GPU it runs on the CPU). Sets PY to the venv's python.
VENV="$(pwd)/.venv"
PY="$VENV/bin/python"
if [[ ! -x $PY ]]; then
    if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
        echo "[setup] python3 -m venv failed: installing python3-venv" >&2
        rm -rf "$VENV"
        if command -v apt-get >/dev/null 2>&1; then
            if [[ $(id -u) == 0 ]]; then
                (apt-get update -qq && apt-get install -y -qq python3-venv python3-pip) >&2
            elif ! sudo -n sh -c 'apt-get update -qq && apt-get install -y -qq python3-venv python3-pip' >&2; then
                echo "[setup] cannot install python3-venv: not root and no passwordless sudo" >&2
            fi
        fi
        python3 -m venv "$VENV"
    fi
fi
pip_install() {
    "$PY" -m pip install --disable-pip-version-check -q "$@" >&2
}
"$PY" -c "import maturin, pytest" >/dev/null 2>&1 || pip_install "maturin>=1.5,<2" "pytest>=8,<10"
if [[ ${TENSORZIP_NEED_TORCH:-0} == 1 ]]; then
    # numpy too: torch imports it when present and warns in every test run when it is not.
    if ! "$PY" -c "import torch, numpy" >/dev/null 2>&1; then
        echo "[setup] installing torch and numpy from PyPI into .venv (a few GB the first time)" >&2
        # Bounded by the versions the suite has run with (2.11 on the GPU machine, 2.15 here).
        pip_install "torch>=2.11,<2.16" numpy
    fi
fi
export PATH="$VENV/bin:$PATH"
