"""One scrape of a server's ``/metrics``: fetched over HTTP, parsed with prometheus_client's text
parser into samples that the figures read by name and labels."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

PREFIX = "swiftlm:"


class TopError(Exception):
    """A server that cannot be watched: down, not answering /metrics, or not swiftlm. The message
    is the one line shown to the user."""


def metrics_url(url: str) -> str:
    """``http://host:8000``, ``.../v1`` or ``.../metrics`` -> the ``/metrics`` URL."""
    base = url.strip().rstrip("/")
    if "://" not in base:
        base = "http://" + base
    if base.endswith("/metrics"):
        return base
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return base + "/metrics"


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass
class Scrape:
    """The samples of one scrape by sample name (``swiftlm:prompt_tokens_total``, ``..._bucket``),
    taken at ``time`` (monotonic seconds)."""

    time: float
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.samples

    def value(self, name: str, **labels: str) -> float | None:
        """The sum over the label sets that match ``labels`` (None: no such sample)."""
        found = [s.value for s in self.samples.get(name, ()) if all(s.labels.get(k) == v for k, v in labels.items())]
        return sum(found) if found else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``name``'s values summed per value of ``label``."""
        out: dict[str, float] = {}
        for s in self.samples.get(name, ()):
            key = s.labels.get(label, "")
            out[key] = out.get(key, 0.0) + s.value
        return out

    def buckets(self, histogram: str) -> list[tuple[float, float]]:
        """(upper bound, cumulative count) of ``histogram``, summed over its other labels, by bound."""
        by_bound: dict[float, float] = {}
        for s in self.samples.get(histogram + "_bucket", ()):
            bound = float(s.labels["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + s.value
        return sorted(by_bound.items())

    def labels_of(self, name: str) -> list[Mapping[str, str]]:
        return [s.labels for s in self.samples.get(name, ())]


def parse(text: str, at: float) -> Scrape:
    """Prometheus text -> a Scrape; raises TopError when it is not a swiftlm server's."""
    scrape = Scrape(at)
    try:
        families: Iterable = list(text_string_to_metric_families(text))
    except Exception as exc:  # prometheus_client raises ValueError (and others) on text it cannot read
        raise TopError(f"the answer is not Prometheus metrics ({exc})") from exc
    for family in families:
        for s in family.samples:
            scrape.samples.setdefault(s.name, []).append(Sample(dict(s.labels), float(s.value)))
    if not any(name.startswith(PREFIX) for name in scrape.samples):
        raise TopError("the server answers /metrics but is not swiftlm (no swiftlm: metrics)")
    return scrape


def fetch(url: str, api_key: str | None = None, timeout_s: float = 5.0, client: httpx.Client | None = None) -> Scrape:
    """GET ``url``'s /metrics and parse it; every failure is a TopError with a one-line reason."""
    target = metrics_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        if client is not None:
            response = client.get(target, headers=headers, timeout=timeout_s)
        else:
            response = httpx.get(target, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        reason = str(exc) or type(exc).__name__
        raise TopError(f"cannot reach {target}: {reason}") from exc
    if response.status_code == 401:
        raise TopError(f"{target} needs an API key (--api-key)")
    if response.status_code != 200:
        raise TopError(f"{target} answered HTTP {response.status_code}; is it a swiftlm server?")
    return parse(response.text, time.monotonic())
