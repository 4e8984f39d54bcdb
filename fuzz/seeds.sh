#!/bin/sh
# (Re)creates the seed corpora of the fuzz targets: real blobs in corpus/decode_blob/ and real archives
# in corpus/decode_archive/. The corpus directory is git-ignored; run this before the first fuzz run.
set -eu
cd "$(dirname "$0")"
cargo run --quiet --release --example seeds -- corpus
