"""Triton kernels of the CUDA backend, one per file, each with the torch reference as its oracle:

* ``store_kv.py``: a step's new K/V rows into the paged pools at their slots;
* ``prefill_attention.py``: varlen causal attention of query chunks over their paged context
  (prefix-cached blocks included);
* ``decode_attention.py``: one query per sequence over its block table, the query heads of a KV
  head (GQA) in one tile.

Importing a module of this package imports triton; nothing outside ``backends/cuda`` does.
Under ``TRITON_INTERPRET=1`` (set before the module is imported) the kernels run on CPU tensors:
that is how CPU CI tests them. Every ``tl.dot`` and rounding cast goes through ``tile_ops.py``, which states its
precision: ``input_precision="ieee"`` (float32 tiles in full float32 on the GPU, as in the
interpreter, no TF32; bfloat16 tiles in bfloat16 with float32 accumulation)."""
