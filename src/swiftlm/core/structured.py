"""What a request's output must match (structured output), resolved at the edge.

``StructuredOutput`` is the one shape every front end produces (``response_format``, vLLM's
``guided_*`` / ``structured_outputs``, llama.cpp's ``grammar``, ``tool_choice`` "required" or a named
function) and the runner compiles (``runner/structured.py``). It carries text only: compiling is
the runner's job, cached by ``key``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar", "tool_calls")


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """kind:
    - ``json_schema``: ``spec`` is a JSON Schema (JSON text);
    - ``json_object``: any JSON object (``spec`` empty);
    - ``regex``: ``spec`` is a regular expression the whole answer matches;
    - ``choice``: ``spec`` is a JSON list of strings, the answer is one of them;
    - ``grammar``: ``spec`` is a grammar (Lark or GBNF, ``grammar_syntax``);
    - ``tool_calls``: ``spec`` is a JSON list of OpenAI function definitions ``{"name", "parameters"}``;
      the answer is one (``parallel`` False) or more Qwen3 hermes calls
      ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` whose arguments match the
      function's parameters schema.
    """

    kind: str
    spec: str = ""
    grammar_syntax: str = "lark"  # for kind "grammar": "lark" | "gbnf"
    parallel: bool = True  # for kind "tool_calls": more than one call allowed

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"structured output kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @property
    def key(self) -> tuple[str, str, str, bool]:
        """Compiled grammars are cached by this."""
        return (self.kind, self.spec, self.grammar_syntax, self.parallel)


_VLLM_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def grammar_syntax_of(text: str) -> str:
    """"gbnf" for llama.cpp-style rules (``name ::= ...``), else "lark"."""
    return "gbnf" if "::=" in text else "lark"


def from_vllm(value: Any) -> StructuredOutput | None:
    """vLLM's ``StructuredOutputsParams`` / ``GuidedDecodingParams`` (an object or a dict with one of
    ``json``, ``regex``, ``choice``, ``grammar``, ``json_object``) as a StructuredOutput; a
    StructuredOutput is returned as is, None for None or no key set. ValueError otherwise."""
    if value is None or isinstance(value, StructuredOutput):
        return value
    if isinstance(value, Mapping):
        given = {k: v for k, v in value.items() if v not in (None, False)}
    else:
        given = {k: v for k in (*_VLLM_KEYS, "structural_tag") if (v := getattr(value, k, None)) not in (None, False)}
    unknown = sorted(set(given) - set(_VLLM_KEYS))
    if unknown:
        raise ValueError(f"structured outputs: {', '.join(unknown)} not supported; use one of {', '.join(_VLLM_KEYS)}")
    if len(given) > 1:
        raise ValueError(f"structured outputs: give one of {', '.join(_VLLM_KEYS)}, got {', '.join(sorted(given))}")
    if not given:
        return None
    (key, spec), = given.items()
    if key == "json":
        return StructuredOutput("json_schema", spec if isinstance(spec, str) else json.dumps(spec))
    if key == "json_object":
        return StructuredOutput("json_object")
    if key == "choice":
        if not isinstance(spec, list | tuple) or not all(isinstance(c, str) for c in spec):
            raise ValueError("structured outputs: choice must be a list of strings")
        return StructuredOutput("choice", json.dumps(list(spec)))
    if not isinstance(spec, str):
        raise ValueError(f"structured outputs: {key} must be a string")
    if key == "regex":
        return StructuredOutput("regex", spec)
    return StructuredOutput("grammar", spec, grammar_syntax=grammar_syntax_of(spec))
