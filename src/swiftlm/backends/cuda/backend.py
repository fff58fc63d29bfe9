"""CudaBackend: the model on a CUDA device, attention and the KV store through Triton kernels.

* KV pools on the device, sized as vLLM sizes them: ``gpu_memory_utilization`` of the device's
  memory, less the weights and the activation peak of one profiled max-size step
  (``activation_bytes``, measured before the pools are allocated);
* the layer's elementwise steps (norms, residual adds, q/k norm + rotary, SiLU-multiply) as single
  Triton kernels (``kernels/fused_ops.py``) through the step plan of ``backends/fused_forward.py``,
  q/k/v and gate/up as one matmul each: ~10 kernels a layer instead of ~45 (a decode step of the
  Qwen3-0.6B shape is a few hundred small kernels: their count, not the bytes, sets its time);
* attention: ``TritonPagedAttention`` (``attention.py``); a quantised KV cache falls back to the
  reference ``PagedAttention``, with the reason in ``fallbacks``;
* decode-only steps replay a CUDA graph of their batch-size bucket (``graphs.py``), captured in
  ``warm_up``; ``enforce_eager`` captures none;
* the sampler runs where the logits are (the device); the runner copies the sampled ids to the
  host once per step.

``CudaBackend(device="cpu", interpret=True)`` is the tests' way in: the same Python logic and the
same kernels on CPU tensors under Triton's interpreter (the kernel modules must have been imported
with ``TRITON_INTERPRET=1``); no graphs, no memory profiling."""

from __future__ import annotations

from functools import partial

import torch

from swiftlm.backends.attention import PagedAttention
from swiftlm.backends.base import Backend
from swiftlm.backends.cuda.attention import BoundTritonAttention, TritonPagedAttention
from swiftlm.backends.cuda.device import require_cuda
from swiftlm.backends.cuda.graph_buckets import graph_batch_sizes
from swiftlm.backends.cuda.graphs import DecodeGraphs
from swiftlm.backends.cuda.kernels.fused_ops import triton_fused_ops
from swiftlm.backends.fuse import fuse_projections
from swiftlm.backends.fused_forward import StepPlan, build_plan, fused_forward, fused_ops_support
from swiftlm.backends.kv_cache import KVCache
from swiftlm.backends.kv_quant import KVFormat
from swiftlm.backends.quant import quantize
from swiftlm.config import ModelConfig
from swiftlm.core.step import AttentionMetadata
from swiftlm.model.decoder import Attention, DecoderForCausalLM


