"""Speculative decoding through real servers and the openai client: the same text as
``--no-speculation``, and what it did in /metrics and the debug line."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Iterator

import openai
import pytest

from tests.e2e.test_auth_cancel_metrics import _samples
from tests.server_process import ServerProcess

LOOKUP = (("method", "lookup"),)


def copy_prompt(whole_file: bool = True) -> str:
    """An agent's edit: repeat a function of a file it was shown.

    ``whole_file=False`` shows ``fill`` alone (~180 prompt tokens, not ~1,400): the model
    still copies it, and the default run does not pay the long prefill on a CPU.
    """
    source = inspect.getsource(textwrap)
    if whole_file:
        file = source[source.index("def wrap(") :]
    else:
        file = source[source.index("\ndef fill(") + 1 : source.index("\ndef shorten(")]
    return f"File textwrap.py:\n```python\n{file}\n```\nRepeat the function `fill` exactly, in a code block."


def ask(server: ServerProcess, content: str, max_tokens: int) -> str:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)
    reply = client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def test_a_copying_answer_drafts_and_metrics_say_so(default_server):
    before = _samples(default_server)
    text = ask(default_server, copy_prompt(whole_file=False), 48)
    assert "def fill" in text
    after = _samples(default_server)
    drafted = after[("omlx_speculative_draft_tokens_total", LOOKUP)] - before.get(
        ("omlx_speculative_draft_tokens_total", LOOKUP), 0
    )
    accepted = after[("omlx_speculative_accepted_tokens_total", LOOKUP)] - before.get(
        ("omlx_speculative_accepted_tokens_total", LOOKUP), 0
    )
    assert drafted > 0 and 0 < accepted <= drafted
    assert after[("omlx_speculative_acceptance_count", LOOKUP)] >= 1


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    work = tmp_path_factory.mktemp("speculation")
    speculating = ServerProcess(
        "--log-level", "debug", "--no-cache", log_path=work / "speculating.log"
    )
    plain = ServerProcess("--no-speculation", "--no-cache", log_path=work / "plain.log")
    with speculating, plain:
        yield speculating, plain


@pytest.mark.slow
def test_the_same_text_with_and_without_speculation(two_servers):
    speculating, plain = two_servers
    prompts = [
        copy_prompt(),
        "Write a long story about a lighthouse keeper who collects maps.",
        "List the planets of the solar system with one fact each.",
    ]
    for prompt in prompts:
        assert ask(speculating, prompt, 120) == ask(plain, prompt, 120)
    log = speculating.read_log()
    assert "speculation: lookup:" in log and "drafted tokens accepted" in log
    assert "speculative decoding of smollm2-135m-instruct: off" in plain.read_log()
    assert not any(name == "omlx_speculative_draft_tokens_total" for name, _ in _samples(plain))
