"""Images through each API's own form, on the fake app: a text model refuses them (400, the
part named, nothing tokenized); a model that takes images gets them decoded, in order, with
template content parts where they were sent."""

from __future__ import annotations

import base64
import io

import msgspec
import pytest
from litestar.testing import TestClient
from PIL import Image

from omlx.app.api.anthropic.schemas import MessagesRequest
from omlx.app.api.anthropic.translate import Translator as AnthropicTranslator
from omlx.app.api.app import create_app
from omlx.app.api.openai.schemas import ChatCompletionRequest
from omlx.app.api.openai.translate import chat_request
from omlx.app.api.responses.schemas import ResponsesRequest
from omlx.app.api.responses.translate import Translator as ResponsesTranslator
from omlx.app.chat.normalize import PromptNormalizer
from omlx.app.chat.sealing import ReasoningSeal
from omlx.app.chat.service import GenerationService
from omlx.domain.images import image_digest
from tests.unit.api_fakes import MODEL, FakeEngine, fake_container, reply

NOT_TAKEN = f"model {MODEL!r} does not take images; serve a vision-language model"


def png(width: int, height: int, color: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, format="PNG")
    return out.getvalue()


RED, BLUE = png(4, 3, (255, 0, 0)), png(2, 5, (0, 0, 255))
RED_B64 = base64.b64encode(RED).decode()
RED_URL = "data:image/png;base64," + RED_B64
BLUE_URL = "data:image/png;base64," + base64.b64encode(BLUE).decode()


def openai_image(url: str, **extra) -> dict:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def anthropic_image(data: str = RED_B64) -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


OPENAI = {
    "model": MODEL,
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what is"}, openai_image(RED_URL)]}
    ],
}
ANTHROPIC = {
    "model": MODEL,
    "max_tokens": 5,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, anthropic_image()]}],
}
ANTHROPIC_TOOL_RESULT = {
    "model": MODEL,
    "max_tokens": 5,
    "messages": [
        {"role": "user", "content": "read it"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "the file:"}, anthropic_image()],
                }
            ],
        },
    ],
}
RESPONSES = {
    "model": MODEL,
    "input": [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what is"},
                {"type": "input_image", "image_url": RED_URL},
            ],
        }
    ],
}


@pytest.mark.parametrize(
    ("path", "body", "part"),
    [
        ("/v1/chat/completions", OPENAI, "messages[0].content[1]"),
        ("/v1/messages", ANTHROPIC, "messages[0].content[1]"),
        ("/v1/messages", ANTHROPIC_TOOL_RESULT, "messages[2].content[0].content[1]"),
        ("/v1/messages/count_tokens", ANTHROPIC, "messages[0].content[1]"),
        ("/v1/responses", RESPONSES, "input[0].content[1]"),
    ],
)
def test_a_text_model_refuses_images_naming_the_part(path, body, part):
    engine = FakeEngine(reply("ok"))
    with TestClient(create_app(fake_container(engine))) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert NOT_TAKEN in error["message"]
    if "param" in error:  # OpenAI's envelope has it; Anthropic's has none
        assert error["param"] == part
    assert engine.submitted == []


HOSTILE = [
    ("/v1/chat/completions", "openai", "not an image"),
    ("/v1/messages", "anthropic", "not an image"),
    ("/v1/responses", "responses", "not an image"),
]


@pytest.mark.parametrize(("path", "form", "fragment"), HOSTILE)
def test_a_bad_image_is_refused_for_what_it_is(path, form, fragment):
    junk = base64.b64encode(b"plain text, not pixels").decode()
    body = {
        "openai": {
            "model": MODEL,
            "messages": [
                {"role": "user", "content": [openai_image("data:image/png;base64," + junk)]}
            ],
        },
        "anthropic": {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [anthropic_image(junk)]}],
        },
        "responses": {
            "model": MODEL,
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "data:image/png;base64," + junk}
                    ],
                }
            ],
        },
    }[form]
    with TestClient(create_app(fake_container())) as c:
        r = c.post(path, json=body)
    assert r.status_code == 400, r.text
    assert fragment in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"messages": [{"role": "system", "content": [openai_image(RED_URL)]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [openai_image(RED_URL)]},
                ]
            },
            "messages[1].content[0]",
        ),
        (
            {"messages": [{"role": "user", "content": [openai_image(RED_URL, detail="low")]}]},
            "messages[0].content[0].image_url.detail",
        ),
        (
            {"messages": [{"role": "user", "content": [openai_image("file:///etc/passwd")]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [openai_image("https://example.com/a.png")]}
                ]
            },
            "messages[0].content[0]",
        ),
    ],
)
def test_images_where_no_model_reads_them(body, param):
    with TestClient(create_app(fake_container())) as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_an_image_in_an_anthropic_assistant_turn_is_refused():
    body = {
        "model": MODEL,
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [anthropic_image()]},
        ],
    }
    with TestClient(create_app(fake_container())) as c:
        r = c.post("/v1/messages", json=body)
    assert r.status_code == 400, r.text
    assert "messages[1].content[0]" in r.json()["error"]["message"]


# ---- a model that takes images -----------------------------------------------------


