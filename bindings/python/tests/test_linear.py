"""`CompressedLinear` and `compress_linears` on the CPU: the layer computes exactly what
`torch.nn.Linear` computes with the same weight and bias, survives state_dict / torch.save round
trips and module moves, and refuses weights of the wrong shape and missing weights by name."""

import io
import warnings

import pytest
import torch

import tensorzip as tz
from tensorzip import _core


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_core.as_bytes(a.contiguous()), _core.as_bytes(b.contiguous()))


def linear(n_in, n_out, dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "zero-element tensors" note on empty layers
        layer = torch.nn.Linear(n_in, n_out, bias=bias).to(dtype)
    with torch.no_grad():
        # Weights of a trained layer's spread, so that the coder has something to do.
        layer.weight.copy_((torch.randn(n_out, n_in) * 0.02).to(dtype))
    return layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(256, 384), (1, 1), (7, 33), (0, 5)], ids=str)
def test_compressed_linear_computes_what_linear_computes(dtype, bias, shape):
    lin = linear(shape[1], shape[0], dtype, bias)
    c = tz.CompressedLinear.from_linear(lin)
    assert same(c.dequantize(), lin.weight.detach())
    assert c.weight.shape == lin.weight.shape and c.weight.dtype == dtype
    x = torch.randn(3, 5, shape[1]).to(dtype)
    with torch.no_grad():
        assert same(c(x), lin(x))
    if shape == (256, 384) and dtype == torch.bfloat16:
        # A trained-like bf16 weight codes to about two thirds of its bytes.
        assert c.stored_nbytes < 0.75 * lin.weight.numel() * lin.weight.element_size()
        assert 9 < c.compressed_bits < 12
    # The input's dtype decides the computation's, as F.linear with a cast weight.
    x32 = torch.randn(2, shape[1])
    with torch.no_grad():
        want = torch.nn.functional.linear(x32, lin.weight.float(), None if lin.bias is None else lin.bias.float())
        assert same(c(x32), want)


def test_state_dict_round_trips_through_torch_save():
    model = torch.nn.Sequential(linear(64, 128, torch.bfloat16), torch.nn.ReLU(), linear(128, 16, torch.bfloat16, seed=1))
    x = torch.randn(4, 64).to(torch.bfloat16)
    with torch.no_grad():
        want = model(x)
    assert tz.compress_linears(model) == 2
    assert isinstance(model[0], tz.CompressedLinear) and isinstance(model[2], tz.CompressedLinear)
    sd = model.state_dict()
    assert sorted(sd) == ["0.bias", "0.weight.tensorzip_state", "2.bias", "2.weight.tensorzip_state"]
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    fresh = torch.nn.Sequential(
        tz.CompressedLinear(64, 128), torch.nn.ReLU(), tz.CompressedLinear(128, 16)
    )
    fresh.load_state_dict(loaded)
    with torch.no_grad():
        assert same(fresh(x), want)
    # assign=True keeps the loaded tensors themselves.
    fresh2 = torch.nn.Sequential(tz.CompressedLinear(64, 128), torch.nn.ReLU(), tz.CompressedLinear(128, 16))
    fresh2.load_state_dict(loaded, assign=True)
    assert fresh2[0].weight_state is loaded["0.weight.tensorzip_state"]
    with torch.no_grad():
        assert same(fresh2(x), want)
    # A compressed weight is the same CompressedTensor state as compress() gives.
    c = tz.CompressedTensor.from_state_dict({"tensorzip_state": loaded["2.weight.tensorzip_state"]})
    assert c.shape == (16, 128)


def test_bad_states_and_missing_weights_are_refused():
    lin = tz.CompressedLinear.from_linear(linear(8, 4, torch.float32))
    other = tz.CompressedLinear(8, 5)
    with pytest.raises(RuntimeError, match=r"weight has shape \(4, 8\), but the layer expects \(5, 8\)"):
        other.load_state_dict(lin.state_dict())
    with pytest.raises(RuntimeError, match="weight.tensorzip_state"):
        other.load_state_dict({"bias": torch.zeros(5)})
    with pytest.raises(AttributeError, match="has no weight yet"):
        other(torch.randn(1, 8))
    # No weight yet reads as no attribute (initialisers test for one with hasattr / getattr).
    assert not hasattr(other, "weight") and getattr(other, "weight", None) is None
    with pytest.raises(AttributeError, match=r"CompressedLinear\(8, 5\) has no weight yet"):
        other.weight
    bad = dict(lin.state_dict())
    bad["weight.tensorzip_state"] = bad["weight.tensorzip_state"][:10].clone()
    with pytest.raises(RuntimeError, match="truncated"):
        tz.CompressedLinear(8, 4).load_state_dict(bad)
    with pytest.raises(ValueError, match="not materialized"):
        tz.CompressedLinear.from_linear(torch.nn.Linear(4, 4, device="meta"))
    with pytest.raises(ValueError, match="expects"):
        tz.CompressedLinear(3, 3).compress_weight(torch.zeros(3, 4))
    # A damaged blob inside an intact state header is refused when loaded: the state records the
    # blob's CRC-32 (a bare blob has none; payload flips used to decode to other values). Every
    # byte of the blob, one bit each.
    good = lin.state_dict()["weight.tensorzip_state"]
    start = good.numel() - lin.weight.storage_nbytes(include_header=False)
    for i in range(start, good.numel()):
        state = good.clone()
        state[i] ^= 1 << (i % 8)
        with pytest.raises(RuntimeError, match="CRC-32"):
            tz.CompressedLinear(8, 4, dtype=torch.float32).load_state_dict({"weight.tensorzip_state": state, "bias": lin.bias.detach()})
    # A dense checkpoint (nn.Linear's `weight`) is compressed into the layer, strict or not.
    dense = torch.nn.Linear(8, 4)
    other = tz.CompressedLinear(8, 4, dtype=torch.float32)
    other.load_state_dict(dense.state_dict(), strict=False)
    assert same(other.dequantize(), dense.weight.detach()) and same(other.bias, dense.bias.detach())
    with pytest.raises(TypeError, match="floating-point input"):
        other(torch.ones(1, 8, dtype=torch.int64))


