"""The documentation against the code, so that neither drifts from the other.

- The Serving page (docs/serving.md) names every option of ``swiftlm serve``, read from the real
  argument parser (``swiftlm.cli.build_parser``; no server is started), and every ``--flag`` written
  in its tables is an option of that parser, so a removed or renamed flag fails here too.
- Every fenced ``python`` block of README.md and docs/**/*.md compiles, and every command line in a
  ``bash`` / ``sh`` / ``shell`` / ``console`` block that runs ``swiftlm serve | generate | chat | bench
  | batch | top`` is accepted by the real parser (``parse_args`` of its ``shlex`` split; leading
  ``NAME=value`` environment assignments are dropped, ``&&`` / ``;`` / ``|`` split a line). Nothing
  is run. A block whose preceding line is ``<!-- needs: gpu -->`` or ``<!-- needs: network -->``
  (what running it would need) is checked the same way, compiling and parsing need neither, and is
  counted apart; a marker must name a known need and stand right before a block.

The site itself is built by ``scripts/dev.sh test`` (``mkdocs build --strict``), not here.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from swiftlm.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SERVING = DOCS / "serving.md"
DOC_FILES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")])

SHELL_LANGS = {"bash", "sh", "shell", "console"}
COMMANDS = {"serve", "generate", "chat", "bench", "batch", "top"}
NEEDS = {"gpu", "network"}
SHELL_OPERATORS = {"&&", "||", ";", "|"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")
_MARKER = re.compile(r"<!--\s*needs:\s*(?P<what>[^>]*?)\s*-->")
_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
_PLACEHOLDER = re.compile(r"\$|<[^>]+>")


def _flag(option: str) -> re.Pattern[str]:
    """``option`` as a whole word: ``--max-queue-wait`` does not match inside ``--max-queue-waiting-time``."""
    return re.compile(rf"(?<![\w-]){re.escape(option)}(?![\w-])")


@cache
def cli_parser() -> argparse.ArgumentParser:
    return build_parser()


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def serve_options() -> set[str]:
    """Every option string of ``swiftlm serve`` (``--help`` aside), both forms of the boolean ones."""
    return {
        option
        for action in serve_parser()._actions
        if not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
    }


# -- the Serving page ----------------------------------------------------------------------------
def test_serving_page_names_every_serve_option() -> None:
    page = SERVING.read_text()
    missing = sorted(option for option in serve_options() if not _flag(option).search(page))
    assert not missing, f"{SERVING.relative_to(ROOT)} does not name these `swiftlm serve` options: {missing}"


def test_every_flag_in_the_serving_tables_exists() -> None:
    rows = [line for line in SERVING.read_text().splitlines() if line.lstrip().startswith("|")]
    assert len(rows) > 50, "the Serving page's flag tables went missing"
    named = {flag for row in rows for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", row)}
    unknown = sorted(named - serve_options())
    assert not unknown, f"{SERVING.relative_to(ROOT)} tables name flags `swiftlm serve` does not have: {unknown}"


# -- code blocks -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    needs: tuple[str, ...]  # from a `<!-- needs: ... -->` marker on the line before

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        marker = _MARKER.fullmatch(lines[i - 1].strip()) if i > 0 else None
        needs = tuple(w.strip() for w in marker["what"].split(",")) if marker else ()
        start, body = i + 1, []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence) and not stripped.strip(fence[0]):
                break
            body.append(lines[i][indent:] if not lines[i][:indent].strip() else lines[i])
            i += 1
        blocks.append(Block(path, start, opening["lang"].lower(), "\n".join(body) + "\n", needs))
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    return [block for path in DOC_FILES for block in code_blocks(path)]


def command_lines(block: Block) -> list[str]:
    """The block's commands: continuation lines joined; in a console block only the ``$ `` lines."""
    joined: list[str] = []
    for raw in block.text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if block.lang == "console":
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if line and not line.startswith("#"):
            joined.append(line)
    return joined


def swiftlm_commands(line: str) -> list[list[str]]:
    """The ``swiftlm <command> ...`` invocations of one shell line, as argument lists (``swiftlm`` dropped)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    found, segment = [], []
    for token in [*tokens, ";"]:
        if token in SHELL_OPERATORS:
            while segment and _ENV_ASSIGNMENT.fullmatch(segment[0]):
                segment.pop(0)
            if len(segment) > 1 and segment[0] == "swiftlm" and segment[1] in COMMANDS:
                found.append(segment[1:])
            segment = []
        else:
            segment.append(token)
    return found


def parse_error(args: list[str]) -> str | None:
    """None if the real CLI parser accepts ``args``, else what it said."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli_parser().parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None):  # --help exits 0
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
    return None


BLOCKS = all_blocks()


def test_the_docs_have_code_to_check() -> None:
    langs = {b.lang for b in BLOCKS}
    assert "python" in langs and "bash" in langs
    assert sum(len(swiftlm_commands(line)) for b in BLOCKS if b.lang in SHELL_LANGS for line in command_lines(b)) >= 10


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python"], ids=lambda b: b.where)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.text, block.where, "exec")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in SHELL_LANGS], ids=lambda b: b.where)
def test_swiftlm_command_lines_parse(block: Block) -> None:
    problems = []
    for line in command_lines(block):
        for args in swiftlm_commands(line):
            if any(_PLACEHOLDER.search(arg) for arg in args):
                continue  # a $VAR or <placeholder> the parser cannot judge (none in the docs today)
            error = parse_error(args)
            if error is not None:
                problems.append(f"swiftlm {shlex.join(args)}\n    -> {error}")
    assert not problems, f"{block.where}: the CLI refuses\n" + "\n".join(problems)


def test_needs_markers() -> None:
    """Markers name known needs and stand right before a code block; the marked blocks are counted."""
    counts = dict.fromkeys(NEEDS, 0)
    for path in DOC_FILES:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            marker = _MARKER.fullmatch(line.strip())
            if marker is None:
                continue
            where = f"{path.relative_to(ROOT)}:{i + 1}"
            needs = [w.strip() for w in marker["what"].split(",")]
            assert set(needs) <= NEEDS, f"{where}: unknown need {needs}; known: {sorted(NEEDS)}"
            assert i + 1 < len(lines) and _FENCE.match(lines[i + 1]), f"{where}: a needs marker must precede a code block"
            for need in needs:
                counts[need] += 1
    marked = [b for b in BLOCKS if b.needs]
    assert sum(counts.values()) >= len(marked) > 0


def test_command_line_splitting() -> None:
    line = "HF_HUB_OFFLINE=1 swiftlm serve Qwen/Qwen3-0.6B --port 8001 && swiftlm top --once  # two"
    assert swiftlm_commands(line) == [["serve", "Qwen/Qwen3-0.6B", "--port", "8001"], ["top", "--once"]]
    assert swiftlm_commands("pip install -e . | tee log") == []
    assert parse_error(["serve", "--no-such-flag"]) is not None
    assert parse_error(["serve", "--max-model-len", "4096"]) is None
