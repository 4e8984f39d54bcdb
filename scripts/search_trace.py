#!/usr/bin/env python3
"""The table search's steps timed by clock64 (docs/BENCHMARKS.md, "Where the table search's time
goes, step by step"): a development tool, two commands.

    scripts/search_trace.py make OUT.cu
        Writes a copy of crates/tensorzip-cuda/kernels/search.cu in which thread 0 of each
        `tz_search` block reads the SM's cycle counter after each block-wide step of `cluster` and
        prints one `TZT ...` line per block at the kernel's end. Run it on the GPU through the
        kernel-source switch, e.g.
            TENSORZIP_DEV_TZ_SEARCH_SRC=OUT.cu ./gpu-bin/gpu_bench synth bf16 8 2 > trace.txt
        (device printf goes to stdout). The timed copy computes what the kernel computes (the
        blobs stay equal to the CPU's); only the printing and the counters are added.

    scripts/search_trace.py summary TRACE.txt
        Medians of every step over the blocks, those that kept tables (the planes the attempts
        run on) apart from those that kept none, in thousands of cycles.

The copy is made by inserting lines after fixed anchors of the source; an anchor that the source
no longer has stops the script with its text, to be updated with the kernel.
"""
import statistics
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "crates/tensorzip-cuda/kernels/search.cu"

# (step name, the anchor after which its counter is read). In `cluster`, in source order; the
# counter books the cycles since the previous reading to the step, so a step is what ran between
# its anchor and the previous one (an attempt that ends early books its barrier to the next step).
STEPS = [
    ("flags", "    if (nb == 0 || !not_all_raw) return 0;\n"),
    ("rows", "        if (!cl_any(cl, coded)) return 0;\n    }\n"),
    ("t0", "    u64 attempt = 0;\n"),
    ("seed", "        const bool own_seed = seed_owner == cl.rank;\n"),
    ("cand", "            copy_bank(L, cur, tr, nt, nb, threadIdx.x - 32, NT - 32);\n        }\n"
     "        __syncthreads();\n"),
    ("col", "        column(sh, L, tr, nt, nb);\n        u32 tn = nt + 1;\n"),
    ("merge", "                L.cc[tr][b] = raw_cost(L.lens[b]);\n            }\n        }\n"
     "        __syncthreads();\n"),
    ("sums", "            if (threadIdx.x == 0) sh.ndirty = 0;\n            __syncthreads();\n"),
    ("norm", "                if (lane == 0) L.fromv[tr][j] = 1;\n            }\n"
     "            __syncthreads();\n"),
    ("cols", "            least_and_choice(L, tr, tn, nb, thr);\n        }\n"),
    ("accept", "        cur = tr;\n        nt = tn;\n"
     "        for (u32 b = L.b0 + threadIdx.x; b < L.b1; b += NT) L.rej[b] = 0;\n        __syncthreads();\n"),
    ("final", "    if (threadIdx.x == 0) ((u32*)out)[3] = at;\n    __syncthreads();\n"),
]
# Counter slots: 0..len(STEPS) the steps, then attempts, tables kept, support size, blocks.
ATT, NT_, NS, NB = 15, 12, 13, 14

HEAD = """
__shared__ unsigned long long tz_t[16];
__shared__ unsigned long long tz_last;
#define TZ_T(k) do { if (threadIdx.x == 0) { unsigned long long _n = clock64(); \\
    tz_t[k] += _n - tz_last; tz_last = _n; } } while (0)
"""


def insert_after(src, anchor, text):
    if src.count(anchor) != 1:
        sys.exit(f"search.cu has {src.count(anchor)} copies of the anchor (1 expected):\n{anchor}")
    at = src.index(anchor) + len(anchor)
    return src[:at] + text + src[at:]


def make(out):
    src = SRC.read_text()
    src = insert_after(src, "// ---- the job's scratch ----\n", HEAD)
    src = insert_after(
        src,
        "__device__ u32 cluster(Shared& sh, Cl& cl, const SearchJob& job, Layout& L, u32 max_tables,"
        " u32 thr, u8* out) {\n",
        "    if (threadIdx.x == 0) { for (int q = 0; q < 16; q++) tz_t[q] = 0; tz_last = clock64(); }\n",
    )
    for k, (name, anchor) in enumerate(STEPS):
        extra = f" if (threadIdx.x == 0) tz_t[{ATT}]++;" if name == "seed" else ""
        if name == "final":
            extra = (f" if (threadIdx.x == 0) {{ tz_t[{NB}] = nb; tz_t[{NS}] = ns;"
                     f" tz_t[{NT_}] = nt; }}")
        indent = anchor[: len(anchor) - len(anchor.lstrip())]
        src = insert_after(src, anchor, f"{indent}TZ_T({k});{extra}\n")
    src = insert_after(
        src,
        "        to_arena(L, L.rej, n);\n    }\n    __syncthreads();\n",
        "    if (threadIdx.x == 0) { for (int q = 0; q < 16; q++) tz_t[q] = 0; }\n"
        "    __syncthreads();\n    unsigned long long tz_c0 = clock64();\n",
    )
    src = insert_after(
        src,
        "    u32 kept = cluster(sh, cl, job, L, params.max_tables, params.threshold, out);\n",
        "    unsigned long long tz_c1 = clock64();\n",
    )
    fields = " ".join(f"{n} %llu" for n, _ in STEPS)
    values = ", ".join(f"tz_t[{k}]" for k in range(len(STEPS)))
    src = insert_after(
        src,
        "    if (kept == 0 && job.joint != 0) conditional(sh, cl, job, out);\n",
        "    __syncthreads();\n"
        "    if (threadIdx.x == 0 && cl.rank == 0) {\n"
        "        unsigned long long tz_c2 = clock64();\n"
        f'        printf("TZT blk %d kept %u nb %llu ns %llu nt %llu att %llu total %llu cluster %llu'
        f' cond %llu {fields}\\n",\n'
        f"            blockIdx.x, kept, tz_t[{NB}], tz_t[{NS}], tz_t[{NT_}], tz_t[{ATT}],"
        " tz_c2 - tz_c0, tz_c1 - tz_c0, tz_c2 - tz_c1,\n"
        f"            {values});\n"
        "    }\n",
    )
    Path(out).write_text(src)


def summary(path):
    rows = []
    for line in Path(path).read_text().splitlines():
        if not line.startswith("TZT "):
            continue
        t = [x for x in line.split()[1:] if x != "|"]
        rows.append({t[i]: int(t[i + 1]) for i in range(0, len(t) - 1, 2)})
    if not rows:
        sys.exit(f"{path}: no TZT lines")
    keys = ["total", "cluster", "cond"] + [n for n, _ in STEPS]
    for label, part in (("kept tables", [r for r in rows if r["kept"] > 0]),
                        ("kept none", [r for r in rows if r["kept"] == 0])):
        if not part:
            continue
        head = {k: statistics.median(r[k] for r in part) for k in ("ns", "nt", "att")}
        print(f"{label}: {len(part)} blocks, median support {head['ns']:.0f} symbols, "
              f"{head['nt']:.0f} tables, {head['att']:.0f} attempts (k cycles)")
        for k in keys:
            print(f"  {k:8} {statistics.median(r[k] for r in part) / 1e3:9.1f}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
