"""``Translators``: each API family's wire shape into one ``ChatRequest``, built one way.

They share the server's prompt normalizer and reasoning seal, and ask the served model's
chat template whether it takes a reasoning effort. Handlers receive one (a dependency).
Translating is quick and synchronous; the images a request names are read after it
(``read_images``), off the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omlx.app.api.anthropic.translate import Translator as AnthropicTranslator
from omlx.app.api.openai.schemas import ChatCompletionRequest
from omlx.app.api.openai.translate import chat_request
from omlx.app.api.responses.translate import Translator as ResponsesTranslator
from omlx.app.chat.image_reader import ImageReader
from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.pipeline import ChatPipeline, ChatRequest
from omlx.app.chat.sealing import ReasoningSeal


@dataclass(frozen=True, slots=True)
class Translators:
    normalizer: PromptNormalizer
    seal: ReasoningSeal  # signs the reasoning a client sends back unread
    images: ImageReader = field(default_factory=ImageReader)  # the server's image limits

    async def read_images(self, chat: ChatRequest) -> ChatRequest:
        """``chat`` with the images it names decoded (a 400 naming the first bad one)."""
        if chat.image_sources:
            chat.images = await self.images.read(chat.image_sources)
        return chat

    def openai(self, data: ChatCompletionRequest, model_id: str, chat: ChatPipeline) -> ChatRequest:
        effort = chat.renderer.accepts_reasoning_effort
        return chat_request(data, model_id, self.normalizer, effort_kwarg=effort)

    def anthropic(self, chat: ChatPipeline) -> AnthropicTranslator:
        effort = chat.renderer.accepts_reasoning_effort
        return AnthropicTranslator(self.normalizer, self.seal, effort_kwarg=effort)

    def responses(self, chat: ChatPipeline) -> ResponsesTranslator:
        effort = chat.renderer.accepts_reasoning_effort
        return ResponsesTranslator(self.normalizer, self.seal, effort_kwarg=effort)
