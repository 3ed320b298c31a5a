"""Reading a Prometheus endpoint as a scraper does: over HTTP, parsed with
prometheus_client's own parser."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Samples:
    """One scrape: every sample, by its name and labels."""

    samples: tuple[tuple[str, Mapping[str, str], float], ...]
    families: Mapping[str, str]
    """Each metric family's type, by family name (a counter's without ``_total``)."""

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` whose labels include ``labels`` (0 if
        none: a labelled metric appears once a label value is first counted)."""
        return sum(
            value
            for sample, found, value in self.samples
            if sample == name and all(found.get(k) == v for k, v in labels.items())
        )

    def label_values(self, name: str, label: str) -> set[str]:
        """The values ``label`` takes among the samples named ``name``."""
        return {found[label] for sample, found, _ in self.samples if sample == name}


def parse(text: str) -> Samples:
    """An exposition in Prometheus's text format."""
    samples: list[tuple[str, Mapping[str, str], float]] = []
    families: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = family.type
        samples.extend((s.name, dict(s.labels), s.value) for s in family.samples)
    return Samples(tuple(samples), families)


def scrape(url: str, headers: Mapping[str, str] | None = None) -> Samples:
    """GET ``url`` (a ``/metrics`` endpoint) and parse it."""
    response = httpx.get(url, headers=headers, timeout=10)
    response.raise_for_status()
    assert response.headers["content-type"].startswith("text/plain"), response.headers
    return parse(response.text)


def free_port() -> int:
    """A port nothing listens on now (the system's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
