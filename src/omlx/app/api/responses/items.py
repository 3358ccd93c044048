"""Responses-API input items: checked into one canonical JSON form, and rendered as template
messages.

Canonical items have the shapes the SDK reads back from ``input_items`` (an ``id``, a
``status``, content parts typed by role); the request's items and a stored response's
items (``previous_response_id``) take the same path to the template. Consecutive
reasoning, assistant message and function_call items are one assistant turn, rendered as
the model produced it: reasoning from the sealed text in ``encrypted_content``, text and
calls as they were, so the next prompt starts with the tokens of the last one.
"""

from __future__ import annotations

import logging
import uuid

from omlx.app.api.openai.translate import template_arguments
from omlx.app.api.responses.schemas import InputItem, Part
from omlx.app.chat.image_parts import (
    ImageSource,
    check_detail,
    refuse_image,
    sources_in,
    template_content,
)
from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.errors import InvalidRequest
from omlx.domain.json_values import JsonObject

log = logging.getLogger(__name__)

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def canonical_items(value: str | list[InputItem] | None) -> list[JsonObject]:
    """The request's ``input`` as canonical items; a 400 naming the item that cannot be rendered."""
    if value is None:
        return []
    if isinstance(value, str):
        return [_message("user", [{"type": "input_text", "text": value}], None)]
    return [_canonical(item, f"input[{k}]") for k, item in enumerate(value)]


def _canonical(item: InputItem, where: str) -> JsonObject:
    kind = item.type or ("message" if item.role is not None else None)
    if kind == "message":
        if item.role not in ROLES:
            raise InvalidRequest(
                f"{where}: a message needs a role of {', '.join(ROLES)}", param=where
            )
        return _message(item.role, _parts(item.content, item.role, where), item.id)
    if kind == "function_call":
        if not item.call_id or not item.name:
            raise InvalidRequest(
                f"{where}: a function_call needs a call_id and a name", param=where
            )
        out = {
            "id": item.id or new_id("fc"),
            "type": "function_call",
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments if item.arguments is not None else "{}",
            "status": "completed",
        }
        if item.namespace:
            out["namespace"] = item.namespace
        return out
    if kind == "function_call_output":
        if not item.call_id:
            raise InvalidRequest(f"{where}: a function_call_output needs a call_id", param=where)
        output = item.output
        if isinstance(output, list):
            output = [{"type": "input_text", "text": t} for t in _texts(output, where)]
        return {
            "id": item.id or new_id("fco"),
            "type": "function_call_output",
            "call_id": item.call_id,
            "output": output if output is not None else "",
            "status": "completed",
        }
    if kind == "reasoning":
        out = {
            "id": item.id or new_id("rs"),
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": p.text or ""} for p in item.summary or []],
        }
        if isinstance(item.content, list):
            out["content"] = [
                {"type": "reasoning_text", "text": p.text or ""} for p in item.content
            ]
        if item.encrypted_content:
            out["encrypted_content"] = item.encrypted_content
        return out
    raise InvalidRequest(
        f"{where}: input items of type {kind!r} are not supported; omlx renders messages, "
        "function_call, function_call_output and reasoning items",
        param=where,
    )


def _message(role: str, parts: list[JsonObject], item_id: str | None) -> JsonObject:
    return {
        "id": item_id or new_id("msg"),
        "type": "message",
        "role": role,
        "content": parts,
        "status": "completed",
    }


def _parts(content: str | list[Part] | None, role: str, where: str) -> list[JsonObject]:
    """Content parts typed as the role's own (output_text for the assistant, else input_text)."""
    if content is None:
        content = ""
    if isinstance(content, str):
        texts = [content]
    elif role == "user" and any(p.type == "input_image" for p in content):
        return [_user_part(p, f"{where}.content[{j}]") for j, p in enumerate(content)]
    else:
        for j, p in enumerate(content):
            if p.type == "input_image":
                raise refuse_image(f"{where}.content[{j}]", role)
        texts = _texts(content, where, refusal_ok=role == "assistant")
    if role == "assistant":
        return [{"type": "output_text", "text": t, "annotations": []} for t in texts]
    return [{"type": "input_text", "text": t} for t in texts]