def test_module_moves_and_casts_keep_the_weight():
    lin = linear(32, 16, torch.float32)
    c = tz.CompressedLinear.from_linear(lin, dtype=torch.bfloat16)
    assert c.weight.dtype == torch.bfloat16 and "dtype=bfloat16" in repr(c) and "bits=" in repr(c)
    assert same(c.dequantize(), lin.weight.detach().to(torch.bfloat16))
    before = c.weight_state
    c = c.to(torch.float16)  # the bias is cast; the compressed weight stays as it is
    assert c.weight_state is before and c.bias.dtype == torch.float16
    x = torch.randn(2, 32).to(torch.float16)
    with torch.no_grad():
        want = torch.nn.functional.linear(x, lin.weight.detach().to(torch.bfloat16).to(torch.float16), c.bias)
        assert same(c(x), want)
    # A state assigned from outside is read again (not the old header).
    c2 = tz.CompressedLinear.from_linear(linear(32, 16, torch.float32, seed=3))
    c.weight_state = c2.weight_state
    assert same(c.dequantize(), c2.dequantize())


def test_compress_linears_filter_and_subclasses():
    class Custom(torch.nn.Linear):
        pass

    model = torch.nn.ModuleDict(
        {"a": linear(8, 8, torch.float32), "b": torch.nn.Sequential(linear(8, 8, torch.float32)), "c": Custom(8, 8)}
    )
    n = tz.compress_linears(model, filter=lambda name, layer: name != "a")
    assert n == 1
    assert type(model["a"]) is torch.nn.Linear
    assert isinstance(model["b"][0], tz.CompressedLinear)
    assert type(model["c"]) is Custom
    assert tz.compress_linears(linear(4, 4, torch.float32)) == 0
    # RawConfig stores the weight; the layer still computes the same.
    lin = linear(16, 16, torch.float32)
    raw = tz.CompressedLinear.from_linear(lin, config=tz.RawConfig())
    assert raw.weight.compress_method == "raw"
    assert same(raw.dequantize(), lin.weight.detach())


def test_compress_linears_tied_layers_and_all_or_nothing():
    # One Linear under two names (tied): one CompressedLinear in both places, counted once.
    shared = linear(8, 8, torch.float32)
    model = torch.nn.ModuleDict({"enc": shared, "dec": shared, "own": linear(8, 4, torch.float32)})
    x = torch.randn(3, 8)
    want = {k: model[k](x) for k in model}
    assert tz.compress_linears(model) == 2
    assert model["enc"] is model["dec"] and isinstance(model["enc"], tz.CompressedLinear)
    assert all(same(model[k](x), want[k]) for k in model)
    # A layer that cannot be compressed (a weight not materialized) leaves the module untouched.
    with torch.device("meta"):
        ghost = torch.nn.Linear(8, 8)
    model = torch.nn.Sequential(linear(8, 8, torch.float32), ghost)
    with pytest.raises(ValueError, match="materialized"):
        tz.compress_linears(model)
    assert type(model[0]) is torch.nn.Linear and model[1] is ghost



def test_compress_linears_keeps_tied_weights_hooks_and_mode():
    """A Linear whose weight another module holds (an lm_head tied to the embedding) or that has
    hooks is left as it is, with a warning naming it (replacing it untied the weights, stored
    them twice, and dropped the hooks); the replaced layers keep the module's train/eval mode."""
    emb = torch.nn.Embedding(10, 8)
    head = torch.nn.Linear(8, 10, bias=False)
    head.weight = emb.weight
    hooked = linear(8, 8, torch.float32)
    calls = []
    hooked.register_forward_hook(lambda mod, inp, out: calls.append(1))
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "hooked": hooked, "plain": linear(8, 4, torch.float32)})
    model.eval()
    with pytest.warns(UserWarning) as record:
        assert tz.compress_linears(model) == 1
    messages = " | ".join(str(w.message) for w in record)
    assert "head left uncompressed: its weight is tied" in messages
    assert "hooked left uncompressed: it has hooks" in messages
    assert model["head"] is head and model["head"].weight is model["emb"].weight
    assert model["hooked"] is hooked
    model["hooked"](torch.randn(1, 8))
    assert calls == [1]
    assert isinstance(model["plain"], tz.CompressedLinear) and not model["plain"].training


def test_sizes_must_be_integers():
    """As nn.Linear: 1.5 and True are refused (they were made 1), NumPy integers taken."""
    for bad in (1.5, True, "3", None):
        with pytest.raises(TypeError, match="in_features"):
            tz.CompressedLinear(bad, 4)
        with pytest.raises(TypeError, match="out_features"):
            tz.CompressedLinear(4, bad)
    lin = tz.CompressedLinear(torch.tensor(3).item(), 2)
    assert (lin.in_features, lin.out_features) == (3, 2)
    try:
        import numpy as np
    except ImportError:
        return
    lin = tz.CompressedLinear(np.int64(3), np.int32(2))
    assert (lin.in_features, lin.out_features) == (3, 2) and type(lin.in_features) is int
