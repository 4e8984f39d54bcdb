#!/usr/bin/env python3
"""Development probe for a format revision: what coding the exponent plane two units per symbol
(a *pair* alphabet) would cost in ratio, against the one-unit symbols format v1 codes.

    python scripts/pair_probe.py FILE.safetensors [BF16|F32] [chunk_units]

For every tensor of the dtype with at least 64 KiB, the exponent byte of each unit (bf16: bits
7-14; fp32: bits 23-30, what ZipNN's transform puts in one plane) is taken in pairs of adjacent
units. Printed, in bits per unit and in percentage points of the original size:

* the order-0 entropy, singles against pairs, one table per `chunk_units` (default 65536);
* one table per tensor at format v1's 12-bit precision (every present symbol at least 1/4096),
  table bytes counted as v1 serialises singles (2 + hi - lo + 1) and as 3 bytes a pair entry;
* the same for a pair table of only the N most frequent pairs plus an escape symbol, an escaped
  pair costing its two exponents under the tensor's single table, and how many pairs escape.

A model, not an encoder: v1's encoder picks among up to 64 tables per plane by block, which this
does not, so compare the rows with each other, not with an archive's ratio. Needs numpy.
"""
import json
import struct
import sys

import numpy as np

PROB_BITS = 12


def tensors(path, dtype):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != dtype:
            continue
        start, end = info["data_offsets"]
        if end - start >= 65536:
            yield np.frombuffer(data[8 + n + start : 8 + n + end], dtype=np.uint8)


def exponents(raw, dtype):
    if dtype == "BF16":
        e = (raw.view("<u2") >> 7) & 0xFF
    else:
        e = (raw.view("<u4") >> 23) & 0xFF
    e = e.astype(np.int64)
    return e[: e.size // 2 * 2]


def entropy_bits(counts):
    nz = counts[counts > 0]
    return float(-(nz * np.log2(nz / nz.sum())).sum())


def coded_bits(counts):
    """Bits of coding `counts` with frequencies normalised to 2^PROB_BITS (each present symbol at
    least 1; the largest takes the rounding), as a static rANS table does."""
    nz = counts[counts > 0].astype(np.float64)
    if nz.size <= 1:
        return 0.0
    scale = 1 << PROB_BITS
    f = np.maximum(1, np.round(nz / nz.sum() * scale))
    f[np.argmax(f)] += scale - f.sum()
    return float(-(nz * np.log2(f / scale)).sum())


def main():
    path = sys.argv[1]
    dtype = sys.argv[2] if len(sys.argv) > 2 else "BF16"
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 65536
    bits_per_unit = 16 if dtype == "BF16" else 32
    tops = (64, 128, 256)
    units = 0
    h1 = h2 = 0.0
    single = single_table = 0.0
    pairs = pairs_table = 0.0
    top = {n: [0.0, 0.0, 0] for n in tops}
    for raw in tensors(path, dtype):
        e = exponents(raw, dtype)
        units += e.size
        for at in range(0, e.size, chunk):
            c = e[at : at + chunk]
            h1 += entropy_bits(np.bincount(c, minlength=256))
            h2 += entropy_bits(np.bincount(c[0::2] * 256 + c[1::2], minlength=65536))
        c1 = np.bincount(e, minlength=256)
        present = np.nonzero(c1)[0]
        single += coded_bits(c1)
        single_table += 8 * (2 + present[-1] - present[0] + 1)
        c2 = np.bincount(e[0::2] * 256 + e[1::2], minlength=65536)
        pairs += coded_bits(c2)
        pairs_table += 8 * 3 * np.count_nonzero(c2)
        order = np.argsort(-c2, kind="stable")
        p1 = np.maximum(c1, 1) / c1.sum()
        for n in tops:
            kept, rest = order[:n], order[n:]
            escaped = int(c2[rest].sum())
            esc_bits = float(
                -(c2[rest] * (np.log2(p1[rest // 256]) + np.log2(p1[rest % 256]))).sum()
            )
            top[n][0] += coded_bits(np.append(c2[kept], escaped)) + esc_bits
            top[n][1] += 8 * (3 * n + 2)
            top[n][2] += escaped

    def pp(bits):
        return 100 * bits / units / bits_per_unit

    base = single + single_table
    print(f"{path} {dtype}: {units} units in tensors of >= 64 KiB")
    print(f"  entropy per {chunk} units: singles {h1 / units:.4f}, pairs {h2 / units:.4f} bits/unit")
    print(f"  singles, one table a tensor:  {single / units:.4f} + table {single_table / units:.5f}")
    print(
        f"  pairs, every pair:            {pairs / units:.4f} + table {pairs_table / units:.5f}"
        f"  ({pp(pairs + pairs_table - base):+.3f} pp)"
    )
    for n, (bits, table, escaped) in top.items():
        print(
            f"  pairs, top {n:3d} + escape:     {bits / units:.4f} + table {table / units:.5f}"
            f"  ({pp(bits + table - base):+.3f} pp; {100 * escaped / (units / 2):.3f}% of pairs escape)"
        )


if __name__ == "__main__":
    main()
