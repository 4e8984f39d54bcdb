#!/usr/bin/env python3
"""Writes a small Hugging Face style model directory for command-line checks, with the standard
library only (the GPU machine has no package index): two .safetensors shards of bf16, fp16 and fp32
weights (normal values with a per-row scale, as trained weights have), their index and a config.

    python3 scripts/make_model_dir.py DIR [SEED]
"""
import json
import os
import random
import struct
import sys


def tensor(rng, dtype, shape):
    n = 1
    for d in shape:
        n *= d
    cols = shape[-1] if shape else 1
    out = bytearray()
    scale = 0.02
    for i in range(n):
        if i % cols == 0:
            scale = 0.02 * (1.3 ** rng.gauss(0, 1))
        v = rng.gauss(0, 1) * scale
        if dtype == "F32":
            out += struct.pack("<f", v)
        elif dtype == "F16":
            out += struct.pack("<e", v)
        else:  # BF16: the upper half of the fp32 bits (truncation)
            out += struct.pack("<f", v)[2:]
    return bytes(out)


def write_safetensors(path, tensors):
    header, offset, data = {"__metadata__": {"format": "pt"}}, 0, []
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data.append(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for raw in data:
            f.write(raw)


def main():
    out = sys.argv[1]
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 7)
    os.makedirs(out, exist_ok=False)
    shards = [
        [("embed.weight", "BF16", [512, 256]), ("norm.weight", "F32", [256]), ("scalar", "F32", [])],
        [("layer.0.weight", "F16", [256, 384]), ("layer.0.bias", "F32", [384]), ("empty", "BF16", [0, 3])],
    ]
    weight_map, total = {}, 0
    for i, specs in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = [(n, d, s, tensor(rng, d, s)) for n, d, s in specs]
        write_safetensors(os.path.join(out, name), tensors)
        for n, _, _, raw in tensors:
            weight_map[n] = name
            total += len(raw)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "tensorzip-check", "hidden_size": 256}, f)


if __name__ == "__main__":
    main()
