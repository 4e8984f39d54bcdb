#!/usr/bin/env python3
"""GPU side of the benchmark (run on the device machine by scripts/gpu_run.sh).

  gpu_anchors.py gen DIR        write DIR/synth-bf16.safetensors and DIR/synth-f32.safetensors:
                                1 GiB each, 8192x8192 tensors of randn * 0.02 * exp(0.3 * randn(rows, 1))
                                (torch, seeded), so that tensorzip and the anchors see the same bytes
  gpu_anchors.py run FILE...    time the anchors on every tensor of each file (whole tensors, on the
                                GPU): cuZipNN 0.1.0 (decode of a GPU-resident blob; pinned host round
                                trip), EntroPack 0.1.5 tile-ANS and DFloat11 (execution_backend="cuda",
                                device-resident). One JSON line per tool and file.
  gpu_anchors.py table JSONL    print the markdown table of tensorzip's and the anchors' lines

Timing: CUDA-synchronised wall clock, median of RUNS (default 5) after one warm-up call; GB/s of
original bytes. The anchors' packages come from ../shared/anchor-wheels (installed with
--no-deps into a private site directory by gpu_run.sh).
"""

import json
import logging
import os
import statistics
import struct
import sys
import time
import warnings

RUNS = int(os.environ.get("RUNS", "5"))
GIB = 1 << 30


def write_safetensors(path, tensors):
    """A minimal safetensors writer: header JSON (8-byte length), then the tensors' bytes."""
    import torch

    header, offset, blobs = {}, 0, []
    names = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}
    for name, t in tensors:
        b = t.contiguous().view(torch.uint8).cpu().numpy().tobytes()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    import torch

    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    dt = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16}
    out = []
    for name, e in header.items():
        if name == "__metadata__" or e["dtype"] not in dt:
            continue
        a, b = e["data_offsets"]
        raw = torch.frombuffer(bytearray(data[8 + n + a : 8 + n + b]), dtype=torch.uint8)
        out.append((name, raw.view(dt[e["dtype"]]).reshape(e["shape"])))
    return out


