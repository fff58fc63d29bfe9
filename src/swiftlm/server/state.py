"""Per-app server state, made by ``create_app`` and reached through ``request.app.state``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request

from swiftlm.config import ServerConfig
from swiftlm.core.generation import GenerationRequest
from swiftlm.engine.async_engine import AsyncEngine, EngineDeadError
from swiftlm.engine.engine import EngineStats, RequestError
from swiftlm.engine.scheduler import QueueFullError
from swiftlm.frontend.input_processor import ChatDefaults, ChatInput, InputProcessor, PreparedChat
from swiftlm.frontend.output_processor import RequestText
from swiftlm.frontend.text_stream import TextStream
from swiftlm.sampling import SamplingParams
from swiftlm.server.answer_cache.policy import (
    ResponseCache,
    cache_identity,
    open_response_cache,
    server_identity,
)
from swiftlm.server.batch.api import BatchApi, default_storage_dir
from swiftlm.server.errors import OpenAIError, bad_request, not_found, service_unavailable, too_many_requests
from swiftlm.server.model_identity import model_identity
from swiftlm.server.operations.auth import Caller, KeyRing
from swiftlm.server.operations.metrics import ServerMetrics
from swiftlm.server.operations.quotas import RateLimits
from swiftlm.server.responses.store import ResponseStore
from swiftlm.server.session_transcripts import SessionTranscripts
from swiftlm.text.session_prompt import SessionPrompts
from swiftlm.text.thinking_rules import ThinkingRules, load_thinking_rules


@dataclass(slots=True)
class ServerState:
    """``model_name``: the name served when ``config.served_model_names`` is empty; after init the
    first served name (reported by default, and the metrics' label). ``model_names``: all of them."""

    config: ServerConfig
    model_name: str
    model_names: tuple[str, ...] = field(init=False)
    engine: AsyncEngine | None = None  # None until the model is loaded (/health answers 503)
    session_prompts: SessionPrompts | None = None
    inputs: InputProcessor | None = None  # the one road from an API's input to the engine's request
    metrics: ServerMetrics = field(init=False)
    shutting_down: bool = False
    batch_api: BatchApi | None = None  # None: the Batch API is off (--disable-batch-api)
    responses: ResponseStore | None = None  # the Responses API's stored responses
    keys: KeyRing = field(init=False)
    limits: RateLimits = field(init=False)
    thinking_rules: ThinkingRules = field(init=False)  # enable_thinking "auto" (--thinking-rules)
    response_cache: ResponseCache | None = None  # --response-cache; made once the model's identity is known

    def __post_init__(self) -> None:
        self.keys = KeyRing(self.config)
        self.limits = RateLimits()
        self.model_names = self.config.served_model_names or (self.model_name,)
        self.model_name = self.model_names[0]
        self.metrics = ServerMetrics(self.model_name, self.engine_stats)
        self.thinking_rules = load_thinking_rules(self.config.thinking_rules_path)
        if self.config.metric_names == "vllm":
            self.metrics.export_vllm_names()

    def attach(self, engine: AsyncEngine) -> None:
        self.engine = engine
        transcripts = None
        if self.config.batch_storage_shared:  # replicas: transcripts where every replica reads them
            transcripts = SessionTranscripts(self.storage_dir, engine.engine.config.cache.session_ttl)
        self.session_prompts = SessionPrompts(engine.tokenizer, engine.session_tokens, transcripts=transcripts)
        cfg = self.config
        defaults = ChatDefaults(cfg.default_chat_template_kwargs, cfg.default_thinking, self.thinking_rules,
                                cfg.auto_thinking_budget)
        self.inputs = InputProcessor(engine.tokenizer, self.session_prompts, engine.engine.validate,
                                     engine.engine.max_model_len, defaults)
        if self.config.response_cache is not None:
            server = server_identity(self.config, self.thinking_rules)
            self.response_cache = open_response_cache(self.config, cache_identity(model_identity(engine.engine), server))
            self.metrics.watch_response_cache(self.response_cache.stats)
        self.metrics.watch_device(engine.engine)

    @property
    def storage_dir(self) -> Path:
        """Where the Batch API's jobs, stored responses and (on replicas) session transcripts live."""
        root = self.config.batch_storage_dir
        return Path(root).expanduser() if root else default_storage_dir(self.config.port)

    def close_response_cache(self) -> None:
        if self.response_cache is not None:
            self.response_cache.close()

    @property
    def scheduling_policy(self) -> str:
        return self.engine.engine.config.scheduler.scheduling_policy if self.engine is not None else "fcfs"

    def engine_stats(self) -> EngineStats | None:
        return self.engine.engine.stats() if self.engine is not None else None

    def ready_engine(self) -> AsyncEngine:
        if self.shutting_down:
            raise service_unavailable("The server is shutting down.")
        if self.engine is None:
            raise service_unavailable("The model is still loading; retry shortly.", retry_after_s=2)
        if self.engine.engine.fatal_error is not None:
            raise service_unavailable(f"The engine failed and needs a restart: {self.engine.engine.fatal_error}")
        return self.engine

    def check_model(self, model: str | None) -> str:
        """The name a response reports: the one the client sent (any served name), else the first."""
        if model is None:
            return self.model_name
        if model not in self.model_names:
            served = ", ".join(f"'{name}'" for name in self.model_names)
            raise not_found(
                f"The model '{model}' does not exist; this server serves {served}.",
                param="model",
                code="model_not_found",
            )
        return model

    def response_model(self, model: str | None) -> str:
        """The ``model`` field of a response to a request that named ``model`` (already checked)."""
        return self.model_name if model is None else model

    def admit(self, caller: Caller, prompt_tokens: int) -> None:
        """Count one HTTP request against ``caller``'s rate limits, or raise its 429."""
        try:
            self.limits.admit(caller, prompt_tokens)
        except OpenAIError:
            self.metrics.observe_rejected("rate_limit")
            raise

    def request(self, request_id: str, token_ids: list[int], params: SamplingParams, prompt_param: str,
                **fields: Any) -> GenerationRequest:
        """The engine's request from the input processor (``InputProcessor.request``: checked once, a
        refusal the 400 that names the field); ``prompt_param``: what this API calls the prompt
        ("messages", "prompt"). ``fields``: the rest of ``GenerationRequest``'s."""
        self.ready_engine()
        with self._refusals(prompt_param):
            return self.inputs.request(request_id, token_ids, params, **fields)

    def chat_turn(self, request_id: str, chat: ChatInput, **fields: Any) -> PreparedChat:
        """A chat turn made by the input processor (``InputProcessor.chat_turn``), its refusals 400s."""
        self.ready_engine()
        with self._refusals("messages"):
            return self.inputs.chat_turn(request_id, chat, **fields)

    @contextmanager
    def _refusals(self, prompt_param: str) -> Iterator[None]:
        try:
            yield
        except RequestError as exc:
            self.metrics.observe_rejected("bad_request")
            param = prompt_param if exc.param == "prompt" else exc.param
            raise bad_request(str(exc), param=param, code=exc.code) from exc

    def submit(self, request: GenerationRequest, caller: Caller) -> TextStream:
        """Hand a request made by ``request`` to the engine, turning refusals into HTTP errors;
        the tokens it generates count against ``caller``'s token rate. What the engine returns is
        read as text in the reader's thread (``TextStream``)."""
        engine = self.ready_engine()
        try:
            stream = TextStream(engine.submit(request, validated=True), RequestText(request, engine.tokenizer))
        except QueueFullError as exc:
            self.metrics.observe_rejected("queue_full")
            raise too_many_requests(self.config.retry_after_s, str(exc)) from exc
        except RequestError as exc:
            self.metrics.observe_rejected("bad_request")
            raise bad_request(str(exc)) from exc
        except EngineDeadError as exc:
            self.metrics.observe_rejected("shutting_down")
            raise service_unavailable(str(exc)) from exc
        if caller.tpm is not None and not caller.background:
            stream.observe(lambda out: self.limits.charge(caller, sum(len(o.token_ids) for o in out.outputs)))
        return stream


def server_state(request: Request) -> ServerState:
    return request.app.state.swiftlm


def output_error(error: str) -> OpenAIError:
    """An engine-side failure of one request, as the HTTP error to answer with."""
    if "max_queue_wait" in error or error.startswith("queue_timeout"):
        return service_unavailable(f"The request waited too long in the queue: {error}", retry_after_s=1)
    return OpenAIError(500, f"The request failed inside the engine: {error}")


def stream_failure(exc: BaseException) -> OpenAIError:
    """An exception raised while iterating a request's outputs, as an HTTP error."""
    if isinstance(exc, QueueFullError):
        return too_many_requests(1, str(exc))
    if isinstance(exc, RequestError):
        return bad_request(str(exc))
    if isinstance(exc, EngineDeadError):
        return service_unavailable(str(exc))
    return OpenAIError(500, f"The request failed inside the engine: {exc}")
