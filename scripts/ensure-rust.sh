# Sourced by the set-up scripts: makes sure a stable Rust toolchain with rustfmt and clippy is on
# PATH, installing rustup (minimal profile) into ~/.cargo if there is none.
if ! command -v cargo >/dev/null 2>&1; then
    if [[ -x $HOME/.cargo/bin/cargo ]]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    else
        echo "[setup] no cargo found: installing the stable Rust toolchain with rustup" >&2
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal \
            --component rustfmt,clippy >&2
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
fi
if command -v rustup >/dev/null 2>&1; then
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi
