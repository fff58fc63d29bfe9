"""Engine: the step loop. schedule -> execute -> update (append, stop checks, free, emit deltas).

The engine's outputs are token ids: text (detokenising, stop strings) is the front end's
(``swiftlm.frontend.output_processor``), on the caller's side of the engine loop."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import torch

from swiftlm.backends import Backend, build_backend
from swiftlm.backends.kv_cache import num_blocks_for
from swiftlm.backends.kv_quant import kv_format
from swiftlm.cache.kv_manager import KVCacheManager
from swiftlm.config import EngineConfig
from swiftlm.core.generation import GenerationRequest
from swiftlm.core.outputs import RequestOutput, SequenceStop
from swiftlm.core.request import FinishReason, Request, RequestStatus
from swiftlm.core.schedule import SchedulerOutput
from swiftlm.engine.heap import settle_heap
from swiftlm.engine.live_requests import (
    LiveRequest,
    LiveRequests,
    needs_host_tokens,
    plain_draw,
    plain_greedy,
    sampling_row,
)
from swiftlm.engine.reports import EngineStats, KvReport, engine_stats, kv_report
from swiftlm.engine.scheduler import Scheduler
from swiftlm.engine.speculation import Speculator
from swiftlm.engine.step_launch import DeviceThread, LaunchedStep, StepEvent
from swiftlm.engine.validation import RequestError, RequestLimits, validate_request
from swiftlm.model.loader import load_model, load_tokenizer, resolve_model
from swiftlm.runner.block_tables import DecodeTables
from swiftlm.runner.runner import LaunchedRun, ModelRunner, PreparedStep, SampledToken
from swiftlm.runner.sampling_row import PlainRows, SamplingRow
from swiftlm.runner.structured import GrammarCompiler, StructuredOutputError
from swiftlm.sampling import SamplingParams

logger = logging.getLogger(__name__)


class Engine:
    """Owns the model, the KV cache, the scheduler and every request's output stream.

    Not thread-safe: ``AsyncEngine`` serialises access from its loop thread.
    """

    def __init__(self, config: EngineConfig, backend: Backend | None = None) -> None:
        """``backend``: the device backend to run on (default ``build_backend(config)``); tests pass
        one built explicitly, e.g. ``CpuBackend(kernels=...)`` or ``TorchBackend("cpu")``."""
        self.config = config
        self.source = resolve_model(config.model, config.gguf_file)
        self.model_dir = self.source.directory
        t0 = time.perf_counter()
        # the tokenizer (~0.5 s of parsing, mostly outside the GIL) loads while the weights do
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="swiftlm-tokenizer") as pool:
            tokenizer = pool.submit(load_tokenizer, self.source, config.chat_template)
            self.backend = backend if backend is not None else build_backend(config)
            self.dtype = self.backend.resolve_dtype(config.dtype)  # auto: what the backend runs fastest
            self.model = load_model(self.source, self.dtype, config.device)
            self.backend.prepare(self.model, config.quantization)
            self.tokenizer = tokenizer.result()
            if config.generation_overrides:
                self.tokenizer = self.tokenizer.with_generation_defaults(config.generation_overrides)
        self.load_seconds = time.perf_counter() - t0
        mcfg = self.model.config
        self.max_model_len = min(config.scheduler.max_model_len, mcfg.max_position_embeddings)
        cache = config.cache
        if cache.block_size is None:  # the backend's choice, for this cache's format
            cache = replace(cache, block_size=self.backend.default_block_size(kv_format(cache.kv_cache_dtype)))
        self.cache_config = cache
        sched = config.scheduler
        useful_tokens = 2 * sched.max_num_seqs * self.max_model_len
        kv_dtype = self.model.model.embed_tokens.weight.dtype
        # rows that sample: one per running request, 1 + K of each speculating one
        draft = config.speculative.num_speculative_tokens if config.speculative else 0
        head_rows = min(sched.max_num_batched_tokens, sched.max_num_seqs * (1 + draft))
        activation = self.backend.activation_bytes(self.model, cache.block_size, sched.max_num_batched_tokens, head_rows)
        num_blocks = num_blocks_for(mcfg, cache, kv_dtype, useful_tokens, config.device, activation)
        self.kv_cache = self.backend.allocate_kv_cache(
            mcfg, num_blocks, cache.block_size, kv_dtype, kv_format(cache.kv_cache_dtype)
        )
        self.kv = KVCacheManager(
            num_blocks, cache.block_size, cache.enable_prefix_caching, cache.session_ttl, cache.max_session_tokens
        )
        self.scheduler = Scheduler(config.scheduler, self.kv)
        self.limits = RequestLimits(mcfg.vocab_size, self.max_model_len, cache.block_size,
                                    self.kv.pool.num_usable_blocks, speculative=config.speculative is not None)
        self.speculator = Speculator(config.speculative, self.max_model_len) if config.speculative else None
        # decode steps' block tables, kept between steps: a row per running request (twice the
        # seats, so that rows of requests that left are reclaimed rarely), blocks for the context
        tables = DecodeTables(2 * sched.max_num_seqs, -(-self.max_model_len // cache.block_size))
        self.runner = ModelRunner(self.model, self.kv_cache, self.backend, tables)
        # overlapped steps: one step in flight on the device thread while the host prepares the next
        self.async_scheduling = self.speculator is None and (
            config.async_scheduling if config.async_scheduling is not None
            else self.backend.overlaps_steps_by_default
        )
        self._device = DeviceThread()
        self._launched: LaunchedStep | None = None  # the step in flight, not landed yet
        self._num_steps = 0
        self.on_step_event: StepEvent | None = None  # tests and benchmarks: when steps are prepared and run
        warmed = self.backend.warm_up(self.model, sched.max_num_batched_tokens, head_rows)
        self.live = LiveRequests()  # each request's sequences and what they have not reported yet
        self.grammars = GrammarCompiler(self.tokenizer, self.model.config.vocab_size)
        self.num_aborted = 0
        self.num_failed_steps = 0  # model steps that raised (their requests failed)
        self.num_failed_rows = 0  # requests failed alone for non-finite logits
        self.fatal_error: str | None = None  # set when a step failed in a way the process cannot recover from
        ids = [i for i in (self.tokenizer.think_end_id,) if i is not None]
        self._think_end_ids = tuple(ids + self.tokenizer.encode("\n\n")) if ids else ()
        start = self.tokenizer.think_start_id
        self._think_start_ids = (start, *self.tokenizer.encode("\n\n")) if start is not None else ()
        settle_heap()  # the collector set for a step loop (``engine.heap``)
        logger.info(
            "engine ready: %s dtype=%s blocks=%d x %d tokens (kv cache %s), max_model_len=%d, load %.2fs",
            self.model_dir, self.dtype, num_blocks, cache.block_size, cache.kv_cache_dtype, self.max_model_len,
            self.load_seconds,
        )
        logger.info("%s", self.backend.describe())
        if warmed:
            logger.info("%s", warmed)

    # -- requests in ------------------------------------------------------------------------
    def add_request(self, request: GenerationRequest, validated: bool = False) -> None:
        """Queue a request (``n`` sequences). Raises RequestError or QueueFullError.

        ``validated``: the caller ran ``validate`` on it already (``AsyncEngine.submit`` does, in the
        caller's thread, so that a bad request fails before a response starts): it is not run again.

        ``request.final_only``: report the request once, when it finishes (callers that wait for
        the whole answer skip per-token outputs). ``request.thinking`` (resolved by the front end)
        matters here only for the thinking budget, which needs a reasoning section to end."""
        request_id, params, session_id, prompt = (
            request.request_id, request.sampling_params, request.session_id, request.prompt
        )
        if request_id in self.live:
            raise RequestError(f"request id {request_id!r} is already in use")
        ids = list(request.prompt_token_ids)
        if not validated:
            self.validate(ids, params)
        now = time.monotonic() if request.arrival_time is None else request.arrival_time
        budgeted = request.thinking and params.thinking_budget is not None
        eos = frozenset(() if params.ignore_eos else self.tokenizer.eos_token_ids)
        children: list[Request] = []
        for i in range(params.n):
            child_params = params
            if params.n > 1 and params.seed is not None:
                child_params = params.with_updates(seed=params.seed + i)
            child = Request(
                token_limit=min(self.max_model_len, len(ids) + (params.max_tokens if params.max_tokens is not None
                                                                else self.max_model_len)),
                request_id=f"{request_id}-{i}" if params.n > 1 else request_id,
                prompt_token_ids=ids,
                sampling_params=child_params,
                arrival_time=now,
                eos_token_ids=eos | frozenset(params.stop_token_ids),
                session_id=session_id if i == 0 else None,
                prompt=prompt,
                index=i,
                wait_for=children[0] if i > 0 and self.kv.prefix_cache.enabled else None,
                thinking=budgeted,
                think_end_ids=self._think_end_ids,
                think_start_ids=self._think_start_ids,
                priority=request.priority,
                background=request.background,
            )
            children.append(child)
        if params.structured_outputs is not None:
            for child in children:
                try:
                    child.grammar = self.grammars.new_state(params.structured_outputs)
                except StructuredOutputError as exc:
                    raise RequestError(str(exc)) from exc
                child.grammar_start = None if request.thinking and self._think_end_ids else 0
        for k, child in enumerate(children):
            try:
                self.scheduler.add_request(child)
            except Exception:
                for added in children[:k]:
                    self.scheduler.finish(added, FinishReason.ABORT)
                raise
        # a whole answer with stop strings is reported token by token all the same: the front end
        # watches its text for them and stops it (``stop_sequence``)
        live = LiveRequest(request_id, prompt, ids, children, request.final_only,
                           needs_host_tokens=needs_host_tokens(params, budgeted),
                           plain_greedy=plain_greedy(params, budgeted), plain_draw=plain_draw(params, budgeted))
        self.live.add(live, stream_final_only=request.final_only and not params.stop)

    def validate(self, ids: Sequence[int], params: SamplingParams) -> None:
        """Raise RequestError if the request can never run here (``validate_request``). Reads only
        fixed state: any thread may call it."""
        validate_request(ids, params, self.limits)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request at once and free its blocks. Returns its final output, if it existed."""
        live = self.live.get(request_id)
        if live is None:
            return None
        self.num_aborted += 1
        for child in live.children:
            self.scheduler.finish(child, FinishReason.ABORT)
        return self.live.emit(live, live.children)

    def stop_sequence(self, stop: SequenceStop) -> bool:
        """End a sequence the front end saw a stop string in, at ``stop.num_output_tokens`` tokens:
        the tokens after them and their KV are dropped, so a session keeps what the client saw. If
        the sequence had ended already (its EOS or length came first), the session it left is
        trimmed instead. Returns whether the request has left the engine (nothing more to report)."""
        live = self.live.get(stop.request_id)
        child = live.children[stop.index] if live is not None else None
        if child is not None and not child.is_finished:
            child.stop_reason = stop.stop_reason
            # steps in flight are rolled back, then the output cut, before its session is saved
            self.scheduler.finish(child, FinishReason.STOP, keep_output=stop.num_output_tokens)
        elif stop.session_id is not None:  # it ended by itself first, and left its session the longer stream
            self.kv.sessions.trim(stop.session_id, stop.token_ids)
        if live is None:
            return True
        if all(c.is_finished for c in live.children):
            self.live.forget(live)
            return True
        return False

    def fail_all(self, message: str) -> list[RequestOutput]:
        """Finish every request with an error (after an unexpected failure) and report them."""
        if self._launched is not None:  # let the device finish what it runs; its results are dropped
            try:
                self._launched.result()
            except Exception:
                pass
            self._launched = None
        outputs = []
        for live in self.live.all():
            for child in live.children:
                child.error = child.error or message
                self.scheduler.finish(child, FinishReason.ERROR)
            outputs.append(self.live.emit(live, live.children))
        return outputs

    def close_session(self, session_id: str) -> bool:
        return self.kv.sessions.close(session_id)

    def session_tokens(self, session_id: str) -> list[int] | None:
        """The session's real token stream, or None once the cache no longer holds it (see
        ``SessionStore.tokens``). Safe to call from any thread."""
        return self.kv.sessions.tokens(session_id, time.monotonic())

    def has_unfinished(self) -> bool:
        return bool(self.live) or self._launched is not None

    def stats(self) -> EngineStats:
        return engine_stats(self.scheduler, self.kv, self.speculator, num_aborted=self.num_aborted,
                            num_failed_steps=self.num_failed_steps, num_failed_rows=self.num_failed_rows,
                            healthy=self.fatal_error is None)

    def kv_report(self) -> KvReport:
        """Check the KV pool's bookkeeping and account for every block (soak runs, admin)."""
        return kv_report(self.kv, self.live.sequences())

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; return an output delta for every request with news.

        Serial: schedule, launch, land (wait for its results and apply them). Overlapped: schedule
        and launch step N+1 while step N runs on the device thread, then land N; the outputs
        returned are N's. A step falls back to serial while a live request needs the tokens of the
        step before it on the host to form its own (see ``live_requests.needs_host_tokens``)."""
        now = time.monotonic()
        self.kv.sessions.expire(now)
        overlap = self.async_scheduling and self.live.num_serial == 0
        touched: list[Request] = []
        if not overlap and self._launched is not None:
            touched.extend(self._land(self._launched))
            self._launched = None
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        self._event("prepare", self._num_steps + 1)
        plan = self.scheduler.schedule()
        for request in plan.timed_out:
            request.error = request.error or "queue_timeout"
            touched.append(request)
        launched = self._launch(plan, overlap) if plan else None
        if self._launched is not None:
            touched.extend(self._land(self._launched))
            self._launched = None
        if launched is not None:
            if overlap:
                self._launched = launched
            else:
                touched.extend(self._land(launched))
        return self.live.collect(touched)

    def _launch(self, plan: SchedulerOutput, overlap: bool) -> LaunchedStep:
        """Build the step's inputs, advance its requests' counts and start it (``overlap``: on the
        device thread, kept in flight while the next step is prepared; else it runs when it lands).
        One pass over the scheduled requests after the inputs: each request's sampling row (from
        its counts before the step), then its counts advanced."""
        previous = self._launched
        inputs = self.runner.step_inputs(plan, previous.rows_of if previous is not None else None)
        decode_only = self.speculator is not None and all(
            s.request.num_computed_tokens == s.request.num_tokens - 1 for s in plan.scheduled)
        # plain steps: every row the plain argmax (greedy), or that or a draw at its temperature (drawn)
        greedy = self.live.num_other_than_greedy == 0 and self.speculator is None
        drawn = not greedy and self.live.num_other_than_drawn == 0 and self.speculator is None
        plain = greedy or drawn
        sampling: list[Request] = []  # plain steps: the requests whose rows ``PlainRows`` builds when read
        rows: list[SamplingRow] | PlainRows = PlainRows(sampling) if plain else []
        samples: list[bool] = []
        rows_of: dict[int, int] = {}  # overlapped steps only: the next step reads its pending tokens here
        epochs = []
        for s in plan.scheduled:
            r, n = s.request, s.num_new_tokens
            computed = r.num_computed_tokens
            # ``ScheduledRequest.samples``, read as attributes (every request, every step)
            sample = computed + n == len(r.all_token_ids) + r.num_pending and r.sampling_params.max_tokens != 0
            samples.append(sample)
            if sample:
                if overlap:
                    rows_of[id(r)] = len(sampling) if plain else len(rows)
                if plain:  # nothing to ban, force or constrain: the row is its request's as it stands
                    sampling.append(r)
                else:
                    rows.append(sampling_row(r))
                    if s.draft_token_ids and self.speculator is not None:
                        rows.extend(self.speculator.draft_rows(r, rows[-1], s.draft_token_ids))
            metrics = r.metrics
            prompt_left = len(r.prompt_token_ids) - computed  # <= 0 once decoding
            if prompt_left > 0:
                metrics.num_computed_prompt_tokens += min(n, prompt_left)
            r.num_computed_tokens = computed + n
            r.num_inflight += n
            r.num_pending += sample
            epochs.append(metrics.num_preemptions)
        prepared = PreparedStep(inputs, rows, len(plan.scheduled), greedy or None, drawn)
        copies = list(self.kv.pending_copies)  # prefix hits that end inside a cached block
        self.kv.copies_done()  # the device copies them before any later step can reuse the sources
        self._num_steps += 1
        index = self._num_steps

        def job() -> LaunchedRun:
            self._event("device_start", index)
            for src, dst in copies:
                self.kv_cache.copy_block(src, dst)
            tokens = None
            if prepared.inputs.previous_rows:
                assert previous is not None
                tokens = previous.tokens_for_next(max(prepared.inputs.previous_index) + 1, self.runner.device)
            try:
                return self.runner.launch(prepared, tokens)
            finally:
                self._event("device_end", index)  # on a CPU the step's end; on CUDA its launch's

        launched = LaunchedStep(index, plan, samples, epochs, rows_of, job, decode_only)
        if overlap:
            launched.future = self._device.submit(job)
        return launched

    def _land(self, launched: LaunchedStep) -> list[Request]:
        """Wait for a launched step and apply its results: confirm its KV, append the tokens, check
        stops, finish requests. Requests that ended after it was launched are skipped (their rows
        are dropped)."""
        plan = launched.plan
        try:
            results = self.runner.collect(launched.result())
        except Exception as exc:  # a failed step fails its requests, not the engine
            logger.exception("model step failed")
            self.num_failed_steps += 1
            if isinstance(exc, MemoryError | torch.OutOfMemoryError):
                self.fatal_error = f"out of memory in a model step: {exc}"  # /health: 503, restart the process
            failed = []
            for s in plan.scheduled:
                if not s.request.is_finished:
                    s.request.error = f"internal error: the engine failed in a model step: {exc}"
                    self.scheduler.finish(s.request, FinishReason.ERROR)
                    failed.append(s.request)
            return failed
        if launched.decode_only:  # decode rows (and drafts) alone: speculation times these steps
            verified = any(s.draft_token_ids for s in plan.scheduled)
            self.speculator.observe_step(len(plan.scheduled), time.perf_counter() - launched.launched_at, verified)
        now = time.monotonic()
        touched = []
        finished = RequestStatus.FINISHED
        epochs, samples, failed = launched.epochs, launched.samples, results.failed
        full = self.kv.block_size
        if results.plain and not results.prompt_logprobs and self.speculator is None:
            # every request sampled one token, no logprobs, none failed, no drafts: most steps
            append = self._append
            for s, token, epoch, sample in zip(plan.scheduled, results.row_tokens, epochs, samples, strict=True):
                request = s.request
                if request.status is finished:
                    continue  # it ended after this step was launched
                if request.metrics.num_preemptions == epoch:  # as below
                    request.num_inflight -= s.num_new_tokens
                    if request.num_computed_tokens - request.num_inflight >= (request.num_registered_blocks + 1) * full:
                        self.kv.register_computed(request)
                request.num_pending -= sample
                if append(request, token, None, now):
                    touched.append(request)
            return touched
        sampled = [SampledToken(t, None) for t in results.row_tokens] if results.plain else results.sampled
        for i, (s, result) in enumerate(zip(plan.scheduled, sampled, strict=True)):
            request = s.request
            if request.status is finished:
                continue  # it ended after this step was launched: what the step computed for it is dropped
            if request.metrics.num_preemptions == epochs[i]:  # else its KV was dropped meanwhile
                request.num_inflight -= s.num_new_tokens
                # a block filled since the last key (``KVCacheManager.register_computed``'s test, inline)
                if request.num_computed_tokens - request.num_inflight >= (request.num_registered_blocks + 1) * full:
                    self.kv.register_computed(request)
            request.num_pending -= samples[i]
            if failed and i in failed:  # its logits were not finite: it fails alone
                self.num_failed_rows += 1
                request.error = f"internal error: {results.failed[i]}"
                self.scheduler.finish(request, FinishReason.ERROR, now)
                touched.append(request)
                continue
            if results.prompt_logprobs:
                scored = results.prompt_logprobs.get(i)
                if scored is not None and request.prompt_logprobs is not None:
                    request.prompt_logprobs.extend(scored)
            if result is not None:
                if s.draft_token_ids:
                    self._append_verified(request, s.draft_token_ids, [result, *results.draft_samples[i]], now,
                                          len(plan.scheduled))
                    touched.append(request)
                elif self._append(request, result.token_id, result.logprobs, now):  # else a whole answer still running
                    touched.append(request)
            elif (request.sampling_params.max_tokens == 0
                  and request.num_confirmed_tokens >= request.num_tokens):
                self.scheduler.finish(request, FinishReason.LENGTH, now)  # the prompt is all it asked for
                touched.append(request)
        return touched

    def _event(self, kind: str, index: int) -> None:
        if self.on_step_event is not None:
            self.on_step_event(kind, index, time.perf_counter())

    def _append_verified(
        self, request: Request, drafts: tuple[int, ...], sampled: list[SampledToken], now: float, batch: int
    ) -> None:
        """Emit a speculating request's accepted draft tokens and the token after them
        (``runner.spec_verify``), one at a time, until the request ends: tokens after a stop are
        dropped. Its computed count grows by the accepted drafts only (rejected rows' KV is
        overwritten later), so no block holding an unverified token is ever keyed."""
        assert self.speculator is not None
        accepted = self.speculator.verify(request, drafts, [t.token_id for t in sampled], batch)
        self._append(request, sampled[0].token_id, sampled[0].logprobs, now)
        for result in sampled[1 : accepted + 1]:
            if request.is_finished:
                break
            request.num_computed_tokens += 1  # the accepted draft before ``result``: its KV is valid
            self.kv.register_computed(request)
            self._append(request, result.token_id, result.logprobs, now)

    def _append(self, request: Request, token: int, logprobs: dict[int, float] | None, now: float) -> bool:
        """Append a sampled token, end the request where it stops; whether it has news to report."""
        grammar = request.grammar
        constrained = grammar is not None and request.grammar_active
        output = request.output_token_ids
        output.append(token)
        request.all_token_ids.append(token)
        if constrained:
            grammar.accept(token)
        metrics = request.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
        if request.think_end_ids and token == request.think_end_ids[0]:
            request.thinking_closed = True
            if grammar is not None and request.grammar_start is None:  # after the forced "\n\n", if any
                request.grammar_start = len(output) + len(request.forced_tokens)
        stream = self.live.stream(request)
        stream.new_token_ids.append(token)
        if logprobs is not None:
            stream.new_logprobs.append(logprobs)
            request.cumulative_logprob += logprobs[token]
        params = request.sampling_params
        if token in request.eos_token_ids and len(output) > params.min_tokens:
            request.stop_reason = token
            self.scheduler.finish(request, FinishReason.STOP, now)
            return True
        if constrained and grammar.done:  # the grammar is complete (or refused the token)
            self.scheduler.finish(request, FinishReason.STOP, now)
            return True
        max_tokens = params.max_tokens
        if (max_tokens is not None and len(output) >= max_tokens) or len(request.all_token_ids) >= self.max_model_len:
            self.scheduler.finish(request, FinishReason.LENGTH, now)
            return True
        return not stream.final_only
