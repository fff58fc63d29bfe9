"""The paged KV cache tensors: per layer one K and one V pool of fixed-size blocks.

Each backend allocates the pools its own way (``Backend.allocate_kv_cache``): the reference with
``torch.zeros`` on its device, the CPU backend on transparent huge pages."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

from swiftlm.backends.kv_quant import KVFormat, dequantize_kv, kv_format, quantize_kv
from swiftlm.config import DEFAULT_BLOCK_SIZE, CacheConfig, ModelConfig

# Without an explicit kv_cache_memory the pool takes at most this much (about 18k tokens of
# Qwen3-0.6B in bf16): a small model on a CPU serves far fewer tokens at once.
DEFAULT_MAX_KV_BYTES = 2 * 1024**3
# Under --gpu-memory-utilization, what a step's activations, logits and library workspaces may take
# beside the weights and the pool (Qwen3-0.6B at 512 tokens per step needs a few tens of MiB)
GPU_ACTIVATION_RESERVE = 512 * 1024**2
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default, when neither it nor kv_cache_memory is given


def bytes_per_block(model: ModelConfig, block_size: int, dtype: torch.dtype, fmt: KVFormat | None = None) -> int:
    """K and V of every layer for ``block_size`` tokens: ``dtype`` values, or ``fmt``'s bytes and
    a float32 scale per (token, head)."""
    rows = 2 * model.num_hidden_layers * model.num_key_value_heads * block_size  # (token, head) rows of K and V
    if fmt is not None:
        return rows * (model.head_dim + 4)
    return rows * model.head_dim * torch.empty((), dtype=dtype).element_size()


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def gpu_kv_budget(
    utilization: float, total: int, free: int, in_use: int, activation: int = GPU_ACTIVATION_RESERVE
) -> int:
    """The KV bytes that ``utilization`` of a device's ``total`` memory leaves once this process's
    ``in_use`` bytes (the loaded weights) and ``activation`` (a step's measured peak, by default
    ``GPU_ACTIVATION_RESERVE``) are taken out; ``free`` is what the device has left now (other
    processes' memory is not ours to take)."""
    asked = int(total * utilization)
    gib = 1024**3
    if asked > free + in_use:
        raise ValueError(
            f"gpu_memory_utilization {utilization} asks for {asked / gib:.1f} GiB of the device's "
            f"{total / gib:.1f} GiB, but only {(free + in_use) / gib:.1f} GiB are free for this process; lower it"
        )
    budget = asked - in_use - activation
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization {utilization} ({asked / gib:.2f} GiB) leaves no room for a KV cache "
            f"next to the weights ({in_use / gib:.2f} GiB); raise it"
        )
    return budget


