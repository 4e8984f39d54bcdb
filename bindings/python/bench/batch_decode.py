"""Many blobs: `decompress_tensor` in a loop against one `decompress_tensors` call.

108 bf16 blobs shaped as a small model's layers (35.4 MB decoded), bit-exactness checked, seven
alternating rounds, medians. `python batch_decode.py` decodes GPU-resident blobs on the GPU (run on
the device machine by `scripts/gpu_run.sh python`); `python batch_decode.py cpu` decodes host
blobs on the CPU. docs/BENCHMARKS.md, "Python: many GPU-resident blobs by one
`decompress_tensors` call".
"""
import sys
import time

import torch

import tensorzip as tz

on_cpu = sys.argv[1:] == ["cpu"]
sync = (lambda: None) if on_cpu else torch.cuda.synchronize
torch.manual_seed(0)
shapes = [(384, 384)] * 24 + [(384, 1536)] * 12 + [(1536, 384)] * 12 + [(384,)] * 60
ts = [(torch.randn(s) * 0.02).to(torch.bfloat16) for s in shapes]
blobs = [tz.compress_tensor(t) if on_cpu else tz.compress_tensor(t).cuda() for t in ts]
device = "cpu" if on_cpu else None
nbytes = sum(t.numel() * 2 for t in ts)


def loop():
    return [tz.decompress_tensor(b, device=device) for b in blobs]


def batch():
    return tz.decompress_tensors(blobs, device=device)


for f in (loop, batch):
    out = f()
    sync()
    assert all(torch.equal(o.cpu(), t) for o, t in zip(out, ts))
res = {"loop": [], "batch": []}
for r in range(7):
    for name, f in (("loop", loop), ("batch", batch)):
        sync()
        t0 = time.perf_counter()
        f()
        sync()
        res[name].append(time.perf_counter() - t0)
for name, v in res.items():
    v.sort()
    print(f"{name} ({'CPU' if on_cpu else 'GPU'}): {len(blobs)} blobs, {nbytes/1e6:.1f} MB, median {v[3]*1e3:.2f} ms = "
          f"{nbytes/v[3]/1e9:.2f} GB/s (range {v[0]*1e3:.2f}-{v[-1]*1e3:.2f} ms)")
