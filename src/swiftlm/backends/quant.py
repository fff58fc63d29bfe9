"""Weight-only quantisation of a model's linear layers: ``quantize(model, "int8" | "int4")``.

A transformation of a built model (the model file stays one model): every ``nn.Linear`` becomes a
``QuantLinear`` holding packed weights as buffers (``qweight``, ``scales``, and ``mins`` for int4).
A tied ``lm_head`` gets its own quantised copy; the embedding table stays as it is for lookups.

Formats (packed layouts in ``backends/cpu/kernels/quant_cpu.cpp``):

* ``int8``: symmetric per output channel, ``w = d * q``, ``q`` in [-127, 127], ``d`` float32.
* ``int4``: asymmetric groups of 64 along K (32 where K is not a multiple of 64),
  ``w = d * u + m`` with ``u`` in [0, 15], ``m = min(w)``, ``d = (max(w) - m) / 15``, both float16:
  0.5625 bytes per weight.

Activations are quantised on the fly to int8 in blocks of 32 along K (one float scale per block)
on every path, so a layer computes the same function whatever its number of rows:

* up to ``kernel_max_rows`` rows (the backend's row limit) with the compiled kernels: int8 x int8 VNNI dot
  products (``int8_gemv`` / ``int4_gemv``), which stream the packed weights once;
* otherwise, or without the kernels: the weights are dequantised to the activation dtype (in
  slices of output channels for large layers such as the lm_head) and multiplied by the
  fake-quantised activations with ``F.linear``;
* after ``use_reference()`` (see ``dequantized_reference``): the same math in plain torch float64.
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.nn.functional as F
from torch import nn

from swiftlm.backends.quant_ops import QK, TILE, TORCH_OPS, QuantOps, dequantize_activations
from swiftlm.backends.row_buckets import bucketed

logger = logging.getLogger(__name__)

METHODS = ("int8", "int4")
INT4_GROUP = 64
_KERNEL_DTYPES = (torch.float32, torch.bfloat16)
_ROWS_PER_CHUNK = 8192  # weights are quantised this many output channels at a time


class QuantLinear(nn.Module):
    """``y = x @ W^T + b`` with W quantised to int8 or int4; see the module docstring for the math."""

    DENSE_SLICE = 1 << 23  # the dense path dequantises at most this many weights at a time

    def __init__(
        self,
        method: str,
        in_features: int,
        out_features: int,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        mins: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        kernels: QuantOps | None = None,
        kernel_max_rows: int = 0,
    ) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"unknown quantisation method {method!r}; use one of {', '.join(METHODS)}")
        self.method = method
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("mins", mins)
        self.register_buffer("bias", bias)
        self.kernels = kernels
        self.path = "auto"  # "reference" after use_reference()
        self._kernel_gemv = None if kernels is None else (kernels.int8_gemv if method == "int8" else kernels.int4_gemv)
        self.kernel_max_rows = kernel_max_rows if kernels is not None else 0  # rows through the compiled GEMV

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, method: str, kernels: QuantOps | None = None, kernel_max_rows: int = 0
    ) -> QuantLinear:
        w = linear.weight.detach()
        n, k = w.shape
        if method == "int8":
            qweight, scales = quantize_weight_int8(w)
            mins = None
        else:
            qweight, scales, mins = quantize_weight_int4(w, int4_group_size(k))
        bias = None if linear.bias is None else linear.bias.detach().clone()
        on_cpu = w.device.type == "cpu"
        return cls(method, k, n, qweight, scales, mins, bias, kernels if on_cpu else None, kernel_max_rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        # _buffers directly: Module.__getattr__ costs ~0.5 us a buffer, and this runs ~200 times a token
        b = self._buffers
        if self._kernel_gemv is not None and x2.shape[0] <= self.kernel_max_rows and x2.dtype in _KERNEL_DTYPES:
            if self.method == "int8":
                y = self._kernel_gemv(x2, b["qweight"], b["scales"], self.out_features)
            else:
                y = self._kernel_gemv(x2, b["qweight"], b["scales"], b["mins"], self.out_features)
        elif self.path == "reference":
            y = (dequantize_activations(x2, torch.float64) @ b["reference_weight"].T).to(x.dtype)
        else:
            y = self._dense(x2)
        bias = b["bias"]
        if bias is not None:
            y.add_(bias)  # in place: keeps the activation dtype
        return y if x2 is x else y.reshape(*x.shape[:-1], self.out_features)

    def use_reference(self) -> None:
        """Compute in plain torch float64 from now on (the test oracle), from dequantised float64
        weights kept in the non-persistent buffer ``reference_weight`` (8 bytes per weight)."""
        self.register_buffer("reference_weight", self.dequantize(dtype=torch.float64), persistent=False)
        self.path = "reference"
        self._kernel_gemv = None
        self.kernel_max_rows = 0

    def dequantize(self, n0: int = 0, n1: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weights of output channels ``n0 .. n1 - 1`` (``n0`` a multiple of 16) as ``dtype``."""
        n1 = self.out_features if n1 is None else n1
        ops = self.kernels if self.kernels is not None and dtype in _KERNEL_DTYPES else TORCH_OPS
        if self.method == "int8":
            return ops.int8_dequantize(self.qweight, self.scales, n0, n1, dtype)
        return ops.int4_dequantize(self.qweight, self.scales, self.mins, n0, n1, dtype)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":  # oneDNN caches a primitive per row count: rows in buckets
            return bucketed(x, self._dense_rows)
        return self._dense_rows(x)

    def _dense_rows(self, x: torch.Tensor) -> torch.Tensor:
        ops = self.kernels if self.kernels is not None and x.dtype in _KERNEL_DTYPES else TORCH_OPS
        xq = ops.fake_quantize_activations(x)
        n = self.out_features
        step = max(TILE, self.DENSE_SLICE // self.in_features // TILE * TILE)
        if n <= step:
            return F.linear(xq, self.dequantize(0, n, x.dtype))
        out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
        for n0 in range(0, n, step):
            n1 = min(n, n0 + step)
            out[:, n0:n1] = F.linear(xq, self.dequantize(n0, n1, x.dtype))
        return out

    def extra_repr(self) -> str:
        group = f", group={self.in_features // self.scales.shape[1]}" if self.method == "int4" else ""
        kernels = "vnni" if self.kernels is not None else "torch"
        return (f"{self.method}, in_features={self.in_features}, out_features={self.out_features}{group}, "
                f"bias={self.bias is not None}, kernels={kernels}, path={self.path}")


def int4_group_size(in_features: int) -> int:
    return INT4_GROUP if in_features % INT4_GROUP == 0 else QK


def quantize_weight_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (qweight uint8 [N16, K/4, 64], scales float32 [N]); w ~ scales * (qweight - 128)."""
    n, k = w.shape
    _check_k(k)
    packed, scales = [], []
    for n0 in range(0, n, _ROWS_PER_CHUNK):
        w32 = w[n0 : n0 + _ROWS_PER_CHUNK].float()
        amax = w32.abs().amax(1, keepdim=True)
        inv = torch.where(amax > 0, 127.0 / amax, 0.0)
        u = (torch.round(w32 * inv).clamp_(-127, 127) + 128).to(torch.uint8)
        u = _pad_rows(u, 128)  # padding channels dequantise to 0
        t = u.shape[0] // TILE
        packed.append(u.view(t, TILE, k // 4, 4).permute(0, 2, 1, 3).reshape(t, k // 4, 64))
        scales.append((amax / 127.0).squeeze(1))
    return torch.cat(packed), torch.cat(scales)


def quantize_weight_int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (qweight uint8 [N16, K/32, 4, 64], scales, mins float16 [N16, K/group, 16])."""
    n, k = w.shape
    _check_k(k)
    if group % QK or k % group:
        raise ValueError(f"int4 group size {group} must be a multiple of {QK} that divides K = {k}")
    nb, ng = k // QK, k // group
    packed, scales, mins = [], [], []
    for n0 in range(0, n, _ROWS_PER_CHUNK):
        wg = _pad_rows(w[n0 : n0 + _ROWS_PER_CHUNK].to(torch.float32, copy=True), 0.0).view(-1, ng, group)
        lo, hi = torch.aminmax(wg, dim=-1, keepdim=True)
        fp16_max = torch.finfo(torch.float16).max
        m = lo.clamp(-fp16_max, fp16_max).half()
        d = ((hi - lo) / 15).clamp(max=fp16_max).half()
        inv = torch.where(d > 0, 1.0 / d.float(), 0.0)
        u = wg.sub_(m.float()).mul_(inv).round_().clamp_(0, 15).to(torch.uint8).view(-1, k)
        t = u.shape[0] // TILE
        steps = u.view(t, TILE, nb, 8, 4).permute(0, 2, 3, 1, 4).reshape(t, nb, 8, 64)  # k = 32b + 4s + i
        packed.append(steps[:, :, :4] | (steps[:, :, 4:] << 4))
        scales.append(d.view(t, TILE, ng).transpose(1, 2).contiguous())
        mins.append(m.view(t, TILE, ng).transpose(1, 2).contiguous())
    return torch.cat(packed).contiguous(), torch.cat(scales), torch.cat(mins)


def _check_k(k: int) -> None:
    if k % QK:
        raise ValueError(f"in_features {k} is not a multiple of {QK}; this layer cannot be quantised")


def _pad_rows(t: torch.Tensor, value: float) -> torch.Tensor:
    pad = -t.shape[0] % TILE
    return F.pad(t, (0, 0, 0, pad), value=value) if pad else t


def quantize(model: nn.Module, method: str, kernels: QuantOps | None = None, kernel_max_rows: int = 0) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by a ``QuantLinear``; returns ``model``.

    ``kernels``: compiled twins of ``TORCH_OPS`` for small-row GEMVs (a backend loads them, e.g.
    ``backends/cpu/kernels/quant_cpu.py``), which take up to ``kernel_max_rows`` rows (more rows
    dequantise and use a dense matmul); None keeps the plain torch path.
    Layers whose in_features is not a multiple of 32 stay as they are (logged).
    """
    if method not in METHODS:
        raise ValueError(f"unknown quantisation method {method!r}; use one of {', '.join(METHODS)}")
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear):
            continue
        if module.in_features % QK:
            logger.warning("%s: in_features %d is not a multiple of %d; left unquantised", name, module.in_features, QK)
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, attr, QuantLinear.from_linear(module, method, kernels, kernel_max_rows))
    return model


def dequantized_reference(model: nn.Module, method: str) -> nn.Module:
    """A copy of ``model`` quantised as ``quantize(model, method)`` does (``model`` may also be that
    quantised model) whose linear layers compute the same math in plain torch, in float64: the
    dynamic int8 activation quantisation and exact integer-valued dot products. ``model`` is left as is.
    """
    ref = quantize(copy.deepcopy(model), method)
    for module in ref.modules():
        if isinstance(module, QuantLinear):
            if module.method != method:
                raise ValueError(f"the model is already quantised to {module.method}, not {method}")
            module.use_reference()
    return ref
