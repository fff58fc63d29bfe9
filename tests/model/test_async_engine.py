"""AsyncEngine: the engine's loop thread driven from asyncio."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftlm import SamplingParams


def test_a_request_through_the_async_engine_is_validated_once(tiny_tied_dir: Path) -> None:
    """``AsyncEngine.submit`` validates in the caller's thread; the engine does not validate it again."""
    import asyncio

    from swiftlm.core.generation import GenerationRequest
    from swiftlm.engine.async_engine import AsyncEngine
    from swiftlm.engine.engine import Engine, RequestError
    from swiftlm.llm import engine_config

    engine = Engine(engine_config(str(tiny_tied_dir), "float32"))
    calls = []
    validate = engine.validate
    engine.validate = lambda ids, params: (calls.append(1), validate(ids, params))[1]  # type: ignore[method-assign]
    driver = AsyncEngine(engine)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)

    async def one() -> None:
        out = await driver.submit(GenerationRequest("v", [5, 6, 7], params, final_only=True)).final()
        assert len(out.outputs[0].token_ids) == 3
        with pytest.raises(RequestError):
            driver.submit(GenerationRequest("bad", [], params))

    try:
        asyncio.run(one())
    finally:
        driver.shutdown(drain_timeout_s=5)
    assert len(calls) == 2  # one each: the good request and the refused one
