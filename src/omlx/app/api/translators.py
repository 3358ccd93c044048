"""The Anthropic and Responses translators, built one way: the container's prompt normalizer
and reasoning seal, and whether the served model's chat template takes a reasoning effort."""

from __future__ import annotations

from typing import Protocol, TypeVar

from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.models.pool import Served
from omlx.app.wiring.container import Container

T_co = TypeVar("T_co", covariant=True)


class TranslatorKind(Protocol[T_co]):
    """A translator class: ``anthropic.translate.Translator`` or ``responses.translate.Translator``."""

    def __call__(
        self, normalizer: PromptNormalizer, seal: ReasoningSeal, *, effort_kwarg: bool = False
    ) -> T_co: ...


def translator(kind: TranslatorKind[T_co], container: Container, served: Served) -> T_co:
    """A ``kind`` translator for requests to ``served`` (a chat model)."""
    assert served.chat is not None, "the pool hands a chat route a chat model"
    return kind(
        container.normalizer,
        container.seal,
        effort_kwarg=served.chat.renderer.accepts_reasoning_effort,
    )
