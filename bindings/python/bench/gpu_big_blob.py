"""A GPU-resident blob whose prefix (header, tables, directory) is longer than 64 KiB: times
`decompress_tensor`, `blob_info` and `decompress_tensors` of the blob of a 1 GiB bf16 tensor (a
~98 KiB directory), seven rounds, medians. Usage: `python gpu_big_blob.py LABEL` on a machine with
CUDA (docs/BENCHMARKS.md, "A GPU blob's prefix read to its length")."""
import sys
import time

import torch
import tensorzip as tz

torch.manual_seed(0)
t = (torch.randn(512 * 1024 * 1024, device="cuda") * 0.02).to(torch.bfloat16)
blob = tz.compress_tensor(t)
blob = blob.cuda() if blob.device.type != "cuda" else blob
print("blob", blob.numel(), "bytes on", blob.device)
out = tz.decompress_tensor(blob); torch.cuda.synchronize()
assert torch.equal(out, t)
del out
res = {"decompress_tensor": [], "blob_info": [], "decompress_tensors": []}
for r in range(7):
    for name, f in (("decompress_tensor", lambda: tz.decompress_tensor(blob)),
                    ("blob_info", lambda: tz.blob_info(blob)),
                    ("decompress_tensors", lambda: tz.decompress_tensors([blob]))):
        torch.cuda.synchronize(); t0 = time.perf_counter(); x = f(); torch.cuda.synchronize()
        res[name].append(time.perf_counter() - t0); del x
for name, v in res.items():
    v.sort()
    print(f"{sys.argv[1]} {name}: median {v[3]*1e3:.2f} ms (range {v[0]*1e3:.2f}-{v[-1]*1e3:.2f})")