class CudaBackend(Backend):
    name = "cuda"
    # off until measured on a GPU (``scripts/gpu_check.py``'s throughput stage runs both ways): the device
    # thread needs the GIL to launch a step and to read its tokens, and waits for it while the host works
    overlaps_steps_by_default = False

    def __init__(self, device: str = "cuda", *, interpret: bool = False, enforce_eager: bool = False,
                 max_num_seqs: int = 256, max_model_len: int = 40960) -> None:
        if interpret:
            if device != "cpu":
                raise ValueError("interpret=True runs the kernels on CPU tensors: use device='cpu'")
            self.torch_device = torch.device("cpu")
        else:
            self.torch_device = require_cuda(device)
        super().__init__(str(self.torch_device))
        self.interpret = interpret
        self.enforce_eager = enforce_eager or interpret
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.kv_cache: KVCache | None = None
        self.graphs: DecodeGraphs | None = None
        self.step_plan: StepPlan | None = None  # the fused elementwise kernels' forward (None: the model's own)
        self._triton = True  # False once a quantised KV cache sends attention to the reference

    def prepare(self, model: DecoderForCausalLM, quantization: str | None = None) -> None:
        where = "Triton interpreter on CPU tensors" if self.interpret else torch.cuda.get_device_name(self.torch_device)
        self.fallbacks = []
        fuse_projections(model)  # before quantising: the fused linears are quantised as one
        if quantization is not None:
            quantize(model, quantization)
        reason = fused_ops_support(model.model.embed_tokens.weight.dtype, model.config.head_dim)
        if reason is None:
            self.step_plan = StepPlan(build_plan(model.model), triton_fused_ops(), None)
        else:
            self.fell_back("fused elementwise kernels", reason)
        elementwise = "stock torch ops" if self.step_plan is None else \
            "norms, q/k norm + rotary, SiLU-multiply as Triton kernels"
        self.plan = [f"device: {where}", f"model: q/k/v and gate/up fused; {elementwise}",
                     "attention: Triton (KV store, varlen paged prefill, paged GQA decode)",
                     "sampler: on the device (logits stay there; the sampled ids come back in one copy)"]
        if quantization is not None:
            self.plan.append(f"linears: {quantization}, dequantised + F.linear (plain torch)")

    def _forward(self, model: DecoderForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor,
                 attention: Attention) -> torch.Tensor:
        """The model's forward: over the fused kernels' step plan where it holds, else the model's own."""
        if self.step_plan is None:
            return model(input_ids, positions, attention)
        return fused_forward(model.model, self.step_plan, input_ids, positions, attention)

    def greedy_pick(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.step_plan is None or logits.dtype != torch.float32:
            return None
        return self.step_plan.ops.greedy_pick(logits)

    def step_launched(self) -> torch.cuda.Event | None:
        if not self.device.startswith("cuda"):  # the Triton interpreter on a CPU: done when launched
            return None
        event = torch.cuda.Event()
        event.record()  # on the current stream, after the step's kernels and its tokens' copy to the host
        return event

    def allocate_kv_cache(
        self, model: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, fmt: KVFormat | None = None
    ) -> KVCache:
        if fmt is not None:
            self._triton = False
            self.fell_back("attention", f"the Triton kernels read unquantised pools, not {fmt.name}: gather + SDPA")
        self.kv_cache = KVCache(model, num_blocks, block_size, dtype, self.device, fmt=fmt)
        return self.kv_cache

    def attention(self, kv_cache: KVCache) -> PagedAttention | TritonPagedAttention:  # type: ignore[override]
        return TritonPagedAttention(kv_cache) if self._triton and kv_cache.fmt is None else PagedAttention(kv_cache)

    def forward(
        self, model: DecoderForCausalLM, input_ids: torch.Tensor, positions: torch.Tensor, attention: Attention
    ) -> torch.Tensor:
        """A decode-only step replays its bucket's graph when one is captured; any other step runs eagerly."""
        if self.graphs is not None and isinstance(attention, BoundTritonAttention):
            meta: AttentionMetadata = attention.meta
            bucket = self.graphs.bucket(input_ids.shape[0], meta)
            if bucket is not None:
                return self.graphs.replay(bucket, input_ids, positions, meta)
        return self._forward(model, input_ids, positions, attention)

    def activation_bytes(self, model: DecoderForCausalLM, block_size: int, max_rows: int, head_rows: int) -> int | None:
        """The memory one step of ``max_rows`` prompt tokens (``head_rows`` of them sampled) takes
        beyond the weights: measured by running it over a scratch KV cache (None off CUDA)."""
        if self.interpret:
            return None
        dev = self.torch_device
        cfg = model.config
        max_rows = min(max_rows, cfg.max_position_embeddings)  # positions past the rotary table do not exist
        n_blocks = (max_rows + block_size - 1) // block_size + 1  # block 0 stays the null block
        scratch = KVCache(cfg, n_blocks, block_size, model.model.embed_tokens.weight.dtype, self.device)
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = torch.cuda.memory_allocated(dev)
        # one request of max_rows tokens in blocks 1 .. n_blocks - 1: position p at slot block_size + p
        slots = torch.arange(block_size, block_size + max_rows, device=dev)
        meta = AttentionMetadata(query_start=[0, max_rows], seq_lens=[max_rows], slot_mapping=slots,
                                 block_tables=torch.arange(1, n_blocks, device=dev)[None, :],
                                 decode_rows=[], prefill_rows=[0])
        with torch.inference_mode():
            ids = torch.zeros(max_rows, dtype=torch.int64, device=dev)
            hidden = self._forward(model, ids, torch.arange(max_rows, device=dev), TritonPagedAttention(scratch).bind(meta))
            model.compute_logits(hidden[-head_rows:]).softmax(dim=-1)
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - before
        del scratch, hidden
        torch.cuda.empty_cache()
        return int(peak)

    def warm_up(self, model: DecoderForCausalLM, max_rows: int, head_rows: int) -> str | None:
        """Capture the decode graphs (unless eager or the reference attention runs)."""
        if self.enforce_eager or not self._triton or self.kv_cache is None:
            return None
        cache = self.kv_cache
        max_len = min(self.max_model_len, model.config.max_position_embeddings)
        width = (max_len + cache.block_size - 1) // cache.block_size
        sizes = graph_batch_sizes(min(self.max_num_seqs, max_rows))
        with torch.inference_mode():
            self.graphs = DecodeGraphs(partial(self._forward, model), cache, sizes, width, self.torch_device)
        self.plan.append(f"decode steps: CUDA graphs for batch sizes {', '.join(map(str, sizes))}")
        return f"captured {len(sizes)} CUDA graphs for decode batches of up to {sizes[-1]} sequences"
