"""The `tensorzip` command line from the Python package: `python -m tensorzip compress ...`, or the
`tensorzip` script that `pip install tensorzip` puts on the path — the same command as the Rust
binary (`crates/tensorzip-cli`), run by the extension module. Needs no torch."""

import sys


def main() -> None:
    from ._tensorzip import cli_main

    raise SystemExit(cli_main(["tensorzip", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
