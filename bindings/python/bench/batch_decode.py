"""Many GPU-resident blobs: `decompress_tensor` in a loop against one `decompress_tensors` call.

108 bf16 blobs shaped as a small model's layers (35.4 MB decoded), bit-exactness checked, seven
alternating rounds, medians. Run on the device machine by `scripts/gpu_run.sh python`;
docs/BENCHMARKS.md, "Python: many GPU-resident blobs by one `decompress_tensors` call".
"""
import time
import torch
import tensorzip as tz

torch.manual_seed(0)
shapes = [(384, 384)] * 24 + [(384, 1536)] * 12 + [(1536, 384)] * 12 + [(384,)] * 60
ts = [(torch.randn(s) * 0.02).to(torch.bfloat16) for s in shapes]
blobs = [tz.compress_tensor(t).cuda() for t in ts]
nbytes = sum(t.numel() * 2 for t in ts)
def loop():
    return [tz.decompress_tensor(b) for b in blobs]
def batch():
    return tz.decompress_tensors(blobs)
for f in (loop, batch):
    out = f(); torch.cuda.synchronize()
    assert all(torch.equal(o.cpu(), t) for o, t in zip(out, ts))
res = {"loop": [], "batch": []}
for r in range(7):
    for name, f in (("loop", loop), ("batch", batch)):
        torch.cuda.synchronize(); t0 = time.perf_counter(); f(); torch.cuda.synchronize()
        res[name].append(time.perf_counter() - t0)
for name, v in res.items():
    v.sort()
    print(f"{name}: {len(blobs)} blobs, {nbytes/1e6:.1f} MB, median {v[3]*1e3:.2f} ms = {nbytes/v[3]/1e9:.2f} GB/s (range {v[0]*1e3:.2f}-{v[-1]*1e3:.2f} ms)")
