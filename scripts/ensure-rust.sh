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
# The workspace needs Rust 1.89 or newer (`rust-version` in Cargo.toml): update an older toolchain.
if command -v rustc >/dev/null 2>&1; then
    minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
    if [[ $minor =~ ^[0-9]+$ ]] && ((minor < 89)); then
        if command -v rustup >/dev/null 2>&1; then
            echo "[setup] rustc 1.$minor is older than 1.89: updating the stable toolchain" >&2
            rustup update stable >&2 && rustup default stable >&2
        else
            echo "[setup] rustc 1.$minor is older than the 1.89 this workspace needs" >&2
        fi
    fi
fi
