#!/bin/sh
# (Re)creates the seed corpora of the fuzz targets: real blobs in corpus/decode_blob/, real archives
# in corpus/decode_archive/ and corpus/decode_archive_sealed/, and the safetensors files they were
# made from in corpus/compress_file/. The corpus directory is git-ignored; run
# this before the first fuzz run (it only adds files; corpus entries found by fuzzing are kept).
set -eu
cd "$(dirname "$0")"
cargo run --quiet --release --example seeds -- corpus
mkdir -p corpus/decode_archive_sealed
cp corpus/decode_archive/archive-* corpus/decode_archive_sealed/
