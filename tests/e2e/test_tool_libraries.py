"""Tool calls through the client libraries people use, unmodified, on the default model.

SmolLM2-135M's template renders no tools; omlx's fallback shows them in the system turn.
Each library is driven as its documentation shows and the test asserts what it hands its
user: a forced call and its arguments, the answer after the tool ran, a call's partial
objects as it streams, a call cut by ``max_tokens``. Slow (a real model on a CPU, about
ten requests a library); the libraries come with the ``clients`` extra.
"""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.slow
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import

DEFAULT = "smollm2-135m-instruct"
ASK = "What is the weather in Paris? Call get_weather."
WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": WEATHER_PARAMS,
    },
}


def base(server) -> str:
    return server.base_url + "/v1"


def test_openai_agents_calls_the_tool_then_answers(default_server):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    seen: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        seen.append(city)
        return "sunny, 24 C"

    model = agents.OpenAIChatCompletionsModel(
        model=DEFAULT, openai_client=AsyncOpenAI(base_url=base(default_server), api_key="x")
    )
    agent = agents.Agent(
        name="weather",
        instructions="Answer briefly.",
        tools=[get_weather],
        model=model,
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=40, temperature=0),
    )
    agents.set_tracing_disabled(True)
    result = agents.Runner.run_sync(agent, ASK, max_turns=3)
    # The forced turn called the tool (the SDK resets tool_choice after a call), and the
    # next turn answered in text.
    assert len(seen) == 1 and seen[0]
    assert isinstance(result.final_output, str) and result.final_output


def test_pydantic_ai_structured_output_is_a_forced_call(default_server):
    pydantic_ai = pytest.importorskip("pydantic_ai")
    from pydantic import BaseModel, Field
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Weather(BaseModel):
        city: str = Field(max_length=20)
        celsius: int = Field(ge=-50, le=60)

    model = OpenAIChatModel(
        DEFAULT, provider=OpenAIProvider(base_url=base(default_server), api_key="x")
    )
    agent = pydantic_ai.Agent(model, output_type=Weather)
    result = agent.run_sync(
        "Paris is 21 degrees. Report it.", model_settings={"max_tokens": 60, "temperature": 0}
    )
    assert isinstance(result.output, Weather) and -50 <= result.output.celsius <= 60


def test_instructor_tools_mode_and_partial_streaming(default_server):
    instructor = pytest.importorskip("instructor")
    from openai import OpenAI
    from pydantic import BaseModel, Field

    class City(BaseModel):
        name: str = Field(max_length=20)
        country: str = Field(max_length=20)

    client = instructor.from_openai(
        OpenAI(base_url=base(default_server), api_key="x"), mode=instructor.Mode.TOOLS
    )
    messages = [{"role": "user", "content": "Paris is in France. Extract the city."}]
    city = client.chat.completions.create(
        model=DEFAULT, response_model=City, messages=messages, max_tokens=60, temperature=0
    )
    assert isinstance(city, City) and city.name
    partials = list(
        client.chat.completions.create_partial(
            model=DEFAULT, response_model=City, messages=messages, max_tokens=60, temperature=0
        )
    )
    # The call streams as it forms: partial objects before the whole one.
    assert len(partials) > 2 and partials[-1].name == city.name
    assert any(p.name and p.country is None for p in partials)


def test_langchain_forced_call_streamed_and_cut(default_server):
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI

    def llm(max_tokens: int) -> ChatOpenAI:
        return ChatOpenAI(
            model=DEFAULT,
            base_url=base(default_server),
            api_key="x",
            max_tokens=max_tokens,
            temperature=0,
        )

    bound = llm(60).bind_tools([WEATHER_TOOL], tool_choice="get_weather")
    message = bound.invoke(ASK)
    (call,) = message.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    chunks = list(bound.stream(ASK))
    fragments = [c for chunk in chunks for c in chunk.tool_call_chunks]
    assert len(fragments) > 2 and fragments[0]["name"] == "get_weather"
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.tool_calls[0]["args"] == call["args"]
    # Cut by max_tokens inside the arguments: still the call, its JSON partial.
    cut = llm(16).bind_tools([WEATHER_TOOL], tool_choice="get_weather").invoke(ASK)
    assert cut.response_metadata["finish_reason"] == "length"
    calls = cut.tool_calls + cut.invalid_tool_calls
    assert [c["name"] for c in calls] == ["get_weather"] and not cut.content


def test_litellm_forced_call_whole_and_streamed(default_server):
    litellm = pytest.importorskip("litellm")
    args = dict(
        model=f"openai/{DEFAULT}",
        api_base=base(default_server),
        api_key="x",
        messages=[{"role": "user", "content": ASK}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    r = litellm.completion(**args)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    deltas = [
        tc
        for chunk in litellm.completion(**args, stream=True)
        for tc in (chunk.choices[0].delta.tool_calls or [])
    ]
    assert deltas[0].function.name == "get_weather" and len(deltas) > 2
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments


def test_auto_mode_shows_the_model_its_tools(default_server):
    from openai import OpenAI

    c = OpenAI(base_url=base(default_server), api_key="x")
    messages = [{"role": "user", "content": ASK}]
    plain = c.chat.completions.create(model=DEFAULT, messages=messages, max_tokens=1)
    auto = c.chat.completions.create(
        model=DEFAULT, messages=messages, tools=[WEATHER_TOOL], max_tokens=1
    )
    # The tools are in the prompt (the fallback's system turn), not dropped.
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 50


def test_the_ai_sdk_streams_a_forced_call(default_server):
    """The Vercel AI SDK (node), installed into tests/e2e/node by its install.sh."""
    import shutil
    import subprocess
    from pathlib import Path

    folder = Path(__file__).parent / "node"
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    if not (folder / "node_modules" / "ai").exists():
        installed = subprocess.run([str(folder / "install.sh")], capture_output=True, timeout=300)
        if installed.returncode != 0:
            pytest.skip(f"npm could not install the AI SDK: {installed.stderr.decode()[-300:]}")
    run = subprocess.run(
        ["node", str(folder / "ai_sdk_tools.mjs"), base(default_server), DEFAULT],
        capture_output=True,
        timeout=300,
        check=True,
    )
    out = json.loads(run.stdout)
    assert out["finishReason"] == "tool-calls"
    assert [c["name"] for c in out["calls"]] == ["get_weather"]
    assert isinstance(out["calls"][0]["input"]["city"], str)
    kinds = [p["type"] for p in out["parts"]]
    # The call's input streams: a start, deltas as the model writes them, the whole call.
    assert kinds[0] == "tool-input-start" and kinds.count("tool-input-delta") > 2
    assert kinds[-1] == "tool-call"
    streamed = "".join(p["delta"] for p in out["parts"] if p["type"] == "tool-input-delta")
    assert json.loads(streamed) == out["calls"][0]["input"]
