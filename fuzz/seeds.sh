#!/bin/sh
# (Re)creates the seed corpora of the fuzz targets: real blobs in corpus/decode_blob/ and real archives
# in corpus/decode_archive/ and corpus/decode_archive_sealed/. The corpus directory is git-ignored; run
# this before the first fuzz run (it only adds files; corpus entries found by fuzzing are kept).
set -eu
cd "$(dirname "$0")"
cargo run --quiet --release --example seeds -- corpus
mkdir -p corpus/decode_archive_sealed
cp corpus/decode_archive/archive-* corpus/decode_archive_sealed/
