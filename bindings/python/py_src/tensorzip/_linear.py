"""`CompressedLinear`: a linear layer whose weight stays compressed (losslessly) in memory and is
decoded at each forward call, in the manner of EntroPack's class of the same name.

The weight is held as a `CompressedTensor`'s state (one uint8 tensor: header and blob) in a
buffer, so `.to(device)` moves it compressed and `.to(dtype)` leaves it as it is (the bias is cast;
the decoded weight is cast to the activations' dtype at each call). In a `state_dict` the weight is
the key `<prefix>weight.tensorzip_state` (the `CompressedTensor.state_dict(leaf)` convention) in
place of `<prefix>weight`; `load_state_dict` into a layer made with the same features restores it
(the state's size is whatever the compressed weight takes, so it replaces the buffer rather than
copying into it). Decoding is lossless: the layer computes exactly what `torch.nn.Linear` with the
same weight and bias computes.

On a GPU the decode is one launch per call on torch's current stream (the compressed weight stays
resident, ~66% of a bf16 weight); on the CPU a forward call costs a decode of the whole weight
(all cores), which is a saving of memory, not of time.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ._entropack import (
    _LEAF,
    CompressedTensor,
    CompressionConfig,
    TensorZipConfig,
    _validate_config,
    compress,
    decompress,
)

_KEY = "weight." + _LEAF


class _NoWeight(AttributeError):
    """A `CompressedLinear` read for its weight before it has one."""


class CompressedLinear(torch.nn.Module):
    """`y = x W^T + b` with `W` kept compressed and decoded at each call.

    Args:
        in_features, out_features: as `torch.nn.Linear`.
        bias: whether the layer has a bias (kept uncompressed, frozen).
        config: the scheme (`TensorZipConfig()` by default; `RawConfig()` stores the weight).
        device: where the bias and, once compressed, the weight's state live.
        dtype: the dtype the weight is compressed as (and the bias's).

    A layer made this way has no weight until `compress_weight` or `load_state_dict` gives it one;
    `CompressedLinear.from_linear(linear)` does both steps from an existing layer.
    """

    weight_state: torch.Tensor  # a buffer (register_buffer in __init__)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        config: CompressionConfig | None = None,
        device: str | torch.device | None = None,
        dtype: torch.dtype = torch.bfloat16,
    ):
        super().__init__()
        # Integers (NumPy's too), as nn.Linear takes them: 1.5 (made 1 by int()) and True were
        # taken before.
        sizes = []
        for what, n in (("in_features", in_features), ("out_features", out_features)):
            try:
                if isinstance(n, bool):
                    raise TypeError
                sizes.append(operator.index(n))
            except TypeError:
                raise TypeError(f"{what} must be an int, not {type(n).__name__}") from None
        in_features, out_features = sizes
        if in_features < 0 or out_features < 0:
            raise ValueError(f"features must be non-negative, not ({in_features}, {out_features})")
        self.in_features, self.out_features = in_features, out_features
        self.config = TensorZipConfig() if config is None else config
        _validate_config(self.config)
        self.weight_dtype = dtype
        # Not persistent: `_save_to_state_dict` writes it under its own key.
        self.register_buffer("weight_state", torch.empty(0, dtype=torch.uint8, device=device), persistent=False)
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)
        self._parsed: CompressedTensor | None = None

    @classmethod
    def from_linear(
        cls,
        linear: torch.nn.Linear,
        *,
        config: CompressionConfig | None = None,
        dtype: torch.dtype | None = None,
    ) -> "CompressedLinear":
        """A layer holding `linear`'s weight compressed (as `dtype`, by default the weight's own)
        and a copy of its bias, on the weight's device."""
        w = linear.weight
        if w is None or w.device.type == "meta":
            raise ValueError("cannot compress a Linear whose weight is not materialized (load its state first)")
        dtype = w.dtype if dtype is None else dtype
        out = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            config=config,
            device=w.device,
            dtype=dtype,
        )
        out.train(linear.training)
        out.compress_weight(w.detach())
        if linear.bias is not None:
            out.bias = torch.nn.Parameter(linear.bias.detach().to(dtype).clone(), requires_grad=False)
        return out

    def compress_weight(self, weight: torch.Tensor) -> None:
        """Compresses `weight` (shape `(out_features, in_features)`, cast to the layer's weight
        dtype) into the layer. A scheme that can only store the weight raw raises RuntimeError."""
        self._check_shape(tuple(weight.shape))
        c = compress(weight.detach().to(self.weight_dtype), self.config)
        if c.compress_method == "raw" and "reason" in c.header:
            raise RuntimeError(
                f"{c.header['requested']} cannot code a {tuple(weight.shape)} {self.weight_dtype} weight: {c.header['reason']}"
            )
        # The state lives where the layer's does (its `device`), whatever device `weight` is on.
        self.weight_state = c.state_dict()[_LEAF].to(self.weight_state.device)
        self._parsed = c._rebind(self.weight_state)

    def _check_shape(self, shape: tuple) -> None:
        want = (self.out_features, self.in_features)
        if tuple(shape) != want:
            raise ValueError(f"weight has shape {tuple(shape)}, but the layer expects {want}")

    @property
    def weight(self) -> CompressedTensor:
        """The compressed weight (a `CompressedTensor` on the state's device)."""
        state = self.weight_state
        if state.numel() == 0:
            # An AttributeError, so that `hasattr(layer, "weight")` / `getattr(layer, "weight",
            # None)` (initialisers, adapters) see no weight rather than fail; `__getattr__` below
            # keeps this message where nn.Module's would replace it.
            raise self._no_weight()
        if self._parsed is None or self._parsed._state is not state:
            # Assigned from outside: its header is read (moves by `.to` keep it: `_apply`).
            self._parsed = CompressedTensor(state)
        return self._parsed

    def _no_weight(self) -> AttributeError:
        return _NoWeight(
            f"{type(self).__name__}({self.in_features}, {self.out_features}) has no weight yet "
            "(compress_weight or load_state_dict gives it one)"
        )

    def __getattr__(self, name: str):
        # Reached when the `weight` property raised (a layer with no weight yet): its message.
        if name == "weight":
            state = self._buffers.get("weight_state")
            if state is None or state.numel() == 0:
                raise self._no_weight()
        return super().__getattr__(name)

    def _apply(self, fn, recurse=True):
        moved = self.weight_state
        super()._apply(fn, recurse)
        if self._parsed is not None and self._parsed._state is moved and self.weight_state is not moved:
            # Moved (`.to(device)`, `.cuda()`): the header read before still holds.
            self._parsed = self._parsed._rebind(self.weight_state)
        return self

    def dequantize(self, device: str | torch.device | None = None) -> torch.Tensor:
        """The dense weight (bit for bit the one compressed), decoded on `device` (default: where
        the compressed weight is; a GPU decodes it there)."""
        c = self.weight
        if device is not None and torch.device(device) != c.device:
            c = c.to(device)
        return decompress(c, self.config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            # nn.Linear refuses them too; cast to the input's dtype, the weight would be truncated.
            raise TypeError(f"CompressedLinear expects a floating-point input, not {x.dtype}")
        w = self.dequantize(x.device)
        b = None if self.bias is None else self.bias.to(device=x.device, dtype=x.dtype)
        return F.linear(x, w.to(x.dtype), b)

    @property
    def stored_nbytes(self) -> int:
        """Bytes of the compressed weight, its header included (the bias is not counted)."""
        return self.weight.storage_nbytes()

    @property
    def compressed_bits(self) -> float:
        """Stored bits per weight element."""
        return self.stored_nbytes * 8 / max(self.in_features * self.out_features, 1)

    def extra_repr(self) -> str:
        parts = [
            f"in_features={self.in_features}",
            f"out_features={self.out_features}",
            f"bias={self.bias is not None}",
            f"dtype={str(self.weight_dtype).removeprefix('torch.')}",
        ]
        if self.weight_state.numel():
            parts.append(f"bits={self.compressed_bits:.3f}")
        return ", ".join(parts)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.weight_state.numel():
            state = self.weight_state
            destination[prefix + _KEY] = state if keep_vars else state.detach()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        key, dense = prefix + _KEY, prefix + "weight"
        if key not in state_dict and dense in state_dict:
            # A dense checkpoint (an nn.Linear's `weight`): compressed into the layer. Left in the
            # dict it was only "unexpected", and with strict=False the layer silently kept its
            # previous weight.
            weight = state_dict.pop(dense)
            try:
                self.compress_weight(weight)
            except (TypeError, ValueError, RuntimeError) as e:
                error_msgs.append(f"{dense}: {e}")
        elif key in state_dict:
            state = state_dict.pop(key)
            try:
                parsed = CompressedTensor(state)
                parsed.verify()
                self._check_shape(tuple(parsed.shape))
                if not local_metadata.get("assign_to_params_buffers", False):
                    state = state.to(device=self.weight_state.device, copy=True)
                    parsed = parsed._rebind(state)
                self.weight_state = state
                self.weight_dtype = parsed.encoded_dtype
                self._parsed = parsed
            except (TypeError, ValueError) as e:
                error_msgs.append(f"{key}: {e}")
        elif strict:
            missing_keys.append(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)


def compress_linears(
    module: torch.nn.Module,
    config: CompressionConfig | None = None,
    *,
    dtype: torch.dtype | None = None,
    filter: Callable[[str, torch.nn.Linear], bool] | None = None,
) -> int:
    """Replaces, in place, every `torch.nn.Linear` inside `module` (for which `filter(name,
    layer)` is true, if given; `name` as in `named_modules`) with a `CompressedLinear` holding its
    weight, and returns how many were replaced. The model computes exactly what it did. `module`
    itself is not replaced (a bare `Linear`: use `CompressedLinear.from_linear`), nor subclasses of
    `Linear` (they may compute something else). Every layer is compressed before any is swapped
    in, so a layer that cannot be (a weight on the meta device, a scheme that cannot code it)
    raises and leaves `module` as it was. One `Linear` reachable under several names (a tied
    layer) becomes one `CompressedLinear` under all of them, counted once; `filter` sees its
    first name. Left as they are, with a warning: a `Linear` whose weight another module also
    holds (tied weights, e.g. an `lm_head` tied to the embedding — replacing it would untie
    them and store the weight twice), and one with hooks or a patched `forward` (accelerate's
    offload hooks, say), which the new layer would not carry."""
    # Every place a layer sits (named_modules lists a shared module once, under its first name),
    # and every module holding each parameter.
    places: dict[int, list[str]] = {}
    layers: dict[int, tuple[str, torch.nn.Linear]] = {}
    holders: dict[int, set[int]] = {}
    for name, child in module.named_modules(remove_duplicate=False):
        for p in child._parameters.values():
            if p is not None:
                holders.setdefault(id(p), set()).add(id(child))
        if name and type(child) is torch.nn.Linear:
            places.setdefault(id(child), []).append(name)
            layers.setdefault(id(child), (name, child))

    def kept_as_is(name: str, child: torch.nn.Linear) -> bool:
        why = None
        if len(holders.get(id(child.weight), ())) > 1:
            why = "its weight is tied to another module's"
        elif child._forward_hooks or child._forward_pre_hooks or child._backward_hooks or "forward" in child.__dict__:
            why = "it has hooks or a patched forward"
        if why is not None:
            warnings.warn(f"compress_linears: {name} left uncompressed: {why}", stacklevel=3)
        return why is not None

    chosen = [
        k
        for k, (name, child) in layers.items()
        if (filter is None or filter(name, child)) and not kept_as_is(name, child)
    ]
    new = {k: CompressedLinear.from_linear(layers[k][1], config=config, dtype=dtype) for k in chosen}
    for k in chosen:
        for name in places[k]:
            parent_name, _, attr = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            setattr(parent, attr, new[k])
    return len(chosen)
