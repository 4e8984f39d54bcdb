#!/bin/bash
# Chunk-size comparison on the GPU (docs/DESIGN.md, "Chunk size"): whole-model decode of MiniLM bf16
# and the built-in sample model, and 1 GiB synthetic tensors, at several chunk sizes. Run on the
# device from the repository root, carrying gpu-bin/gpu_bench (scripts/gpu_build.sh) and
# gpu-mb/minilm-bf16.safetensors (bench-data/'s MiniLM cast to bf16).
export TENSORZIP_CACHE_DIR=/tmp/tensorzip-cache
chmod +x gpu-bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do
 for c in 262144 131072 98304 65536; do
  echo "== MiniLM bf16 chunk $c"; CHUNK_BYTES=$c BENCH_DECODE_ONLY=1 ./gpu-bin/gpu_bench file gpu-mb/minilm-bf16.safetensors none 10
 done
done
for c in 262144 131072; do
  echo "== model chunk $c"; CHUNK_BYTES=$c BENCH_DECODE_ONLY=1 ./gpu-bin/gpu_bench model - - 10
done
for r in 1; do
 for c in 262144 131072; do
  for d in bf16 fp32; do echo "== synth $d chunk $c"; CHUNK_BYTES=$c ./gpu-bin/gpu_bench synth $d 8 5; done
 done
done
