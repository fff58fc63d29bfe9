"""Seeded local text for benchmark prompts: English and Chinese prose, questions and Python code,
sized to a token count with a caller's token counter (or a rough estimate when none is given).

Text is built from *pieces* (a word with its leading space, a Chinese word, a line of code) so it
can be cut anywhere without breaking a word. No downloads; the word lists below are all there is.
"""

from __future__ import annotations

import gzip
import math
import random
import re
from collections.abc import Callable
from pathlib import Path

TokenCounter = Callable[[str], int]

EN_NOUNS = tuple(
    "system network server request model cache engine battery garden river city market teacher "
    "student library kitchen bridge planet language database customer invoice contract schedule "
    "budget factory harbor forest recipe museum hospital airport keyboard window signal sensor "
    "protocol report meeting journey mountain village compiler algorithm account password "
    "printer camera painting orchestra satellite".split()
)
EN_ADJECTIVES = tuple(
    "quick quiet careful ancient modern bright narrow large small reliable expensive cheap "
    "efficient noisy simple complex local remote shared private broken stable green heavy light "
    "secure slow urgent".split()
)
EN_VERBS = tuple(
    "improves reduces changes supports requires connects measures protects explains replaces "
    "follows controls describes limits builds stores".split()
)
EN_ADVERBS = tuple("quickly rarely often carefully usually slowly clearly quietly".split())
EN_CONNECTORS = ("However,", "Meanwhile,", "In practice,", "As a result,", "For example,", "Later,")
EN_QUESTIONS = (
    "What is the difference between a {n1} and a {n2}?",
    "How does a {a1} {n1} affect the {n2}?",
    "Why is my {n1} so {a1} today?",
    "Can you explain what a {a1} {n1} is?",
    "When should I use a {n1} instead of a {n2}?",
    "Who maintains the {n1} in a {a1} {n2}?",
    "Give me three facts about the {n1}.",
    "How do I reset the {n1} on my {n2}?",
)
EN_FOLLOW_UPS = (
    "Thanks. Can you tell me more about the {n1}?",
    "What about the {a1} {n1}?",
    "Could you make that shorter?",
    "And how does that change the {n1}?",
    "Is there a cheaper way to do that with a {n2}?",
)

ZH_NOUNS = tuple(
    "系统 网络 服务器 模型 缓存 数据库 城市 市场 老师 学生 图书馆 厨房 桥梁 语言 客户 合同 预算 工厂 港口 森林 医院 机场 手机 电池 天气 地图 火车 电脑 公司 "
    "产品 价格 订单 报告 会议 旅行".split()
)
ZH_VERBS = tuple("提高 降低 改变 支持 需要 连接 测量 保护 解释 替换 控制 描述".split())
ZH_ADVERBS = tuple("经常 很少 通常 慢慢地 清楚地 仔细地 迅速地".split())
ZH_CONNECTORS = ("但是，", "同时，", "因此，", "例如，", "后来，", "实际上，")
ZH_QUESTIONS = (
    "{n1}和{n2}有什么区别？",
    "为什么{n1}会影响{n2}？",
    "请简单解释一下{n1}是什么。",
    "如何提高{n1}的效率？",
    "我的{n1}坏了，应该怎么办？",
    "{n1}和{n2}哪个更重要？",
)
ZH_FOLLOW_UPS = ("谢谢，那{n1}呢？", "可以说得更简单一点吗？", "这对{n1}有什么影响？", "还有别的办法吗？")

CODE_TASKS = (
    "parses a CSV line into a list of fields, handling quoted commas",
    "returns the n-th Fibonacci number using memoization",
    "merges two sorted lists into one sorted list",
    "checks whether a string is a palindrome, ignoring case and punctuation",
    "groups a list of words by their first letter",
    "computes a moving average over a window of k values",
    "retries a callable up to three times with exponential backoff",
    "flattens an arbitrarily nested list",
    "counts word frequencies in a text and returns the ten most common",
    "validates an email address with a regular expression",
    "converts a Roman numeral to an integer",
    "finds the longest common prefix of a list of strings",
)
CODE_IDENTIFIERS = tuple(
    "items total count result value index buffer config record limit offset window cache queue "
    "node path line token score weight".split()
)
CODE_FUNCTIONS = tuple("load parse update compute validate render merge split fetch store".split())


