"""Embedders, chosen by name in settings (`AMPKIT_EMBEDDER`). `none` keeps search keyword-only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .retrieval import Retriever

if TYPE_CHECKING:
    from .config import Settings


def retriever_from_settings(settings: "Settings") -> Retriever:
    name = settings.embedder
    if name == "none":
        return Retriever()
    raise ValueError(f"unknown embedder {name!r}")
