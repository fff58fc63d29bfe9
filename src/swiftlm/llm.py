"""LLM: the offline API. Submits all prompts to the engine at once and steps until they finish."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from itertools import count
from typing import Any

from tqdm import tqdm

from swiftlm.backends import Backend
from swiftlm.config import (
    REASONING_PARSERS,
    CacheConfig,
    ConfigError,
    EngineConfig,
    SchedulerConfig,
    SpeculativeConfig,
)
from swiftlm.core.generation import GenerationRequest
from swiftlm.core.outputs import CompletionOutput, RequestOutput
from swiftlm.engine.engine import Engine
from swiftlm.frontend.answer import read_answer
from swiftlm.frontend.input_processor import ChatInput, InputProcessor
from swiftlm.frontend.output_processor import OutputProcessor
from swiftlm.sampling import SamplingParams
from swiftlm.text.session_prompt import SessionPrompts

Prompt = str | dict[str, Any]
_CACHE_KEYS = set(CacheConfig.__dataclass_fields__)
_SCHED_KEYS = set(SchedulerConfig.__dataclass_fields__)
_ENGINE_KEYS = {"seed", "quantization", "cpu_prepack", "cpu_kernels", "cpu_disable_kernels", "chat_template",
                "gguf_file", "generation_overrides", "speculative_config", "enforce_eager",
                "async_scheduling"}
# vLLM's LLM(...) arguments that change nothing here, and why (accepted so vLLM code runs as written)
VLLM_NO_OPS = {
    "enable_reasoning": "the offline API returns the text as generated, <think> included, as vLLM's does",
    "swap_space": "preempted requests are recomputed, never swapped to CPU memory",
    "trust_remote_code": "no code from a checkpoint is ever run",
    "disable_log_stats": "no periodic stats line is logged",
    "tokenizer_mode": "the model's tokenizer.json is always used",
    "max_seq_len_to_capture": "the CUDA decode graphs cover every length up to max_model_len",
    "disable_custom_all_reduce": "one device: there is no all-reduce",
    "num_scheduler_steps": "one engine step per schedule",
}
# vLLM's arguments that are accepted only at the value swiftlm runs with
_VLLM_FIXED: dict[str, tuple[tuple[Any, ...], str]] = {
    "tensor_parallel_size": ((1,), "one device per replica: scale out with replicas"),
    "pipeline_parallel_size": ((1,), "one device per replica: scale out with replicas"),
    "cpu_offload_gb": ((0, 0.0), "weights are not offloaded"),
    "revision": ((None, "main"), "the hub snapshot or local directory given as model is used"),
}
_PROGRESS_MIN = 16  # show a progress bar from this many prompts on
logger = logging.getLogger("swiftlm")


def engine_config(model: str, dtype: str = "auto", device: str = "cpu", **kwargs: Any) -> EngineConfig:
    """Split flat keyword arguments (vLLM style) into the engine's config dataclasses.

    Besides the fields of CacheConfig and SchedulerConfig (``max_model_len``, ``block_size``,
    ``gpu_memory_utilization``, ``max_num_seqs`` ...), vLLM's constructor names are accepted:
    ``speculative_config`` (vLLM's: a dict such as ``{"method": "ngram", "num_speculative_tokens": 3,
    "prompt_lookup_max": 4}``, its JSON text, or a SpeculativeConfig), ``reasoning_parser`` (one of REASONING_PARSERS; the offline text keeps its reasoning inline
    either way), ``tokenizer`` (None or the model itself), the no-ops of ``VLLM_NO_OPS`` and the
    fixed values of ``_VLLM_FIXED``. Anything else is a TypeError listing what is known.
    """
    kwargs = _take_vllm_arguments(model, device, kwargs)
    known = _CACHE_KEYS | _SCHED_KEYS | _ENGINE_KEYS
    unknown = set(kwargs) - known
    if unknown:
        everything = sorted(known | set(VLLM_NO_OPS) | set(_VLLM_FIXED) | {"reasoning_parser", "tokenizer"})
        raise TypeError(f"unknown engine arguments: {', '.join(sorted(unknown))}; known: {', '.join(everything)}")
    cache = CacheConfig(**{k: v for k, v in kwargs.items() if k in _CACHE_KEYS})
    sched = SchedulerConfig(**{k: v for k, v in kwargs.items() if k in _SCHED_KEYS})
    quantization = kwargs.get("quantization")
    return EngineConfig(
        model=model, dtype=dtype, device=device, seed=kwargs.get("seed", 0),
        quantization=None if quantization in (None, "none") else quantization,
        cpu_prepack=kwargs.get("cpu_prepack"), cpu_kernels=kwargs.get("cpu_kernels", True),
        cpu_disable_kernels=tuple(kwargs.get("cpu_disable_kernels", ())),
        cache=cache, scheduler=sched, chat_template=kwargs.get("chat_template"), gguf_file=kwargs.get("gguf_file"),
        generation_overrides=dict(kwargs.get("generation_overrides") or {}),
        speculative=SpeculativeConfig.parse(kwargs.get("speculative_config")),
        enforce_eager=bool(kwargs.get("enforce_eager", False)),
        async_scheduling=kwargs.get("async_scheduling"),
    )


def _take_vllm_arguments(model: str, device: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` less vLLM's arguments that have no config field here, after checking them and
    logging, in one line, those asked for that do not happen on ``device``."""
    kwargs = dict(kwargs)
    parser = kwargs.pop("reasoning_parser", None)
    if parser is not None and parser not in REASONING_PARSERS:
        raise ConfigError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, got {parser!r}")
    tokenizer = kwargs.pop("tokenizer", None)
    if tokenizer not in (None, model):
        raise ConfigError(f"tokenizer {tokenizer!r}: swiftlm loads the tokenizer from the model directory ({model!r})")
    for name, (allowed, why) in _VLLM_FIXED.items():
        if name in kwargs and kwargs.pop(name) not in allowed:
            raise ConfigError(f"{name} must be {allowed[0]!r} here: {why}")
    given = {name: kwargs.pop(name) for name in VLLM_NO_OPS if name in kwargs}
    unmet = []  # asked for, and not what happens here
    if given.get("swap_space"):
        unmet.append(f"swap_space ({VLLM_NO_OPS['swap_space']})")
    if (given.get("num_scheduler_steps") or 1) > 1:
        unmet.append(f"num_scheduler_steps ({VLLM_NO_OPS['num_scheduler_steps']})")
    if kwargs.get("gpu_memory_utilization") is not None and not device.startswith("cuda"):
        unmet.append("gpu_memory_utilization (on a CPU the KV pool keeps its own budget, kv_cache_memory)")
    if unmet:
        logger.warning("LLM arguments with no effect on %s: %s", device, "; ".join(unmet))
    return kwargs


