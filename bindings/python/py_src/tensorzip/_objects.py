"""`save(obj, path)` / `load(path)`: training state — an optimizer's `state_dict()`, a checkpoint
dictionary of model, optimizer, step and RNG state — in a tensorzip archive, without pickle.

`torch.save` pickles, and unpickling runs code; `torch.load(weights_only=True)` limits what it
builds. Here nothing is pickled: `obj` may hold dicts (keys of None, bool, int, float, str or
tuples of them), lists, tuples, None, bool, int, float, str and tensors, nested to any depth;
anything else is refused naming where it is. The tensors go into the archive as `save_file` writes
it (one safetensors-layout file, `tensorzip decompress` restores it to a `.safetensors` file),
named by their path in `obj` (`state.0.exp_avg`); the structure around them is JSON in the
header's `__metadata__` under the key `tensorzip.object`. Several references to one tensor (tied
weights: the same storage, offset, shape, strides and dtype) are saved once and loaded as one
tensor in each place; tensors that merely overlap are saved as copies each. An `OrderedDict`
comes back as one, with its `_metadata` (a module `state_dict`'s per-module versions, which
`load_state_dict` passes on; it must be plain data like the rest). Subclasses of the plain types
are saved as their base type and come back as it: a namedtuple or `torch.Size` as a tuple, a
`defaultdict` as a dict, an `IntEnum` as an int. `requires_grad` and tensor subclasses
(`Parameter`) are not kept: tensors come back plain.
"""

from __future__ import annotations

import json
import math
import os
from collections import OrderedDict

import torch

from . import _core
from ._files import _load_all, safe_open, save_file

_KEY = "tensorzip.object"
_VERSION = 1
_MAX_DEPTH = 256


def _name(path: list[str], taken: set[str]) -> str:
    base = ".".join(path) or "tensor"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}#{n}"
    taken.add(name)
    return name


def _check_scalar(x, where: str) -> None:
    """Refuses, naming `where`, what JSON cannot hold or a load could not read back: an int past
    Python's int-to-text limit, a str that is not valid Unicode (a lone surrogate)."""
    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 10_000:
        raise ValueError(f"{where}: an int of {x.bit_length()} bits cannot be saved (at most 10,000)")
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"{where}: a str that is not valid Unicode cannot be saved ({e.reason})") from None


def _where(path: list[str]) -> str:
    """A position in the saved object for messages: its path, the middle left out when deep (a
    structure nested 256 deep gave an error message of hundreds of characters)."""
    if not path:
        return "the object"
    if len(path) > 8:
        return ".".join([*path[:3], f"({len(path) - 6} more)", *path[-3:]])
    return ".".join(path)


def _key(k, where: str, depth: int = 0):
    """A dictionary key as JSON (tuples as lists under "u", floats that JSON cannot hold as text)."""
    if depth > _MAX_DEPTH:
        raise ValueError(f"{where}: a dict key nested more than {_MAX_DEPTH} deep")
    if k is None or isinstance(k, (bool, int, str)):
        _check_scalar(k, where)
        return k
    if isinstance(k, float):
        return {"f": repr(k)} if not math.isfinite(k) else k
    if isinstance(k, tuple):
        return {"u": [_key(x, where, depth + 1) for x in k]}
    raise TypeError(f"{where}: a dict key of type {type(k).__name__} cannot be saved (keys may be None, bool, int, float, str or tuples of them)")


def _unkey(k, where: str):
    if k is None or isinstance(k, (bool, int, float, str)):
        return k
    if isinstance(k, dict) and len(k) == 1 and "u" in k and isinstance(k["u"], list):
        return tuple(_unkey(x, where) for x in k["u"])
    if isinstance(k, dict) and len(k) == 1 and "f" in k and isinstance(k["f"], str):
        return float(k["f"])
    raise ValueError(f"{where}: a corrupt dict key in the saved structure")