def _user_part(part: Part, where: str) -> JsonObject:
    """A user message's part, canonical: input_text, or input_image with its URL."""
    if part.type != "input_image":
        return {"type": "input_text", "text": _texts([part], where.rsplit(".", 1)[0])[0]}
    if part.file_id:
        raise InvalidRequest(
            f"{where}.file_id: omlx has no Files API; send the image as a data URL in image_url",
            param=f"{where}.file_id",
        )
    if not part.image_url:
        raise InvalidRequest(f"{where}: an input_image needs an image_url", param=where)
    check_detail(part.detail, f"{where}.detail")
    return {"type": "input_image", "image_url": part.image_url, "detail": part.detail or "auto"}


def _pieces(parts: list[JsonObject], where: str) -> list[str | ImageSource]:
    """A canonical user message's text and images in order; ``where``: the item."""
    return [
        ImageSource(f"{where}.content[{j}]", p["image_url"])
        if p.get("type") == "input_image"
        else p.get("text") or ""
        for j, p in enumerate(parts)
    ]


def _texts(parts: list[Part], where: str, refusal_ok: bool = False) -> list[str]:
    out = []
    for part in parts:
        if part.type in TEXT_PARTS:
            out.append(part.text or "")
        elif part.type == "refusal" and refusal_ok:
            out.append(part.refusal or "")
        else:
            raise InvalidRequest(
                f"{where}: content of type {part.type!r} is not supported; send text", param=where
            )
    return out


def _joined(parts: list[JsonObject] | None) -> str:
    return "".join(p.get("text") or "" for p in parts or [])


class ItemRenderer:
    """Canonical items as chat-template messages, each labelled with the item it starts at
    (``input[k]``, k counted in the resolved conversation, as ``input_items`` lists it)."""

    def __init__(self, normalizer: PromptNormalizer, seal: ReasoningSeal) -> None:
        self.normalizer = normalizer
        self.seal = seal

    def messages(
        self,
        items: list[JsonObject],
        leading_system: bool = True,
        images: list[ImageSource] | None = None,
    ) -> tuple[list[JsonObject], list[str]]:
        """The template messages and their labels; user images are added to ``images``."""
        out: list[JsonObject] = []
        labels: list[str] = []
        turn: JsonObject | None = None  # the assistant turn being gathered
        for k, item in enumerate(items):
            kind, role = item["type"], item.get("role")
            if kind in ("reasoning", "function_call") or role == "assistant":
                leading_system = False
                if turn is None:
                    turn = {"role": "assistant", "content": ""}
                    out.append(turn)
                    labels.append(f"input[{k}]")
                self._add_to_turn(turn, item)
                continue
            turn = None
            if kind == "function_call_output":
                output = item["output"]
                text = output if isinstance(output, str) else _joined(output)
                message = {"role": "tool", "tool_call_id": item["call_id"], "content": text}
            elif role in ("system", "developer"):
                kept = self.normalizer.system_blocks(p["text"] for p in item["content"])
                if item["content"] and not kept:
                    continue  # a block the prompt normalizations remove whole
                message = {"role": "system", "content": "".join(kept)}
            else:
                pieces = _pieces(item["content"], f"input[{k}]")
                message = {"role": "user", "content": template_content(pieces, "")}
                if images is not None:
                    images.extend(sources_in(pieces))
            leading_system = leading_system and message["role"] == "system"
            out.append(message)
            labels.append("system" if leading_system else f"input[{k}]")
        return out, labels

    def _add_to_turn(self, turn: JsonObject, item: JsonObject) -> None:
        kind = item["type"]
        if kind == "reasoning":
            text = self.reasoning_text(item)
            if text:
                turn["reasoning_content"] = turn.get("reasoning_content", "") + text
        elif kind == "function_call":
            turn.setdefault("tool_calls", []).append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {
                        "name": item["name"],
                        "arguments": template_arguments(item["arguments"]),
                    },
                }
            )
        else:
            turn["content"] += _joined(item["content"])

    def reasoning_text(self, item: JsonObject) -> str:
        """The reasoning as the model produced it (sealed), else the text the item shows."""
        sealed = item.get("encrypted_content")
        if sealed:
            text = self.seal.open(sealed)
            if text is not None:
                return text
            log.info(
                "reasoning item %s: its encrypted_content was not sealed by this server "
                "(another provider's, or another cache folder's key) and is dropped",
                item.get("id"),
            )
        if item.get("content"):
            return _joined(item["content"])
        return "\n\n".join(p["text"] for p in item.get("summary") or [] if p.get("text"))