class LLM:
    """``LLM(model, dtype, device, **engine_kwargs)`` with ``generate`` and ``chat``.

    Engine keyword arguments are the fields of CacheConfig and SchedulerConfig, e.g.
    ``max_num_seqs``, ``max_num_batched_tokens``, ``enable_prefix_caching``, ``num_blocks``, and
    vLLM's constructor names (``engine_config``), so that
    ``LLM(model=..., enable_reasoning=True, reasoning_parser="deepseek_r1", gpu_memory_utilization=0.82,
    max_model_len=8192, block_size=32)`` runs as written.
    """

    def __init__(
        self, model: str, dtype: str = "auto", device: str = "cpu", backend: Backend | None = None, **engine_kwargs: Any
    ) -> None:
        """``backend``: a device backend built by the caller (default: chosen from the config)."""
        self.engine = Engine(engine_config(model, dtype, device, **engine_kwargs), backend)
        self.tokenizer = self.engine.tokenizer
        self._session_prompts = SessionPrompts(self.tokenizer, self.engine.session_tokens)
        self.inputs = InputProcessor(self.tokenizer, self._session_prompts, self.engine.validate,
                                     self.engine.max_model_len)
        self._outputs = OutputProcessor(self.tokenizer)  # the engine's token ids -> text
        self._ids = count()

    def default_sampling_params(self) -> SamplingParams:
        return SamplingParams.from_generation_config(self.tokenizer.generation_defaults)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
        session_ids: Sequence[str | None] | None = None,
    ) -> list[RequestOutput]:
        batch = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        if sampling_params is None:
            params_list = [self.default_sampling_params()] * len(batch)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(batch)
        else:
            params_list = list(sampling_params)
        ids = []
        for i, (prompt, params) in enumerate(zip(batch, params_list, strict=True)):
            request = self._request(prompt, params, session_ids[i] if session_ids else None, stream=False)
            self._add(request)
            ids.append(request.request_id)
        return self._run(ids, use_tqdm if use_tqdm is not None else len(ids) >= _PROGRESS_MIN)

    def chat(
        self,
        messages: list[dict[str, Any]],
        sampling_params: SamplingParams | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        session_id: str | None = None,
        *,
        enable_thinking: bool | None = None,
    ) -> RequestOutput:
        """One chat turn; thinking as in ``chat_prompt``. With ``session_id``, ``messages`` may be
        the whole conversation or only the new messages (appended to the session's transcript;
        see ``swiftlm.text.session_prompt``); ``close_session`` starts over. The turn is formed as
        the server forms its chat requests (``InputProcessor.chat_turn``)."""
        chat = ChatInput(messages, sampling_params or self.default_sampling_params(), enable_thinking=enable_thinking,
                         template_kwargs=chat_template_kwargs, tools=tools, session_id=session_id)
        turn = self.inputs.chat_turn(str(next(self._ids)), chat, final_only=True)  # RequestError: a ValueError
        self._add(turn.request)
        out = self._run([turn.request.request_id], False)[0]
        if session_id is not None:
            self.record_turn(session_id, turn.messages, {"thinking": turn.thinking.thinking}, out, tools)
        return out

    def record_turn(
        self,
        session_id: str,
        messages: list[dict[str, Any]],
        prompt: dict[str, Any],
        out: RequestOutput,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        """Remember a finished session turn so the next one extends its real token stream."""
        seq = out.outputs[0]
        answer = read_answer(seq.text, prompt["thinking"]).content or ""
        self._session_prompts.record(session_id, messages, answer, out.prompt_token_ids + seq.token_ids, tools)

    def stream(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        session_id: str | None = None,
    ) -> Iterator[RequestOutput]:
        """Generate one prompt, yielding output deltas as tokens arrive (the last one finished).

        A dict prompt may carry ``"thinking": True`` when it opens a reasoning section.
        """
        params = sampling_params or self.default_sampling_params()
        request = self._request(prompt, params, session_id, stream=True)
        rid = request.request_id
        self._add(request)
        try:
            while True:
                for out in self._step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            self.engine.abort(rid)  # no-op once finished; frees the blocks if the caller stops early
            self._outputs.forget(rid)

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        session_id: str | None = None,
        *,
        enable_thinking: bool | None = None,
    ) -> dict[str, Any]:
        """The prompt ``chat`` sends: text, token ids (extending the session's real token stream
        when there is one, see ``swiftlm.text.session_prompt``) and ``thinking``, whether it opens a
        reasoning section, decided as for every front end (``InputProcessor.render``: the top-level
        ``enable_thinking``, then ``chat_template_kwargs["enable_thinking"]``); the template renders
        with the result."""
        choice, rendered = self.inputs.render(messages, enable_thinking=enable_thinking,
                                              template_kwargs=chat_template_kwargs, tools=tools, session_id=session_id)
        return {"prompt": rendered.text, "prompt_token_ids": rendered.token_ids, "thinking": choice.thinking}

    def close_session(self, session_id: str) -> bool:
        self._session_prompts.forget(session_id)
        return self.engine.close_session(session_id)

    def _request(
        self, prompt: Prompt, params: SamplingParams, session_id: str | None, stream: bool
    ) -> GenerationRequest:
        """The engine request for one prompt, checked (``InputProcessor.request``). ``thinking`` is
        carried by a dict prompt (as ``chat_prompt`` resolved it); a plain text or token prompt opens
        no reasoning section."""
        text, token_ids = self._prompt_ids(prompt)
        return self.inputs.request(
            str(next(self._ids)), token_ids, params, prompt=text,
            thinking=bool(prompt.get("thinking")) if isinstance(prompt, dict) else False,
            session_id=session_id, stream=stream,
            final_only=not stream,  # generate() reads each request once, at its end
        )

    def _add(self, request: GenerationRequest) -> None:
        self.engine.add_request(request, validated=True)  # by ``_request``
        self._outputs.add(request)

    def _step(self) -> list[RequestOutput]:
        """One engine step, read as text; sequences a stop string ended are stopped in the engine
        before the next step is scheduled (as the engine itself did when it matched them)."""
        outputs, stops = self._outputs.process(self.engine.step())
        for stop in stops:
            self.engine.stop_sequence(stop)
        return outputs

    def _prompt_ids(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt["prompt"]
        return self.inputs.text(prompt)

    def _run(self, request_ids: list[str], show_progress: bool) -> list[RequestOutput]:
        finals: dict[str, RequestOutput] = {}
        merged: dict[str, dict[int, CompletionOutput]] = {rid: {} for rid in request_ids}
        prompt_logprobs: dict[str, list[dict[int, float] | None]] = {}  # sent once, in some delta
        bar = tqdm(total=len(request_ids), desc="generate", disable=not show_progress)
        pending = set(request_ids)
        while pending:
            for out in self._step():
                if out.request_id not in merged:
                    continue
                seqs = merged[out.request_id]
                for delta in out.outputs:
                    _merge(seqs, delta)
                if out.prompt_logprobs is not None:
                    prompt_logprobs[out.request_id] = out.prompt_logprobs
                if out.finished:
                    out.outputs = [seqs[i] for i in sorted(seqs)]
                    out.prompt_logprobs = prompt_logprobs.get(out.request_id)
                    finals[out.request_id] = out
                    pending.discard(out.request_id)
                    bar.update(1)
        bar.close()
        return [finals[rid] for rid in request_ids]


def _merge(seqs: dict[int, CompletionOutput], delta: CompletionOutput) -> None:
    acc = seqs.get(delta.index)
    if acc is None:
        seqs[delta.index] = CompletionOutput(
            index=delta.index,
            text=delta.text,
            token_ids=list(delta.token_ids),
            cumulative_logprob=delta.cumulative_logprob,
            logprobs=list(delta.logprobs) if delta.logprobs is not None else None,
            finish_reason=delta.finish_reason,
            stop_reason=delta.stop_reason,
        )
        return
    acc.text += delta.text
    acc.token_ids.extend(delta.token_ids)
    if acc.logprobs is not None and delta.logprobs is not None:
        acc.logprobs.extend(delta.logprobs)
    acc.cumulative_logprob = delta.cumulative_logprob
    acc.finish_reason = delta.finish_reason
    acc.stop_reason = delta.stop_reason
