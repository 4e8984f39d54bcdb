#!/usr/bin/env python3
"""Attributes an ncu source-counter profile of a kernel to the lines and functions of its source,
crates/tensorzip-cuda/kernels/decode.cu, encode.cu or search.cu (run here, on the files `scripts/gpu_run.sh
profile` wrote).

    scripts/ncu_lines.py SASS_CSV DISASM KERNEL [LINES]

SASS_CSV: `ncu --page source --csv --print-source sass` of one launch of KERNEL (e.g. tz_decode_2e8);
DISASM: `nvdisasm -g -c` of the cubin holding it (its `//## File ..., line N` comments map each
instruction offset to a line of the compiled source, which is kernels/smem.cuh followed by
decode.cu, or encode.cu for `tz_encode*`, `tz_hist*`, `tz_compact` and `tz_crc32`). Prints each function's share of the executed warp instructions and of the warp stall
samples, then the LINES (default 40) heaviest lines. Inlined code is booked to its innermost line
(a lookup inside the lean step counts as `lookup_cached`).
"""
import collections
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "crates/tensorzip-cuda/kernels"


def main():
    sass_csv, disasm, kernel = sys.argv[1:4]
    n_lines = int(sys.argv[4]) if len(sys.argv) > 4 else 40
    prefix = len((KERNELS / "smem.cuh").read_text().splitlines())
    name = "decode.cu" if kernel.startswith(("tz_decode", "tz_build_tables", "tz_copy")) else "encode.cu"
    if kernel.startswith(("tz_search", "tz_enc_tables")):
        # The search's unit is search.cu alone (no smem.cuh in front).
        name, prefix = "search.cu", 0
    src = (KERNELS / name).read_text().splitlines()

    # Instruction offset -> line of the .cu file (<= 0: a line of smem.cuh), for KERNEL's section only.
    off_line, cur, inside = {}, None, False
    for l in Path(disasm).read_text().splitlines():
        if l.startswith(".text."):
            inside = l.strip() == f".text.{kernel}:"
            continue
        if not inside:
            continue
        m = re.search(r'//## File ".*", line (\d+)', l)
        if m:
            cur = int(m.group(1)) - prefix
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/", l)
        if m:
            off_line[int(m.group(1), 16)] = cur
    if not off_line:
        sys.exit(f"{disasm}: no section .text.{kernel}")

    rows = list(csv.reader(open(sass_csv)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], [r for r in rows[head + 1:] if r and r[0].startswith("0x")]
    ia, ie = hdr.index("Address"), hdr.index("Instructions Executed")
    iss = hdr.index("Warp Stall Sampling (All Samples)")
    base = int(data[0][ia], 16)

    # The function each line of the .cu file belongs to: the last definition at or above it.
    starts = []
    for i, l in enumerate(src, 1):
        m = re.search(r"(\w+)\s*\(", l)
        if m and ("__device__" in l or "__global__" in l or l.startswith("ENTRY")):
            starts.append((i, m.group(1)))

    def func(line):
        if line is None or line < 1:
            return "(smem.cuh accessors)"
        name = "(before any function)"
        for i, n in starts:
            if i > line:
                break
            name = n
        return name

    ins, smp = collections.Counter(), collections.Counter()
    for r in data:
        line = off_line.get(int(r[ia], 16) - base)
        ins[line] += int(r[ie] or 0)
        smp[line] += int(r[iss] or 0)
    ti, ts = sum(ins.values()), max(sum(smp.values()), 1)
    fi, fs = collections.Counter(), collections.Counter()
    for line in ins:
        fi[func(line)] += ins[line]
        fs[func(line)] += smp[line]
    print(f"{kernel}: {ti} warp instructions executed, {ts} stall samples")
    for f, n in fi.most_common():
        print(f"  {f:28s} instructions {100 * n / ti:5.1f}%   samples {100 * fs[f] / ts:5.1f}%")
    print()
    for line, n in ins.most_common(n_lines):
        text = src[line - 1].strip()[:88] if line and 0 < line <= len(src) else ""
        print(f"{line!s:>6} {100 * n / ti:5.1f}%  samples {100 * smp[line] / ts:5.1f}%  {func(line):18s} {text}")


if __name__ == "__main__":
    main()