def estimate_tokens(text: str) -> int:
    """A tokenizer-free estimate: ~0.6 tokens per CJK character, ~4 characters per token otherwise."""
    cjk = sum(1 for ch in text if "\u3000" <= ch <= "\u9fff" or "\uff00" <= ch <= "\uffef")
    return math.ceil(cjk * 0.6 + (len(text) - cjk) / 4)


def load_token_counter(path: str | Path) -> TokenCounter:
    """A token counter from a tokenizer.json (or .json.gz), or a directory holding one."""
    import tokenizers

    path = Path(path)
    if path.is_dir():
        candidates = [path / "tokenizer.json", path / "tokenizer.json.gz"]
        found = [p for p in candidates if p.is_file()]
        if not found:
            raise FileNotFoundError(f"no tokenizer.json or tokenizer.json.gz in {path}")
        path = found[0]
    if path.suffix == ".gz":
        backend = tokenizers.Tokenizer.from_str(gzip.decompress(path.read_bytes()).decode("utf-8"))
    else:
        backend = tokenizers.Tokenizer.from_file(str(path))
    return lambda text: len(backend.encode(text, add_special_tokens=False).ids)


def _fill(template: str, rng: random.Random, nouns: tuple[str, ...], adjectives: tuple[str, ...]) -> str:
    n1, n2 = rng.sample(nouns, 2)
    text = template.format(n1=n1, n2=n2, a1=rng.choice(adjectives))
    return re.sub(r"\b([Aa]) (?=[aeiou])", r"\1n ", text)


def question(rng: random.Random, lang: str) -> str:
    if lang == "zh":
        return _fill(rng.choice(ZH_QUESTIONS), rng, ZH_NOUNS, ("",))
    return _fill(rng.choice(EN_QUESTIONS), rng, EN_NOUNS, EN_ADJECTIVES)


def follow_up(rng: random.Random, lang: str) -> str:
    if lang == "zh":
        return _fill(rng.choice(ZH_FOLLOW_UPS), rng, ZH_NOUNS, ("",))
    return _fill(rng.choice(EN_FOLLOW_UPS), rng, EN_NOUNS, EN_ADJECTIVES)


def en_sentence(rng: random.Random) -> list[str]:
    """One English sentence as pieces: words, each with its leading space."""
    subject = [rng.choice(("the", "a", "every", "our")), rng.choice(EN_ADJECTIVES), rng.choice(EN_NOUNS)]
    words = [rng.choice(EN_CONNECTORS)] if rng.random() < 0.4 else []
    words += subject
    if rng.random() < 0.3:
        words.append(rng.choice(EN_ADVERBS))
    words += [rng.choice(EN_VERBS), "the", rng.choice(EN_NOUNS)]
    if rng.random() < 0.5:
        words += [
            rng.choice(("near", "behind", "inside", "beyond")),
            "the",
            rng.choice(EN_ADJECTIVES),
            rng.choice(EN_NOUNS),
        ]
    words[0] = words[0][0].upper() + words[0][1:]
    words[-1] += "."
    return [" " + w for w in words]


def en_short_sentence(rng: random.Random) -> list[str]:
    """A two-to-four-token English sentence, to fill small gaps."""
    return [
        " "
        + rng.choice(
            (
                "Thanks.",
                "Please help.",
                "I am new here.",
                "It is urgent.",
                "Hello.",
                "Sorry.",
                "I have been waiting for a while.",
                "Could you please answer quickly?",
                "My manager asked me to check.",
            )
        )
    ]


def zh_sentence(rng: random.Random) -> list[str]:
    """One Chinese sentence as pieces (words; Chinese has no spaces)."""
    pieces = [rng.choice(ZH_NOUNS), rng.choice(ZH_ADVERBS), rng.choice(ZH_VERBS), rng.choice(ZH_NOUNS)]
    if rng.random() < 0.4:
        pieces.insert(0, rng.choice(ZH_CONNECTORS))
    if rng.random() < 0.5:
        pieces += ["，", "并且", rng.choice(ZH_VERBS), "了", rng.choice(ZH_NOUNS)]
    pieces.append("。")
    return pieces


