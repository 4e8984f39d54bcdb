"""`save` / `load`: training state (an optimizer's state_dict, a checkpoint dictionary) in an
archive without pickle — structure, values and tensor sharing come back; anything that is not
plain data is refused by path; damaged structures raise ValueError naming the file."""

import json
import math

import pytest
import torch

import tensorzip as tz
from tensorzip import _core


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_core.as_bytes(a.contiguous()), _core.as_bytes(b.contiguous()))


def equal(a, b) -> bool:
    """Deep equality with tensors compared bit for bit and types kept (tuple is not list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return same(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def trained():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(32, 64)).square().mean().backward()
        opt.step()
    return model, opt


def test_a_checkpoint_round_trips(tmp_path):
    model, opt = trained()
    ckpt = {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": 3,
        "loss": 0.25,
        "odd": [float("nan"), float("inf"), -0.0, None, True, "text", (1, (2, "x"))],
        "by_int": {0: "a", 1.5: "b", (1, "k"): "c", None: "d", False: "e"},
        "rng": torch.get_rng_state(),
        "scalar": torch.tensor(7.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "half": torch.randn(33, 17).to(torch.bfloat16),
    }
    tz.save(ckpt, tmp_path / "ckpt.tz")
    back = tz.load(tmp_path / "ckpt.tz")
    assert equal(back, ckpt)
    # A state_dict's module versions come back too (load_state_dict passes them on).
    assert back["model"]._metadata == ckpt["model"]._metadata
    # The optimizer takes its state back and steps on exactly as the original would: a copy of
    # the model with the loaded state and the original take one more step on the same batch and
    # end with the same parameters, bit for bit.
    model2 = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
    model2.load_state_dict(back["model"])
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3, betas=(0.9, 0.95))
    opt2.load_state_dict(back["optimizer"])
    assert opt2.state_dict()["param_groups"][0]["betas"] == (0.9, 0.95)
    x = torch.randn(32, 64)
    for m, o in ((model, opt), (model2, opt2)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
    for p1, p2 in zip(model.parameters(), model2.parameters()):
        assert same(p1.detach(), p2.detach())
    # The archive is an ordinary one: the tensors are named by their path.
    with tz.safe_open(tmp_path / "ckpt.tz") as f:
        keys = f.keys()
    assert "optimizer.state.0.exp_avg_sq" in keys and "model.0.weight" in keys


def test_shared_tensors_stay_shared(tmp_path):
    w = torch.randn(50, 20)
    obj = {"embed": w, "lm_head": w, "view": w[10:20], "again": [w]}
    tz.save(obj, tmp_path / "t.tz")
    with tz.safe_open(tmp_path / "t.tz") as f:
        assert sorted(f.keys()) == ["embed", "view"]  # the view overlaps: a copy of its own
    back = tz.load(tmp_path / "t.tz")
    assert back["embed"] is back["lm_head"] and back["again"][0] is back["embed"]
    assert same(back["view"], w[10:20])


def test_what_cannot_be_saved_is_refused_by_path(tmp_path):
    for obj, where in [
        ({"a": {"b": [1, object()]}}, "a.b.1"),
        ({"a": {frozenset(): 1}}, "a: a dict key"),
        ({"s": {1, 2}}, "s: an object of type set"),
        ({"x": torch.randn(4, 4).to_sparse()}, "x: only strided"),
    ]:
        with pytest.raises(TypeError, match=where):
            tz.save(obj, tmp_path / "bad.tz")
        assert not (tmp_path / "bad.tz").exists()
    deep = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^0\.0\.0\.\(251 more\)\.0\.0\.0: nested more than 256"):
        tz.save(deep, tmp_path / "bad.tz")
    # A cycle, an int past the text limit, a lone surrogate, a key nested too deep: refused by
    # path, not with the json module's or the recursion limit's messages.
    cyclic: list = [1]
    cyclic.append({"again": cyclic})
    key = ()
    for _ in range(300):
        key = (key,)
    for obj, where in [
        (cyclic, "1.again: the structure contains itself"),
        ({"n": 10**5000}, "n: an int of"),
        ({"\ud800": torch.zeros(1)}, "a str that is not valid Unicode"),
        ({"s": "\udfff"}, "s: a str that is not valid Unicode"),
        ({key: 1}, "a dict key nested more than"),
    ]:
        with pytest.raises(ValueError, match=where):
            tz.save(obj, tmp_path / "bad.tz")
        assert not (tmp_path / "bad.tz").exists()
    with pytest.raises(TypeError, match="metadata= is not accepted"):
        tz.save({"a": 1}, tmp_path / "bad.tz", metadata={"x": "y"})


def test_damaged_structures_and_plain_archives_raise(tmp_path):
    t = torch.randn(8)
    tz.save_file({"t": t}, tmp_path / "plain.tz")
    with pytest.raises(ValueError, match="not written by tensorzip.save"):
        tz.load(tmp_path / "plain.tz")
    for doc in [
        "{not json",
        json.dumps({"version": 2, "tree": None}),
        json.dumps({"version": 1, "tree": {"t": "missing"}}),
        json.dumps({"version": 1, "tree": {"d": [[[1, 2], 3]]}}),
        json.dumps({"version": 1, "tree": {"l": 5}}),
        json.dumps({"version": 1}),
        "[" * 100000 + "]" * 100000,
    ]:
        tz.save_file({"t": t}, tmp_path / "d.tz", {"tensorzip.object": doc})
        with pytest.raises(ValueError, match="d.tz"):
            tz.load(tmp_path / "d.tz")


def test_conjugate_views_and_the_metadata_key(tmp_path):
    # `z.conj()` shares z's storage, shape and strides but holds other values: not a reference.
    z = torch.randn(6, 5, dtype=torch.complex64)
    obj = {"z": z, "zc": z.conj(), "neg": z.imag, "negc": z.conj().imag, "__metadata__": torch.ones(3)}
    tz.save(obj, tmp_path / "c.tz")
    back = tz.load(tmp_path / "c.tz")
    assert torch.equal(back["zc"], z.conj().resolve_conj())
    assert torch.equal(back["negc"], z.conj().imag.resolve_neg())
    assert torch.equal(back["neg"], z.imag)
    assert torch.equal(back["__metadata__"], torch.ones(3))


def test_a_damaged_entry_names_the_file(tmp_path):
    tz.save({"a": 1.0}, tmp_path / "ok.tz")
    for tree in ({"f": "not a float"}, {"d": [[{"f": "x"}, 1]]}):
        doc = json.dumps({"version": 1, "tree": tree})
        tz.save_file({}, tmp_path / "bad.tz", {"tensorzip.object": doc})
        with pytest.raises(ValueError, match="bad.tz"):
            tz.load(tmp_path / "bad.tz")
