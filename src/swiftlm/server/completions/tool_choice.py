"""What a chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` ask for.

- Tool calls are parsed from the answer (``swiftlm.text.tools``) when the request offers tools,
  ``tool_choice`` is not "none" and the server's tool-call parser is not "none"
  (``--tool-call-parser none`` turns parsing off: the calls stay as text in ``content``).
- ``tool_choice`` "none": the tools are left out of the prompt (``request_mapping.template_tools``)
  and nothing is parsed. "auto" (the default): the model decides.
- "required" and a named function are enforced by constrained decoding
  (``structured_mapping.tool_call_constraint``): the output can only be one or more well-formed
  hermes calls (to that function) whose arguments match the function's ``parameters`` schema.
  They cannot be combined with ``response_format`` or another structured-output field (a 400).
- ``parallel_tool_calls: false``: at most one call (the parser keeps the first, the constraint
  allows one).

Problems a client caused are a 400 naming them: a tool without a name, duplicate names,
``parameters`` that are not an object schema, ``tool_choice`` naming an unknown function or
"required" with no tools, a forced call with parsing turned off.
"""

from __future__ import annotations

from dataclasses import dataclass

from swiftlm.core.structured import StructuredOutput
from swiftlm.server.completions.chat_protocol import ChatCompletionRequest, NamedToolChoice
from swiftlm.server.completions.structured_mapping import tool_call_constraint
from swiftlm.server.errors import bad_request


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    parse: bool  # tool calls are parsed from the answer
    parallel: bool  # more than one call allowed
    constraint: StructuredOutput | None  # "required" / a named function: the output must be calls


NO_TOOLS = ToolPolicy(parse=False, parallel=True, constraint=None)


def tool_policy(req: ChatCompletionRequest, parser: str) -> ToolPolicy:
    """The request's tool policy under the server's ``parser`` (``ServerConfig.tool_call_parser``);
    raises a 400 for the problems listed in the module docstring."""
    names = _checked_names(req)
    choice = req.tool_choice
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    if forced and not names:
        what = "required" if choice == "required" else f"the function {choice.function.name!r}"
        raise bad_request(f"tool_choice {what} needs tools; the request offers none", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise bad_request(
            f"tool_choice names the function {choice.function.name!r}, which is not among the tools "
            f"({', '.join(repr(n) for n in names)})",
            param="tool_choice",
        )
    if not names or choice == "none":
        return NO_TOOLS
    if parser == "none":
        if forced:
            raise bad_request(
                "tool_choice required or a named function needs tool-call parsing, which this server turned off "
                "(--tool-call-parser none); use tool_choice auto",
                param="tool_choice",
            )
        return NO_TOOLS
    parallel = req.parallel_tool_calls is not False
    constraint = None
    if forced:
        functions = [tool.function.model_dump(exclude_none=True) for tool in req.tools or ()]
        name = choice.function.name if isinstance(choice, NamedToolChoice) else None
        constraint = tool_call_constraint(functions, name, parallel)  # compiled and checked: 400 if it fails
    return ToolPolicy(parse=True, parallel=parallel, constraint=constraint)


def _checked_names(req: ChatCompletionRequest) -> list[str]:
    names: list[str] = []
    for i, tool in enumerate(req.tools or ()):
        name = tool.function.name
        if not name.strip():
            raise bad_request(f"tools[{i}].function.name is empty; every tool needs a name", param=f"tools[{i}].function.name")
        if name in names:
            raise bad_request(f"tools[{i}].function.name {name!r} is given twice; tool names must be unique",
                              param=f"tools[{i}].function.name")
        parameters = tool.function.parameters
        if parameters is not None and parameters.get("type", "object") != "object":
            raise bad_request(
                f"tools[{i}].function.parameters must be a JSON Schema of type \"object\" (the call's arguments "
                f"are an object), got type {parameters.get('type')!r}",
                param=f"tools[{i}].function.parameters",
            )
        names.append(name)
    return names