def num_blocks_for(
    model: ModelConfig, cache: CacheConfig, dtype: torch.dtype, max_useful_tokens: int, device: str = "cpu",
    activation_bytes: int | None = None,
) -> int:
    """How many blocks (null block included) the memory budget allows.

    ``num_blocks`` wins, then ``kv_cache_memory``, then, on CUDA, ``gpu_memory_utilization``
    (``DEFAULT_GPU_MEMORY_UTILIZATION`` when not given): the pool takes all that the fraction
    leaves after the weights (as vLLM's does: more blocks keep more prefixes cached). Otherwise the pool takes a fraction of available memory, capped at
    ``DEFAULT_MAX_KV_BYTES`` and at what ``max_useful_tokens`` (full batches and sessions) needs;
    ``gpu_memory_utilization`` has no effect on a CPU. ``activation_bytes``: a step's measured
    peak on the device (``Backend.activation_bytes``), kept out of the CUDA budget.
    """
    if cache.num_blocks is not None:
        return cache.num_blocks
    budget = cache.kv_cache_memory
    block_size = cache.block_size or DEFAULT_BLOCK_SIZE  # the engine passes the backend's when left open
    per_block = bytes_per_block(model, block_size, dtype, kv_format(cache.kv_cache_dtype))
    if budget is None and device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        reserve = GPU_ACTIVATION_RESERVE if activation_bytes is None else activation_bytes
        utilization = cache.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION
        budget = gpu_kv_budget(utilization, total, free, torch.cuda.memory_reserved(device), reserve)
    if budget is None:
        budget = int(available_memory_bytes() * cache.memory_fraction)
        budget = min(budget, DEFAULT_MAX_KV_BYTES, (max_useful_tokens // block_size + 2) * per_block)
    n = budget // per_block
    if n < 2:
        raise ValueError(f"KV cache budget of {budget} bytes holds fewer than 2 blocks; raise kv_cache_memory")
    return int(n)


# (shapes, dtype) -> one zero-filled tensor per shape: how a backend places its pools
PoolAllocator = Callable[[Sequence[tuple[int, ...]], torch.dtype], list[torch.Tensor]]


class KVCache:
    """``[num_blocks, block_size, n_kv_heads, head_dim]`` K and V pools for every layer.

    Block ``b`` holds positions ``b * block_size ... b * block_size + block_size - 1`` of the
    flattened pool, which is what a slot index (``block_id * block_size + offset``) addresses.
    With a ``fmt`` (the small KV cache, ``kv_quant.py``) the pools hold its 8-bit values and every
    layer has K and V scale pools ``[num_blocks, block_size, n_kv_heads]`` float32 beside them;
    ``dtype`` is then the dtype attention computes in (the model's).
    """

    def __init__(
        self, model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: str = "cpu",
        allocate: PoolAllocator | None = None, fmt: KVFormat | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.fmt = fmt
        shape = (num_blocks, block_size, model.num_key_value_heads, model.head_dim)
        n = model.num_hidden_layers
        if allocate is None:
            def allocate(shapes: Sequence[tuple[int, ...]], dt: torch.dtype) -> list[torch.Tensor]:
                return [torch.zeros(s, dtype=dt, device=device) for s in shapes]
        pools = allocate([shape] * (2 * n), dtype if fmt is None else fmt.storage)
        self._k, self._v = pools[:n], pools[n:]
        self._k_scale: list[torch.Tensor] = []
        self._v_scale: list[torch.Tensor] = []
        if fmt is not None:
            scales = allocate([shape[:3]] * (2 * n), torch.float32)
            self._k_scale, self._v_scale = scales[:n], scales[n:]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._k[layer], self._v[layer]

    def layer_scales(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The layer's K and V scale pools ``[num_blocks, block_size, n_kv_heads]``; None when unscaled."""
        return (self._k_scale[layer], self._v_scale[layer]) if self.fmt is not None else None

    def pools(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's K pools and V pools (the tensors themselves, not copies)."""
        return list(self._k), list(self._v)

    def scale_pools(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's K and V scale pools (empty lists when the cache is not quantised)."""
        return list(self._k_scale), list(self._v_scale)

    def store(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k, v [T, Hkv, D] at the flat slots [T] of the layer's pools (quantised when the cache is)."""
        k_pool, v_pool = self._k[layer], self._v[layer]
        n_kv, d = k_pool.shape[2], k_pool.shape[3]
        if self.fmt is None:
            k_pool.view(-1, n_kv, d).index_copy_(0, slots, k if k.dtype == k_pool.dtype else k.to(k_pool.dtype))
            v_pool.view(-1, n_kv, d).index_copy_(0, slots, v if v.dtype == v_pool.dtype else v.to(v_pool.dtype))
            return
        for x, pool, scales in ((k, k_pool, self._k_scale[layer]), (v, v_pool, self._v_scale[layer])):
            q, s = quantize_kv(x, self.fmt)
            # as bytes: torch copies float8 by index only that way
            pool.view(torch.uint8).view(-1, n_kv, d).index_copy_(0, slots, q.view(torch.uint8))
            scales.view(-1, n_kv).index_copy_(0, slots, s)

    def gather(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``blocks`` (any index shape ``[...]``) as ``[..., block_size, Hkv, D]`` in ``dtype``."""
        k_pool, v_pool = self._k[layer], self._v[layer]
        if self.fmt is None:
            return k_pool[blocks], v_pool[blocks]
        storage = self.fmt.storage
        return (dequantize_kv(k_pool.view(torch.uint8)[blocks].view(storage), self._k_scale[layer][blocks], self.dtype),
                dequantize_kv(v_pool.view(torch.uint8)[blocks].view(storage), self._v_scale[layer][blocks], self.dtype))

    def copy_block(self, src: int, dst: int) -> None:
        for pool in (*self._k, *self._v, *self._k_scale, *self._v_scale):
            pool[dst].copy_(pool[src])
