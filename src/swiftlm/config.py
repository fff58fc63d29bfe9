"""Configuration as frozen dataclasses, built once at the edge (CLI, ``LLM(...)``) and passed down."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM")
# what each architecture switches on in the one decoder (swiftlm.model.decoder), and the defaults
# transformers' config classes give fields a config.json leaves out
_ARCHITECTURE_DEFAULTS: dict[str, dict[str, Any]] = {
    "Qwen3ForCausalLM": {"qk_norm": True, "qkv_bias": False, "rope_theta": 1_000_000.0, "max_position_embeddings": 40960},
    "Qwen2ForCausalLM": {"qk_norm": False, "qkv_bias": True, "rope_theta": 10_000.0, "max_position_embeddings": 32768},
    "LlamaForCausalLM": {"qk_norm": False, "qkv_bias": False, "rope_theta": 10_000.0, "max_position_embeddings": 2048},
}
ROPE_SCALINGS = ("llama3", "linear", "factors")  # "factors": a GGUF's per-frequency divisors (rope_freqs)


class ConfigError(ValueError):
    """A configuration a user gave (or a checkpoint carries) that swiftlm cannot use."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The shape of a dense decoder (Qwen3, Qwen2 or Llama), read from a checkpoint's ``config.json``.

    The architectures differ by switches of one model: ``qk_norm`` (Qwen3's RMSNorm of each q and k
    head), ``qkv_bias`` (Qwen2's q/k/v biases), ``attention_bias`` (biases on q, k, v and o, as the
    config's field), ``rope_scaling`` (``{"rope_type": "llama3" | "linear", ...}`` as in config.json)
    and a tied or untied head."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 40960
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    architecture: str = "Qwen3ForCausalLM"
    torch_dtype: str = "bfloat16"
    qk_norm: bool = True
    qkv_bias: bool = False
    rope_scaling: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if kind == "default":
                object.__setattr__(self, "rope_scaling", None)
            elif kind not in ROPE_SCALINGS:
                raise ConfigError(f"rope_scaling type {kind!r} is not supported; swiftlm supports "
                                  f"{', '.join(ROPE_SCALINGS)}")
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"architecture {self.architecture!r} is not supported; swiftlm supports "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or [cfg.get("model_type", "unknown")]
        defaults = _ARCHITECTURE_DEFAULTS.get(archs[0], _ARCHITECTURE_DEFAULTS["Qwen3ForCausalLM"])
        rope_parameters = cfg.get("rope_parameters") or {}  # newer transformers nest rope fields there
        rope_theta = cfg.get("rope_theta")
        if rope_theta is None:
            rope_theta = rope_parameters.get("rope_theta", defaults["rope_theta"])
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling is None and rope_parameters.get("rope_type", "default") != "default":
            rope_scaling = {k: v for k, v in rope_parameters.items() if k != "rope_theta"}
        if cfg.get("mlp_bias"):
            raise ConfigError("mlp_bias is not supported (no released Llama checkpoint uses it)")
        if cfg.get("use_sliding_window") and archs[0] == "Qwen2ForCausalLM":
            raise ConfigError("Qwen2 with use_sliding_window is not supported")
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            num_key_value_heads=cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            max_position_embeddings=cfg.get("max_position_embeddings", defaults["max_position_embeddings"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            architecture=archs[0],
            torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
            qk_norm=defaults["qk_norm"],
            qkv_bias=defaults["qkv_bias"],
            rope_scaling=dict(rope_scaling) if rope_scaling else None,
        )

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
        return cls.from_dict(json.loads(path.read_text()))


KV_CACHE_DTYPES = ("auto", "int8", "fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM's --kv-cache-dtype names


DEFAULT_BLOCK_SIZE = 16  # tokens a KV block holds where nothing else chooses (vLLM's default on a GPU)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The paged KV cache: block size and how much memory its pools may take."""

    # tokens a block holds; None: the backend's choice (Backend.default_block_size: DEFAULT_BLOCK_SIZE,
    # and on a CPU 32 for the 8-bit caches, so that a block's K rows span as many bytes as bf16's 16 do;
    # sized without a backend, DEFAULT_BLOCK_SIZE)
    block_size: int | None = None
    kv_cache_memory: int | None = None  # bytes; None: a fraction of available memory
    memory_fraction: float = 0.3
    # CUDA only (vLLM's --gpu-memory-utilization): the share of the device's memory that weights and
    # KV together may take; the pool gets what the weights leave. No effect on a CPU, whose pool
    # keeps the budget above (never a share of a shared machine's RAM this large)
    gpu_memory_utilization: float | None = None
    num_blocks: int | None = None  # overrides all of the above (tests)
    enable_prefix_caching: bool = True
    session_ttl: float = 600.0  # seconds an idle session keeps its KV
    max_session_tokens: int | None = None  # global budget of pinned session tokens; None: half the pool
    # vLLM's --kv-cache-dtype: auto (the model's dtype) | int8 | fp8 (= fp8_e4m3) | fp8_e4m3 | fp8_e5m2:
    # 8-bit K/V with a float32 scale per (token, head), see backends/kv_quant.py
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.block_size is not None and (self.block_size <= 0 or self.block_size & (self.block_size - 1)):
            raise ConfigError(f"block_size must be a positive power of two, got {self.block_size}")
        if not 0.0 < self.memory_fraction <= 0.95:
            raise ConfigError(f"memory_fraction must be in (0, 0.95], got {self.memory_fraction}")
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ConfigError(f"num_blocks must be at least 2 (one is the null block), got {self.num_blocks}")


SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Continuous batching limits and admission control."""

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 512
    max_model_len: int = 8192
    max_queued_requests: int = 256
    max_queue_wait: float | None = None  # seconds a request may wait before it is refused
    # "fcfs": waiting requests are admitted in arrival order and the most recently admitted running
    # request is preempted first; "priority" (vLLM's): in (priority, arrival) order, lowest value
    # first, and the running request with the largest (priority, arrival) is preempted first
    scheduling_policy: str = "fcfs"
    # background requests (Batch API lines) run only when no interactive request waits, in at most
    # this share of max_num_seqs seats and of each step's max_num_batched_tokens (each at least 1)
    background_max_seqs_share: float = 0.5
    background_max_tokens_share: float = 0.25  # 128 of 512: a background step stays short (~0.25 s on 2 cores)
    # ... and while any interactive request runs or waits, at most this many tokens a step (decode
    # rows and prefill chunks), prefill chunks only every background_busy_prefill_every-th step (0:
    # none): a step's time grows with its tokens, and a prefill chunk makes it take the general path
    background_busy_tokens: int = 8
    background_busy_prefill_every: int = 4
    background_busy_linger_s: float = 1.0  # "while" lasts this long after the last interactive request

    def __post_init__(self) -> None:
        if self.background_busy_tokens < 0 or self.background_busy_prefill_every < 0:
            raise ConfigError("background_busy_tokens and background_busy_prefill_every must be >= 0, got "
                              f"{self.background_busy_tokens}, {self.background_busy_prefill_every}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ConfigError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                              f"got {self.scheduling_policy!r}")
        for name in ("background_max_seqs_share", "background_max_tokens_share"):
            share = getattr(self, name)
            if not 0.0 < share <= 1.0:
                raise ConfigError(f"{name} must be in (0, 1], got {share}")
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_queued_requests < 1:
            raise ConfigError(f"max_queued_requests must be >= 1, got {self.max_queued_requests}")

    @property
    def max_background_seqs(self) -> int:
        """Seats background requests may hold at once: the share of max_num_seqs, at least 1."""
        return max(1, math.floor(self.background_max_seqs_share * self.max_num_seqs))

    @property
    def max_background_tokens(self) -> int:
        """Tokens background requests may compute in one step: the share of the budget, at least 1."""
        return max(1, math.floor(self.background_max_tokens_share * self.max_num_batched_tokens))


SPECULATIVE_METHODS = ("ngram",)
_VLLM_NGRAM_DEFAULT = 5  # vLLM's prompt_lookup_min and _max when neither is given


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding without a draft model: prompt lookup (vLLM's ``"ngram"`` method).

    Each step a decoding request looks up its last ``prompt_lookup_max`` .. ``prompt_lookup_min``
    tokens (longest first) earlier in its prompt and output, proposes the ``num_speculative_tokens``
    tokens that followed, and the model checks them all in one forward. vLLM's defaults: neither
    bound given -> both 5; one given -> the other equals it.

    swiftlm's own keys: a request whose drafts keep being rejected stops proposing. After every
    ``acceptance_window`` proposals, an acceptance rate (accepted / proposed draft tokens) below
    ``min_acceptance_rate`` pauses it for ``backoff_steps`` decode steps, doubled on each further
    failure (up to 16x). ``disable_by_batch_size`` (vLLM's): no proposals while more requests than
    this are running (None: always propose)."""

    num_speculative_tokens: int
    method: str = "ngram"
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    disable_by_batch_size: int | None = None
    acceptance_window: int = 8
    min_acceptance_rate: float = 0.2
    backoff_steps: int = 32

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ConfigError(f"speculative method {self.method!r} is not supported; swiftlm supports "
                              f"{', '.join(repr(m) for m in SPECULATIVE_METHODS)} (prompt lookup, no draft model)")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "disable_by_batch_size",
                     "acceptance_window", "backoff_steps"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"speculative {name} must be an integer, got {value!r}")
        if not 1 <= self.num_speculative_tokens <= 16:
            raise ConfigError(f"num_speculative_tokens must be in [1, 16], got {self.num_speculative_tokens}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is None and high is None:
            low = high = _VLLM_NGRAM_DEFAULT
        low = high if low is None else low
        high = low if high is None else high
        object.__setattr__(self, "prompt_lookup_min", low)
        object.__setattr__(self, "prompt_lookup_max", high)
        if not 1 <= low <= high:  # type: ignore[operator]
            raise ConfigError(f"prompt_lookup_min ({low}) must be >= 1 and at most prompt_lookup_max ({high})")
        if high > 32:  # type: ignore[operator]
            raise ConfigError(f"prompt_lookup_max must be at most 32, got {high}")
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ConfigError(f"disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}")
        if self.acceptance_window < 1 or self.backoff_steps < 1:
            raise ConfigError("acceptance_window and backoff_steps must be >= 1, got "
                              f"{self.acceptance_window}, {self.backoff_steps}")
        if not 0.0 <= self.min_acceptance_rate <= 1.0:
            raise ConfigError(f"min_acceptance_rate must be in [0, 1], got {self.min_acceptance_rate}")

    @classmethod
    def parse(cls, value: str | dict[str, Any] | SpeculativeConfig | None) -> SpeculativeConfig | None:
        """From ``--speculative-config``'s JSON (or the same as a dict, as ``LLM(speculative_config=...)``
        takes it); None stays None. vLLM's older ``{"model": "[ngram]"}`` names the method too."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        spec = parse_json_object(value, "--speculative-config") if isinstance(value, str) else dict(value)
        model = spec.pop("model", None)
        if model in ("ngram", "[ngram]"):
            spec.setdefault("method", "ngram")
        elif model is not None:
            raise ConfigError(f"speculative model {model!r}: draft models are not supported; swiftlm supports "
                              '"method": "ngram" (prompt lookup), which needs no model')
        if spec.get("method") == "[ngram]":
            spec["method"] = "ngram"
        if "method" not in spec:
            raise ConfigError('the speculative config needs a "method"; swiftlm supports "ngram"')
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ConfigError(f"unknown speculative config keys: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "num_speculative_tokens" not in spec:
            raise ConfigError("the speculative config needs num_speculative_tokens (the draft length, e.g. 3)")
        return cls(**spec)


QUANTIZATIONS = ("int8", "int4")
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")  # the command line's --dtype
DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str
    dtype: str = "auto"
    device: str = "cpu"
    seed: int = 0
    quantization: str | None = None  # None | "int8" | "int4": weight-only, applied at load
    # oneDNN-packed copies of the linear weights (CPU): None = only where swiftlm's bf16 GEMV kernel
    # does not run (then the packed copy replaces the weight); True = also next to the kernel's weight
    # (faster multi-row matmuls, twice the memory); False = never
    cpu_prepack: bool | None = None
    cpu_kernels: bool = True  # the CPU backend with swiftlm's compiled kernels (False: the plain torch backend)
    # CPU kernels to leave out on purpose (names in backends/cpu/ops.py KERNELS: "amx", "decode_layers", ...)
    cpu_disable_kernels: tuple[str, ...] = ()
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    chat_template: str | None = None  # Jinja source replacing the tokenizer's own template
    # default sampling values over the checkpoint's generation_config.json (vLLM's
    # --override-generation-config): temperature, top_p, top_k, min_p, repetition_penalty
    generation_overrides: dict[str, Any] = field(default_factory=dict)
    # a GGUF file in the hub repo ``model`` names (downloaded with hf_hub_download); None: ``model`` is
    # a Hugging Face directory or hub id, a .gguf path, a directory holding one .gguf, or "repo:QUANT"
    gguf_file: str | None = None
    speculative: SpeculativeConfig | None = None  # speculative decoding (prompt lookup); None: off
    enforce_eager: bool = False  # CUDA: capture no decode graphs, run every step eagerly (vLLM's --enforce-eager)
    # overlapped steps (vLLM's --async-scheduling): the host schedules and builds step N+1 while the
    # device runs step N; None: the backend's default (where it measures faster)
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(self.dtype, self.dtype))  # vLLM's "half", "float"
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ConfigError(f"quantization must be one of {', '.join(QUANTIZATIONS)} or none, got {self.quantization!r}")


@dataclass(frozen=True, slots=True)
class ApiKeySpec:
    """One API key the server accepts (``--api-key``, or a line of ``--api-key-file``), with its own
    rate limits: requests and tokens (prompt + generated) per minute; None: the server's defaults."""

    key: str = field(repr=False)
    name: str | None = None
    rpm: int | None = None
    tpm: int | None = None

    def __post_init__(self) -> None:
        if not self.key or any(c.isspace() for c in self.key):
            raise ConfigError("an API key must be a non-empty string without spaces")
        for limit in ("rpm", "tpm"):
            value = getattr(self, limit)
            if value is not None and value < 1:
                raise ConfigError(f"{limit} must be >= 1, got {value}")


REASONING_PARSERS = ("qwen3", "deepseek_r1", "none")
TOOL_CALL_PARSERS = ("hermes", "none")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The HTTP front: where it listens, who may call it, and request defaults."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    # more keys, each with its own name and limits (--api-key-file); any of them (or api_key) is accepted
    api_keys: tuple[ApiKeySpec, ...] = ()
    default_rpm: int | None = None  # per key (or for all callers, without keys): requests per minute
    default_tpm: int | None = None  # per key: prompt + generated tokens per minute
    served_model_names: tuple[str, ...] = ()  # names clients may use, the first one reported; (): the model argument
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_n: int = 16
    retry_after_s: int = 1  # Retry-After sent with 429 when the queue is full
    log_level: str = "info"
    # how the answer's <think>...</think> reaches the client: "qwen3" and "deepseek_r1" (the same
    # parser for Qwen3) move it to the reasoning fields; "none" leaves it inline in content, as vLLM
    # does without a reasoning parser
    reasoning_parser: str = "qwen3"
    # how tool calls in the answer reach the client: "hermes" (Qwen3's <tool_call> format) parses
    # them into message.tool_calls when the request offers tools; "none" leaves them as text in content
    tool_call_parser: str = "hermes"
    # the Batch API (/v1/files, /v1/batches): on unless turned off; jobs and files live in
    # batch_storage_dir (None: ~/.cache/swiftlm/batches); finished jobs are deleted after
    # batch_retention_hours (None: kept)
    # CORS as vLLM sets it up: the origins, methods and headers browsers may use ("*": any)
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    enable_batch_api: bool = True
    max_request_bytes: int = 16 * 1024 * 1024  # larger request bodies are a 413 (uploads: max_batch_file_bytes)
    batch_storage_dir: str | None = None
    batch_retention_hours: float | None = 168.0
    response_retention_hours: float | None = 720.0  # stored Responses API responses (None: kept); OpenAI keeps 30 days
    max_batch_file_bytes: int = 200 * 1024 * 1024  # OpenAI's limit
    batch_max_concurrent_lines: int = 64  # lines handed to the engine at once (they wait at background priority)
    batch_storage_shared: bool = False  # replicas share batch_storage_dir: each job runs under a lease (batch/leases.py)
    # connections: a request's headers and body must arrive within request_receive_timeout_s of its
    # first byte (else 408 and close); idle keep-alive connections close after timeout_keep_alive_s;
    # connections beyond max_concurrent_connections get a 503 (None: no limit)
    request_receive_timeout_s: float = 60.0
    timeout_keep_alive_s: float = 5.0
    max_concurrent_connections: int | None = None
    enable_debug_endpoints: bool = False  # GET /debug/kv: the KV pool's integrity and block accounting
    # thinking when a request leaves it open (row 5 of swiftlm.core.generation.resolve_thinking_choice):
    # "auto" (the rule set in thinking_rules_path, None: swiftlm's default rules), "on", "off"; None: on
    default_thinking: str | None = None
    thinking_rules_path: str | None = None
    auto_thinking_budget: int | None = None  # reasoning tokens when "auto" turned thinking on (None: no limit)
    # the response cache (swiftlm.server.answer_cache.policy): None (off), "memory" or "sqlite:PATH"; entries
    # expire after response_cache_ttl_s (None: never) and the least recently used go beyond
    # response_cache_max_entries entries or response_cache_max_bytes bytes of stored answers
    response_cache: str | None = None
    response_cache_ttl_s: float | None = 3600.0
    response_cache_max_entries: int = 10000
    response_cache_max_bytes: int = 256 * 1024 * 1024
    enable_ui: bool = True  # the web playground at / (--no-ui, --no-webui)
    metric_names: str = "swiftlm"  # "vllm": /metrics also exports vLLM's names of the metrics that mean the same

    def __post_init__(self) -> None:
        object.__setattr__(self, "served_model_names", tuple(self.served_model_names))
        for name in ("allowed_origins", "allowed_methods", "allowed_headers"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
            if not all(isinstance(v, str) for v in getattr(self, name)):
                raise ConfigError(f"{name} must be a list of strings, got {getattr(self, name)!r}")
        object.__setattr__(self, "api_keys", tuple(self.api_keys))
        for name in ("default_rpm", "default_tpm", "max_concurrent_connections"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.request_receive_timeout_s <= 0 or self.timeout_keep_alive_s <= 0:
            raise ConfigError("request_receive_timeout_s and timeout_keep_alive_s must be > 0")
        if self.max_request_bytes < 1:
            raise ConfigError(f"max_request_bytes must be >= 1, got {self.max_request_bytes}")
        if self.max_batch_file_bytes < 1:
            raise ConfigError(f"max_batch_file_bytes must be >= 1, got {self.max_batch_file_bytes}")
        if self.batch_max_concurrent_lines < 1:
            raise ConfigError(f"batch_max_concurrent_lines must be >= 1, got {self.batch_max_concurrent_lines}")
        if self.response_retention_hours is not None and self.response_retention_hours <= 0:
            raise ConfigError(f"response_retention_hours must be > 0, got {self.response_retention_hours}")
        if self.batch_retention_hours is not None and self.batch_retention_hours <= 0:
            raise ConfigError(f"batch_retention_hours must be > 0, got {self.batch_retention_hours}")
        if not all(isinstance(name, str) and name for name in self.served_model_names):
            raise ConfigError(f"served model names must be non-empty strings, got {self.served_model_names!r}")
        if self.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                              f"got {self.reasoning_parser!r}")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ConfigError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                              f"got {self.tool_call_parser!r}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.metric_names not in ("swiftlm", "vllm"):
            raise ConfigError(f"metric_names must be 'swiftlm' or 'vllm', got {self.metric_names!r}")
        if self.max_n < 1:
            raise ConfigError(f"max_n must be >= 1, got {self.max_n}")
        if self.default_thinking not in (None, "auto", "on", "off"):
            raise ConfigError(f"default_thinking must be auto, on or off, got {self.default_thinking!r}")
        if self.auto_thinking_budget is not None and self.auto_thinking_budget < 0:
            raise ConfigError(f"auto_thinking_budget must be >= 0, got {self.auto_thinking_budget}")
        if self.response_cache is not None and not (
            self.response_cache == "memory" or (self.response_cache.startswith("sqlite:") and len(self.response_cache) > 7)
        ):
            raise ConfigError(f"response_cache must be memory or sqlite:PATH, got {self.response_cache!r}")
        if self.response_cache_ttl_s is not None and self.response_cache_ttl_s <= 0:
            raise ConfigError(f"response_cache_ttl_s must be > 0, got {self.response_cache_ttl_s}")
        if self.response_cache_max_entries < 1 or self.response_cache_max_bytes < 1:
            raise ConfigError("response_cache_max_entries and response_cache_max_bytes must be >= 1")


def parse_json_object(text: str, flag: str) -> dict[str, Any]:
    """A JSON object given on the command line (e.g. ``--default-chat-template-kwargs``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{flag} must be a JSON object: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object, got {type(value).__name__}")
    return value