@pytest.fixture
def vision(monkeypatch):
    """The fake model as a VLM: its prompt's text tokens (a real VLM's processor would
    expand the image parts; tests/e2e/test_vision.py drives those)."""
    monkeypatch.setattr(GenerationService, "accepts_images", property(lambda self: True))
    monkeypatch.setattr(
        GenerationService,
        "encode_prompt",
        lambda self, text, images, param="messages", **keyed: self.encode_text(text, param),
    )


def test_images_reach_the_engine_in_order(vision):
    engine = FakeEngine(reply("ok"))
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": [openai_image(RED_URL), {"type": "text", "text": "and"}]},
            {"role": "assistant", "content": "a red one"},
            {"role": "user", "content": [openai_image(BLUE_URL)]},
        ],
    }
    with TestClient(create_app(fake_container(engine))) as c:
        r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    images = engine.submitted[0].images
    assert [(i.width, i.height, i.part) for i in images] == [
        (4, 3, "messages[0].content[0]"),
        (2, 5, "messages[2].content[0]"),
    ]
    assert images[0].digest == image_digest(4, 3, bytes([255, 0, 0]) * 12)


def test_text_only_requests_render_as_before(vision):
    engine = FakeEngine(reply("ok"))
    with TestClient(create_app(fake_container(engine))) as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    }
                ],
            },
        )
    assert r.status_code == 200, r.text
    assert bytes(engine.submitted[0].prompt_tokens).decode() == "<user>ab\n<assistant>"
    assert engine.submitted[0].images == ()


# ---- the template content each API's translator makes ----------------------------------


def test_openai_content_parts():
    data = msgspec.convert(OPENAI, ChatCompletionRequest)
    chat = chat_request(data, MODEL, PromptNormalizer())
    assert chat.messages[0]["content"] == [{"type": "text", "text": "what is"}, {"type": "image"}]
    assert [s.part for s in chat.image_sources] == ["messages[0].content[1]"]


def test_anthropic_tool_result_is_one_tool_message_of_parts():
    data = msgspec.convert(ANTHROPIC_TOOL_RESULT, MessagesRequest)
    chat = AnthropicTranslator(PromptNormalizer(), ReasoningSeal(b"k" * 32)).chat_request(
        data, MODEL
    )
    tool = chat.messages[-1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == "t1"
    assert tool["content"] == [{"type": "text", "text": "the file:"}, {"type": "image"}]
    assert chat.messages[0]["content"] == "read it"  # text only: a string, as before
    assert [s.part for s in chat.image_sources] == ["messages[2].content[0].content[1]"]


def test_anthropic_error_tool_result_keeps_its_prefix():
    body = {**ANTHROPIC_TOOL_RESULT}
    body["messages"] = [
        *body["messages"][:2],
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "is_error": True,
                    "content": [anthropic_image()],
                }
            ],
        },
    ]
    data = msgspec.convert(body, MessagesRequest)
    chat = AnthropicTranslator(PromptNormalizer(), ReasoningSeal(b"k" * 32)).chat_request(
        data, MODEL
    )
    assert chat.messages[-1]["content"] == [{"type": "text", "text": "Error: "}, {"type": "image"}]


def test_responses_content_parts():
    data = msgspec.convert(RESPONSES, ResponsesRequest)
    translated = ResponsesTranslator(PromptNormalizer(), ReasoningSeal(b"k" * 32)).translate(
        data, MODEL
    )
    chat = translated.chat
    assert chat.messages[0]["content"] == [{"type": "text", "text": "what is"}, {"type": "image"}]
    assert [s.part for s in chat.image_sources] == ["input[0].content[1]"]
    stored = translated.items[0]["content"][1]
    assert stored == {"type": "input_image", "image_url": RED_URL, "detail": "auto"}


def test_the_prompt_keys_images_as_the_callers_tenant_and_no_store(monkeypatch, tmp_path):
    """The tenant (its own key ids and rows) and no-store (keep no rows) reach the model's
    prompt maker with the images (``PromptImages.key_tokens``)."""
    from tests.tenant_keys import ALICE, ROOT, keys_file

    seen = []

    def encode_prompt(self, text, images, param="messages", *, tenant=None, store=None):
        seen.append((tenant, store))
        return self.encode_text(text, param)

    monkeypatch.setattr(GenerationService, "accepts_images", property(lambda self: True))
    monkeypatch.setattr(GenerationService, "encode_prompt", encode_prompt)
    engine = FakeEngine(reply("ok"))
    body = {"model": MODEL, "messages": [{"role": "user", "content": [openai_image(RED_URL)]}]}
    container = fake_container(engine, api_key=ROOT, api_keys_file=keys_file(tmp_path))
    with TestClient(create_app(container)) as c:
        alice = {"Authorization": f"Bearer {ALICE}", "x-omlx-cache-control": "no-store"}
        assert c.post("/v1/chat/completions", json=body, headers=alice).status_code == 200
        assert seen[0] == ("alice", False)
        seen.clear()
        root = {"Authorization": f"Bearer {ROOT}"}
        assert c.post("/v1/chat/completions", json=body, headers=root).status_code == 200
        assert seen[0] == (None, True)
