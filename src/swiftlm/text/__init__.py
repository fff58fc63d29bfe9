"""The text side: tokenizer, chat template, incremental detokenizer, stop strings, reasoning split."""

from __future__ import annotations

from swiftlm.text.chat_template import ChatTemplate, ChatTemplateError
from swiftlm.text.detokenizer import IncrementalDetokenizer
from swiftlm.text.reasoning import ReasoningStreamParser, split_reasoning
from swiftlm.text.stop import StopStringMatcher
from swiftlm.text.tokenizer import Tokenizer

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "ReasoningStreamParser",
    "StopStringMatcher",
    "Tokenizer",
    "split_reasoning",
]
