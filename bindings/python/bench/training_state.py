# Run: python bindings/python/bench/training_state.py (needs zipnn; docs/BENCHMARKS.md, "Training state").
# Training state of a small transformer trained for a few hundred steps on a synthetic copy task:
# tensorzip.save vs ZipNN (per tensor, same bytes) vs torch.save, by kind of tensor.
import io, os, tempfile, time, torch, zipnn, tensorzip as tz
from tensorzip import _core
torch.manual_seed(0)
V, D, L, T = 2000, 256, 4, 64
emb = torch.nn.Embedding(V, D)
enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(D, 4, 4 * D, batch_first=True, dropout=0.0), L)
head = torch.nn.Linear(D, V)
model = torch.nn.ModuleDict({"emb": emb, "enc": enc, "head": head})
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
t0 = time.time()
for step in range(300):
    x = torch.randint(0, V, (16, T))
    y = torch.roll(x, 1, dims=1)
    logits = head(enc(emb(x)))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
print(f"trained 300 steps in {time.time()-t0:.0f} s, loss {loss.item():.3f}")
ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 300}
path = os.path.join(tempfile.mkdtemp(), "ckpt.tz")
tz.save(ckpt, path)
buf = io.BytesIO(); torch.save(ckpt, buf)
raw = buf.tell()
kinds = {"weights": [], "exp_avg": [], "exp_avg_sq": []}
for t in model.state_dict().values(): kinds["weights"].append(t)
for s in opt.state_dict()["state"].values():
    kinds["exp_avg"].append(s["exp_avg"]); kinds["exp_avg_sq"].append(s["exp_avg_sq"])
z = zipnn.ZipNN(bytearray_dtype="float32", threads=1)
for k, ts in kinds.items():
    n = sum(t.numel() * 4 for t in ts)
    ours = sum(tz.compress_tensor(t.contiguous()).numel() for t in ts)
    theirs = sum(len(z.compress(bytes(_core.as_bytes(t.contiguous()).numpy()))) for t in ts)
    print(f"{k:11s} {n/1e6:7.2f} MB  tensorzip {ours/n*100:6.2f}%  zipnn {theirs/n*100:6.2f}%")
print(f"whole checkpoint: torch.save {raw/1e6:.2f} MB, tensorzip.save {os.path.getsize(path)/1e6:.2f} MB ({os.path.getsize(path)/raw*100:.2f}%)")