def save(obj, path: str | bytes | os.PathLike, **options) -> None:
    """Saves `obj` (see the module's note for what it may hold) as a tensorzip archive at `path`,
    through `save_file` (`options` as its keyword options; CUDA tensors all on one GPU are encoded
    there). As `torch.save(obj, path)`, but a path only, not a file object (the archive is written
    through a temporary file renamed into place) — and unlike `safetensors.torch.save`, which
    returns bytes."""
    if "metadata" in options:
        raise TypeError("save keeps the structure in the archive's metadata: metadata= is not accepted (put it in the object)")
    tensors: dict[str, torch.Tensor] = {}
    seen: dict[tuple, str] = {}
    # The safetensors header's own key cannot name a tensor: a tensor at the top-level key
    # "__metadata__" is stored as "__metadata__#2".
    taken: set[str] = {"__metadata__"}

    # The containers being walked (by id): one met again inside itself is a cycle.
    open_containers: set[int] = set()

    def walk(x, path: list[str], depth: int):
        where = _where(path)
        if depth > _MAX_DEPTH:
            raise ValueError(f"{where}: nested more than {_MAX_DEPTH} deep")
        if isinstance(x, (dict, list, tuple)):
            if id(x) in open_containers:
                raise ValueError(f"{where}: the structure contains itself (a cycle) and cannot be saved")
            open_containers.add(id(x))
            try:
                return walk_container(x, path, depth, where)
            finally:
                open_containers.discard(id(x))
        if x is None or isinstance(x, (bool, int, str)):
            _check_scalar(x, where)
            return x
        if isinstance(x, float):
            # JSON has no NaN or infinities: those go as text.
            return x if math.isfinite(x) else {"f": repr(x)}
        if isinstance(x, torch.Tensor):
            if x.layout != torch.strided:
                raise TypeError(f"{where}: only strided tensors can be saved, not {x.layout}")
            ident = _core.tied_key(x)
            name = seen.get(ident) if ident is not None else None
            if name is None:
                name = _name(path, taken)
                tensors[name] = x.detach()
                if ident is not None:
                    seen[ident] = name
            return {"t": name}
        raise TypeError(
            f"{where}: an object of type {type(x).__name__} cannot be saved (only dicts, lists, tuples, "
            "None, bool, int, float, str and tensors)"
        )

    def walk_container(x, path: list[str], depth: int, where: str):
        if isinstance(x, dict):
            items = [[_key(k, where), walk(v, [*path, str(k)], depth + 1)] for k, v in x.items()]
            if not isinstance(x, OrderedDict):
                return {"d": items}
            # A module's state_dict: an OrderedDict whose `_metadata` (each module's version, which
            # load_state_dict passes on) torch.save keeps too.
            meta = getattr(x, "_metadata", None)
            if meta is None:
                return {"o": items}
            return {"o": items, "m": walk(meta, [*path, "_metadata"], depth + 1)}
        if isinstance(x, list):
            return {"l": [walk(v, [*path, str(i)], depth + 1) for i, v in enumerate(x)]}
        return {"u": [walk(v, [*path, str(i)], depth + 1) for i, v in enumerate(x)]}

    tree = walk(obj, [], 0)
    doc = json.dumps({"version": _VERSION, "tree": tree}, separators=(",", ":"), allow_nan=False)
    save_file(tensors, path, {_KEY: doc}, **options)


def load(path: str | bytes | os.PathLike, device: str | int | torch.device = "cpu"):
    """Loads what `save` saved, its tensors on `device` (decoded there: on a GPU in one launch).
    A file `save` did not write, or whose structure is damaged, raises ValueError naming it."""
    name = os.fsdecode(path)
    # One opening for the structure and the tensors: a file saved again meanwhile (a trainer
    # rewriting it) cannot give the structure of one save and the tensors of another.
    with safe_open(name, device=device) as f:
        meta = f.metadata() or {}
        names = set(f.keys())
        if _KEY not in meta:
            raise ValueError(f"{name}: not written by tensorzip.save (no {_KEY!r} in its metadata; use load_file)")
        try:
            doc = json.loads(meta[_KEY])
            version, tree = doc["version"], doc["tree"]
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise ValueError(f"{name}: a corrupt saved structure ({type(e).__name__}: {e})") from None
        if version != _VERSION:
            raise ValueError(f"{name}: saved structure version {version!r} (this build reads {_VERSION})")
        tensors = _load_all(f)

    def pairs(v) -> bool:
        return isinstance(v, list) and all(isinstance(e, list) and len(e) == 2 for e in v)

    def build(x, depth: int):
        if depth > _MAX_DEPTH:
            raise ValueError(f"{name}: the saved structure is nested more than {_MAX_DEPTH} deep")
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, dict) and len(x) == 1:
            (tag, v), = x.items()
            if tag == "t" and isinstance(v, str) and v in names:
                return tensors[v]
            if tag == "f" and isinstance(v, str):
                return float(v)
            if tag == "l" and isinstance(v, list):
                return [build(e, depth + 1) for e in v]
            if tag == "u" and isinstance(v, list):
                return tuple(build(e, depth + 1) for e in v)
            if tag in ("d", "o") and pairs(v):
                return (dict if tag == "d" else OrderedDict)((_unkey(k, name), build(e, depth + 1)) for k, e in v)
        if isinstance(x, dict) and len(x) == 2 and pairs(x.get("o")) and "m" in x:
            out = OrderedDict((_unkey(k, name), build(e, depth + 1)) for k, e in x["o"])
            setattr(out, "_metadata", build(x["m"], depth + 1))
            return out
        raise ValueError(f"{name}: a corrupt saved structure (an entry {str(x)[:60]!r})")

    try:
        return build(tree, 0)
    except (TypeError, ValueError, RecursionError) as e:
        if isinstance(e, ValueError) and str(e).startswith(f"{name}: "):
            raise
        raise ValueError(f"{name}: a corrupt saved structure ({type(e).__name__}: {e})") from None
