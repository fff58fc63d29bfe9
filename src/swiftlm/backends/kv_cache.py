"""The paged KV cache tensors: per layer one K and one V pool of fixed-size blocks.

Each backend allocates the pools its own way (``Backend.allocate_kv_cache``): the reference with
``torch.zeros`` on its device, the CPU backend on transparent huge pages."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import torch

from swiftlm.config import CacheConfig, ModelConfig

# Without an explicit kv_cache_memory the pool takes at most this much (about 18k tokens of
# Qwen3-0.6B in bf16): a small model on a CPU serves far fewer tokens at once.
DEFAULT_MAX_KV_BYTES = 2 * 1024**3
# Under --gpu-memory-utilization, what a step's activations, logits and library workspaces may take
# beside the weights and the pool (Qwen3-0.6B at 512 tokens per step needs a few tens of MiB)
GPU_ACTIVATION_RESERVE = 512 * 1024**2


def bytes_per_block(model: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """K and V of every layer for ``block_size`` tokens."""
    per_token = 2 * model.num_hidden_layers * model.num_key_value_heads * model.head_dim
    return per_token * block_size * torch.empty((), dtype=dtype).element_size()


def available_memory_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def gpu_kv_budget(utilization: float, total: int, free: int, in_use: int) -> int:
    """The KV bytes that ``utilization`` of a device's ``total`` memory leaves once this process's
    ``in_use`` bytes (the loaded weights) and ``GPU_ACTIVATION_RESERVE`` are taken out; ``free``
    is what the device has left now (other processes' memory is not ours to take)."""
    asked = int(total * utilization)
    gib = 1024**3
    if asked > free + in_use:
        raise ValueError(
            f"gpu_memory_utilization {utilization} asks for {asked / gib:.1f} GiB of the device's "
            f"{total / gib:.1f} GiB, but only {(free + in_use) / gib:.1f} GiB are free for this process; lower it"
        )
    budget = asked - in_use - GPU_ACTIVATION_RESERVE
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization {utilization} ({asked / gib:.2f} GiB) leaves no room for a KV cache "
            f"next to the weights ({in_use / gib:.2f} GiB); raise it"
        )
    return budget


def num_blocks_for(
    model: ModelConfig, cache: CacheConfig, dtype: torch.dtype, max_useful_tokens: int, device: str = "cpu"
) -> int:
    """How many blocks (null block included) the memory budget allows.

    ``num_blocks`` wins, then ``kv_cache_memory``, then, on CUDA, ``gpu_memory_utilization``: the
    pool takes all that the fraction leaves after the weights (as vLLM's does: more blocks keep
    more prefixes cached). Otherwise the pool takes a fraction of available memory, capped at
    ``DEFAULT_MAX_KV_BYTES`` and at what ``max_useful_tokens`` (full batches and sessions) needs;
    ``gpu_memory_utilization`` has no effect on a CPU.
    """
    if cache.num_blocks is not None:
        return cache.num_blocks
    budget = cache.kv_cache_memory
    per_block = bytes_per_block(model, cache.block_size, dtype)
    if budget is None and cache.gpu_memory_utilization is not None and device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        budget = gpu_kv_budget(cache.gpu_memory_utilization, total, free, torch.cuda.memory_reserved(device))
    if budget is None:
        budget = int(available_memory_bytes() * cache.memory_fraction)
        budget = min(budget, DEFAULT_MAX_KV_BYTES, (max_useful_tokens // cache.block_size + 2) * per_block)
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
    """

    def __init__(
        self, model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: str = "cpu",
        allocate: PoolAllocator | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        shape = (num_blocks, block_size, model.num_key_value_heads, model.head_dim)
        n = model.num_hidden_layers
        if allocate is None:
            pools = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2 * n)]
        else:
            pools = allocate([shape] * (2 * n), dtype)
        self._k, self._v = pools[:n], pools[n:]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._k[layer], self._v[layer]

    def pools(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Every layer's K pools and V pools (the tensors themselves, not copies)."""
        return list(self._k), list(self._v)

    def copy_block(self, src: int, dst: int) -> None:
        for k, v in zip(self._k, self._v, strict=True):
            k[dst].copy_(k[src])
            v[dst].copy_(v[src])
