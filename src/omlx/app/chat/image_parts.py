"""Images in chat-template messages: where the client put each, and the content parts a
message holding images is rendered from (``{"type": "text"}`` / ``{"type": "image"}``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omlx.app.errors import InvalidRequest
from omlx.domain.json_values import JsonObject


@dataclass(frozen=True, slots=True)
class ImageSource:
    """An image as the client named it: a data URL or an http(s) URL, and where it was."""

    part: str  # "messages[2].content[1]", "input[0].content[1]"...
    url: str


def template_content(pieces: Sequence[str | ImageSource], joiner: str) -> str | list[JsonObject]:
    """A message's content: its text joined as before when it holds no image; else its parts
    in the client's order, adjacent texts joined the same way, one ``{"type": "image"}`` each."""
    if not any(isinstance(p, ImageSource) for p in pieces):
        return joiner.join(pieces)  # type: ignore[arg-type]
    parts: list[JsonObject] = []
    texts: list[str] = []
    for piece in pieces:
        if isinstance(piece, ImageSource):
            if texts:
                parts.append({"type": "text", "text": joiner.join(texts)})
                texts = []
            parts.append({"type": "image"})
        else:
            texts.append(piece)
    if texts:
        parts.append({"type": "text", "text": joiner.join(texts)})
    return parts


def sources_in(pieces: Sequence[str | ImageSource]) -> list[ImageSource]:
    return [p for p in pieces if isinstance(p, ImageSource)]


def refuse_image(part: str, role: str) -> InvalidRequest:
    """Images go in user messages (and tool results): a model reads none elsewhere."""
    return InvalidRequest(
        f"{part}: an image in a {role} message is not taken; send images in user messages",
        param=part,
    )


def check_detail(detail: str | None, param: str) -> None:
    """``detail`` other than auto would ask for a resolution omlx does not choose: the
    model's processor sizes every image its own way."""
    if detail not in (None, "auto"):
        raise InvalidRequest(
            f"{param} {detail!r} is not supported: the model's processor sizes images its own "
            "way; send 'auto' or leave it out",
            param=param,
        )
