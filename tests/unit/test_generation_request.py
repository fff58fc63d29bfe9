"""GenerationRequest and resolve_thinking's precedence table, row by row (no model)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from swiftlm.core.generation import GenerationRequest, resolve_thinking
from swiftlm.sampling import SamplingParams

ON = {"enable_thinking": True}
OFF = {"enable_thinking": False}
UNSET = {"enable_thinking": None}
SWITCHES = [None, True, False]
KWARGS = [None, {}, UNSET, ON, OFF]


def resolve(top: bool | None, request: dict | None, server: dict | None, can_think: bool = True) -> bool:
    return resolve_thinking(
        enable_thinking=top, template_kwargs=request, default_template_kwargs=server, can_think=can_think
    )


@pytest.mark.parametrize("top,request_kwargs,server", list(itertools.product(SWITCHES, KWARGS, KWARGS)))
def test_row0_no_think_tokens_is_off_whatever_was_asked(top, request_kwargs, server) -> None:
    assert resolve(top, request_kwargs, server, can_think=False) is False


@pytest.mark.parametrize("top", [True, False])
@pytest.mark.parametrize("request_kwargs,server", list(itertools.product(KWARGS, KWARGS)))
def test_row1_top_level_switch_beats_every_kwargs(top, request_kwargs, server) -> None:
    assert resolve(top, request_kwargs, server) is top


@pytest.mark.parametrize("request_kwargs", [ON, OFF])
@pytest.mark.parametrize("server", KWARGS)
def test_row2_request_template_kwargs_beat_the_server_default(request_kwargs, server) -> None:
    assert resolve(None, request_kwargs, server) is request_kwargs["enable_thinking"]


@pytest.mark.parametrize("request_kwargs", [None, {}, UNSET, {"other": 1}])
@pytest.mark.parametrize("server", [ON, OFF])
def test_row3_server_default_when_the_request_says_nothing(request_kwargs, server) -> None:
    assert resolve(None, request_kwargs, server) is server["enable_thinking"]


@pytest.mark.parametrize("request_kwargs,server", list(itertools.product([None, {}, UNSET], [None, {}, UNSET])))
def test_row4_on_when_nothing_decides(request_kwargs, server) -> None:
    assert resolve(None, request_kwargs, server) is True


def test_keyword_only_so_rows_cannot_be_swapped() -> None:
    with pytest.raises(TypeError):
        resolve_thinking(False, ON, ON)  # type: ignore[misc]


def test_generation_request_is_frozen_and_slotted() -> None:
    request = GenerationRequest("r", [1, 2, 3], SamplingParams(max_tokens=4), thinking=True, session_id="s")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.thinking = False  # type: ignore[misc]
    assert not hasattr(request, "__dict__")
    later = dataclasses.replace(request, arrival_time=5.0)
    assert (later.arrival_time, request.arrival_time) == (5.0, None)
    assert (later.session_id, later.thinking, later.prompt_token_ids) == ("s", True, [1, 2, 3])


def test_generation_request_defaults_and_tuple_prompt() -> None:
    request = GenerationRequest("r", (5, 6), SamplingParams())
    assert (request.prompt, request.thinking, request.session_id) == (None, False, None)
    assert (request.stream, request.final_only, request.arrival_time) == (False, False, None)
    assert list(request.prompt_token_ids) == [5, 6]


def test_streaming_and_final_only_contradict() -> None:
    GenerationRequest("r", [1], SamplingParams(), stream=True)
    GenerationRequest("r", [1], SamplingParams(), final_only=True)
    with pytest.raises(ValueError, match="both stream"):
        GenerationRequest("r", [1], SamplingParams(), stream=True, final_only=True)
