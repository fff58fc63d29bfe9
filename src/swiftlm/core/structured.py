"""What a request's output must match (structured output), resolved at the edge.

``StructuredOutput`` is the one shape every front end produces (``response_format``, vLLM's
``guided_*`` / ``structured_outputs``, llama.cpp's ``grammar``, ``tool_choice`` "required" or a named
function) and the runner compiles (``runner/structured.py``). It carries text only: compiling is
the runner's job, cached by ``key``.
"""

from __future__ import annotations

from dataclasses import dataclass

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