def zh_short_sentence(rng: random.Random) -> list[str]:
    """A one-to-three-token Chinese sentence, to fill small gaps."""
    return [
        rng.choice(
            ("谢谢。", "请帮忙。", "很急。", "你好。", "麻烦了。", "我已经等了很久了。", "请尽快回答我。")
        )
    ]


def code_line(rng: random.Random, depth: int) -> list[str]:
    """One line of plausible Python as a single piece."""
    a, b = rng.sample(CODE_IDENTIFIERS, 2)
    indent = "    " * depth
    line = rng.choice(
        (
            f"def {rng.choice(CODE_FUNCTIONS)}_{a}({a}, {b}=None):",
            f"{indent}{a} = {rng.choice(CODE_FUNCTIONS)}_{b}({b}, limit={rng.randint(2, 500)})",
            f"{indent}if {a} > {b}:",
            f"{indent}for {a} in {b}:",
            f"{indent}{a}.append({b}[{rng.randint(0, 9)}])",
            f"{indent}return {a} + {b}",
            f"{indent}# TODO: handle an empty {b}",
        )
    )
    return [line + "\n"]


def fit_pieces(make: Callable[[], list[str]], target: int, count: TokenCounter) -> str:
    """The longest text made of whole pieces from `make` whose token count is at most `target`.

    Pieces are drawn until the text passes the target, then the cut point is found by
    interpolation search on the number of pieces (a few tokenizer calls, not one per piece).
    Leading whitespace of the text is dropped.
    """
    if target <= 0:
        return ""
    pieces: list[str] = []
    estimate = 0
    for _ in range(32):
        while estimate < target * 1.25 + 8:
            new = make()
            pieces.extend(new)
            estimate += sum(estimate_tokens(p) for p in new)
        total = count("".join(pieces).lstrip())
        if total >= target:
            break
        estimate = total
    else:
        raise ValueError(
            f"the token counter gives {total} tokens for {len(''.join(pieces))} characters: not a token count"
        )
    if total == target:
        return "".join(pieces).lstrip()
    lo, c_lo, hi, c_hi = 0, 0, len(pieces), total  # invariant: count(lo) <= target < count(hi)
    bisect_next = False
    while hi - lo > 1:
        if bisect_next or c_hi == c_lo:
            mid = (lo + hi) // 2
        else:
            mid = lo + round((hi - lo) * (target - c_lo) / (c_hi - c_lo))
        mid = min(max(mid, lo + 1), hi - 1)
        width = hi - lo
        c = count("".join(pieces[:mid]).lstrip())
        if c <= target:
            lo, c_lo = mid, c
        else:
            hi, c_hi = mid, c
        bisect_next = (hi - lo) > width // 2  # interpolation stalled: bisect once
    return "".join(pieces[:lo]).lstrip()


def fit_sentences(rng: random.Random, target: int, count: TokenCounter, lang: str) -> str:
    """Whole sentences of prose, at most `target` tokens, short ones filling the gap at the end."""
    long_maker, short_maker = (
        (zh_sentence, zh_short_sentence) if lang == "zh" else (en_sentence, en_short_sentence)
    )
    text = fit_pieces(lambda: ["".join(long_maker(rng))], target, count)
    rest = target - count(text)
    if rest > 0:
        filler = fit_pieces(lambda: short_maker(rng), rest, count)
        joined = (text + ("" if lang == "zh" else " ") + filler).strip()
        if count(joined) <= target:
            text = joined
    return text


def pad_to(text: str, target: int, count: TokenCounter, filler: str = " the") -> str:
    """Append `filler` until the text has `target` tokens (or one more filler would pass it)."""
    n = count(text)
    for _ in range(min(max(0, target - n), 64)):
        longer = text + filler
        if count(longer) > target:
            break
        text = longer
    return text