def gen(d):
    import torch

    os.makedirs(d, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(20261130)
    for dtype, label, n in [(torch.bfloat16, "bf16", 8), (torch.float32, "f32", 4)]:
        ts = []
        for i in range(n):
            x = torch.randn(8192, 8192, device="cuda", generator=g)
            x *= 0.02 * torch.exp(0.3 * torch.randn(8192, 1, device="cuda", generator=g))
            ts.append((f"layer{i}.weight", x.to(dtype)))
        write_safetensors(os.path.join(d, f"synth-{label}.safetensors"), ts)
        print(f"wrote {d}/synth-{label}.safetensors", file=sys.stderr)


def timed(fn):
    import torch

    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(RUNS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def run(files):
    import torch

    for path in files:
        tensors = [(n, t.cuda()) for n, t in read_safetensors(path)]
        orig = sum(t.numel() * t.element_size() for _, t in tensors)
        name = os.path.basename(path)

        def emit(tool, **kw):
            print(json.dumps({"tool": tool, "file": name, "original_bytes": orig, "tensors": len(tensors), **kw}), flush=True)

        try:
            import cuzipnn

            blobs = [cuzipnn.compress_tensor(t, pin_memory=True) for _, t in tensors]
            comp = sum(b.numel() for b in blobs)
            dev_blobs = [b.cuda() for b in blobs]
            for a, b in zip(dev_blobs, tensors):
                assert torch.equal(cuzipnn.decompress_tensor(a, device="cuda").view(torch.uint8), b[1].view(torch.uint8))
            t_c = timed(lambda: [cuzipnn.compress_tensor(t, pin_memory=True) for _, t in tensors])
            t_d = timed(lambda: [cuzipnn.decompress_tensor(b, device="cuda") for b in dev_blobs])
            pinned = [b.pin_memory() for b in blobs]
            outs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for _, t in tensors]

            def round_trip():
                for b, o in zip(pinned, outs):
                    o.copy_(cuzipnn.decompress_tensor(b, device="cuda"), non_blocking=True)

            t_p = timed(round_trip)
            emit("cuzipnn 0.1.0", ratio=comp / orig, compress_gbps_to_pinned_host=orig / t_c / 1e9,
                 decode_resident_gbps=orig / t_d / 1e9, pinned_round_trip_decode_gbps=orig / t_p / 1e9)
        except Exception as e:  # an anchor failing is reported, not fatal
            emit("cuzipnn 0.1.0", error=f"{type(e).__name__}: {e}")

        try:
            import entropack as ep

            for label, cfg in [("entropack 0.1.5 tile-ANS", ep.TileANSConfig(execution_backend="cuda")),
                               ("entropack 0.1.5 DFloat11", ep.DFloat11Config(execution_backend="cuda"))]:
                if "DFloat11" in label and any(t.dtype != torch.bfloat16 for _, t in tensors):
                    continue
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        cts = [ep.compress(t, cfg) for _, t in tensors]
                    raw = [c for c in cts if c.compress_method == "raw"]
                    if raw:
                        # EntroPack stores a tensor raw when its encoder fails (it logs why).
                        emit(label, error=f"stored {len(raw)} of {len(cts)} tensors raw (encoder failed; see the log above)")
                        continue
                    comp = sum(c.storage_nbytes() for c in cts)
                    for c, (_, t) in zip(cts, tensors):
                        assert torch.equal(ep.decompress(c, cfg).view(torch.uint8), t.view(torch.uint8))
                    t_c = timed(lambda: [ep.compress(t, cfg) for _, t in tensors])
                    t_d = timed(lambda: [ep.decompress(c, cfg) for c in cts])
                    emit(label, ratio=comp / orig, encode_resident_gbps=orig / t_c / 1e9, decode_resident_gbps=orig / t_d / 1e9)
                except Exception as e:
                    emit(label, error=f"{type(e).__name__}: {e}")
        except Exception as e:
            emit("entropack 0.1.5", error=f"{type(e).__name__}: {e}")
        del tensors
        torch.cuda.empty_cache()


def table(path):
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    print("| data | tool | ratio | encode GB/s (device-resident) | encode GB/s (pinned host) | decode GB/s (device-resident) | pinned round trip decode GB/s |")
    print("|---|---|---|---|---|---|---|")
    f = lambda v: "—" if v is None else f"{v:.1f}"
    for r in rows:
        if "error" in r:
            print(f"| {r.get('file', r.get('dataset'))} | {r['tool']} | error: {r['error'][:80]} | | | | |")
            continue
        enc = r.get("encode_resident_gbps")
        # cuZipNN: GPU tensor -> blob in pinned host memory; tensorzip: host tensor -> GPU -> blob on host.
        enc_pin = r.get("compress_gbps_to_pinned_host", r.get("pinned_round_trip_encode_gbps"))
        dec = r.get("decode_resident_gbps", r.get("decode_resident_with_planning_gbps"))
        kern = r.get("decode_kernel_gbps")
        call = r.get("decode_call_gbps")
        # tensorzip: from the device copy alone (prefixes read back and parsed); the batch call
        # with the layouts known; the kernel alone.
        dec_s = f(dec) + (f" (call {call:.1f})" if call else "") + (f" (kernel {kern:.1f})" if kern else "")
        eq = " (GPU blobs = CPU blobs)" if r.get("encode_equal_cpu") else ""
        print(f"| {r.get('file', r.get('dataset'))} | {r['tool']} | {100 * r['ratio']:.2f}% | {f(enc)}{eq} | {f(enc_pin)} | {dec_s} | {f(r.get('pinned_round_trip_decode_gbps'))} |")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "gen":
        gen(sys.argv[2])
    elif cmd == "run":
        run(sys.argv[2:])
    elif cmd == "table":
        table(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)
