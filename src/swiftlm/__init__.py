"""swiftlm: low-latency serving of small language models."""

from swiftlm.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # LLM pulls in torch and the engine; import it lazily so `swiftlm --help` stays fast.
    if name == "LLM":
        from swiftlm.llm import LLM

        return LLM
    raise AttributeError(name)
