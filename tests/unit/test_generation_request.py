"""GenerationRequest and resolve_thinking's precedence table, row by row (no model)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from swiftlm.core.generation import (
    REASONING_EFFORT_BUDGETS,
    GenerationRequest,
    resolve_thinking,
    resolve_thinking_budget,
)
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
def test_row4_server_default_when_the_request_says_nothing(request_kwargs, server) -> None:
    assert resolve(None, request_kwargs, server) is server["enable_thinking"]


@pytest.mark.parametrize("request_kwargs,server", list(itertools.product([None, {}, UNSET], [None, {}, UNSET])))
def test_row5_on_when_nothing_decides(request_kwargs, server) -> None:
    assert resolve(None, request_kwargs, server) is True


EFFORTS = ["none", "minimal", "low", "medium", "high"]


@pytest.mark.parametrize("effort", EFFORTS)
@pytest.mark.parametrize("server", KWARGS)
def test_row3_reasoning_effort_beats_the_server_default(effort, server) -> None:
    expected = effort in ("low", "medium", "high")
    assert resolve_thinking(reasoning_effort=effort, default_template_kwargs=server) is expected
    assert resolve_thinking(reasoning_effort=effort, template_kwargs=UNSET, default_template_kwargs=server) is expected


@pytest.mark.parametrize("effort", EFFORTS)
def test_rows_1_and_2_beat_reasoning_effort(effort) -> None:
    for switch in (True, False):
        assert resolve_thinking(enable_thinking=switch, reasoning_effort=effort) is switch
        kwargs = {"enable_thinking": switch}
        assert resolve_thinking(template_kwargs=kwargs, reasoning_effort=effort) is switch
    assert resolve_thinking(reasoning_effort=effort, can_think=False) is False


def test_an_unknown_reasoning_effort_is_an_error() -> None:
    with pytest.raises(ValueError, match="reasoning_effort must be one of"):
        resolve_thinking(reasoning_effort="extreme")


def test_thinking_budget_of_reasoning_effort() -> None:
    assert resolve_thinking_budget(None, None) is None
    low, medium = REASONING_EFFORT_BUDGETS["low"], REASONING_EFFORT_BUDGETS["medium"]
    assert low is not None and medium is not None and 0 < low < medium
    assert (resolve_thinking_budget(None, "low"), resolve_thinking_budget(None, "medium")) == (low, medium)
    assert resolve_thinking_budget(None, "high") is None  # no limit
    for effort in ("none", "minimal"):  # thinking is off: no budget to spend
        assert resolve_thinking_budget(None, effort) is None
    for effort in [None, *EFFORTS]:  # an explicit budget wins, 0 included
        assert resolve_thinking_budget(7, effort) == 7
        assert resolve_thinking_budget(0, effort) == 0


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
