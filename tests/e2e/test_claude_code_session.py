"""A long Claude Code session, driven by the real CLI over the session model (issue 38).

Claude Code runs its tools for real in a project folder: the model's answers are tool calls
(Bash, Read, Write, Edit, Glob, Grep; two Agents at once, whose sub-agents make calls of
their own) scripted in ``tests/session_model.py``. A session of 21 model calls with the two
sub-agents, a restart of the server, ``--continue`` of that session, then a second session:
32 scripted calls, with a template that renders system messages anywhere and with a strict
Mistral-style one. A recording proxy between the CLI and the server keeps every request;
each is rendered into tokens the server's way (``held_prefix``) to know the longest prefix
an earlier request left in the cache. The server must compute none of it again, and the
second of the two sub-agents started together must restore what it shares with the first
and have its first token no later than 1.2x the first's.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict, deque

import pytest

from tests.e2e.agent_cli import ClaudeCode, failed_requests
from tests.e2e.held_prefix import (
    PromptTokens,
    Turn,
    common_prefix,
    dump,
    held_turns,
    model_calls,
    usage_of,
)
from tests.e2e.recording_proxy import RecordingProxy, save
from tests.server_process import ServerProcess
from tests.session_model import (
    MODEL_ID,
    OTHER_CUE,
    answers,
    build_session_model,
    cue,
    plays,
    prompt_for,
)

BLOCK_SIZE = 64  # the server's default
TOOLS = "Bash,Read,Write,Edit,Glob,Grep,Agent"


@pytest.mark.slow  # a server and a restart, three Claude Code runs: about 45 s each
@pytest.mark.parametrize("family", ["chatml", "mistral"])
def test_a_long_claude_code_session_recomputes_nothing_the_cache_holds(
    agent_clis, tmp_path, family
):
    project = tmp_path / "project"
    model = build_session_model(tmp_path / MODEL_ID, project, family)
    scripted = plays(project)
    server = ServerProcess(
        "--model",
        str(model),
        "--log-level",
        "debug",
        cache_dir=tmp_path / "cache",
        log_path=tmp_path / "server.log",
    )
    with server, RecordingProxy(server.base_url) as proxy:
        claude = ClaudeCode(agent_clis, proxy, tmp_path)
        allowed = ("--allowedTools", TOOLS)  # a list of values: after the prompt
        results = {
            "alpha": claude.ask(prompt_for("alpha", "Take notes, with two helpers."), *allowed)
        }
        server.stop()
        server.start()  # the same port and cache folder
        results["epsilon"] = claude.ask("--continue", prompt_for("epsilon", "Go on."), *allowed)
        results["delta"] = claude.ask(prompt_for("delta", "Look at the notes."), *allowed)
        log = server.read_log()
    save(proxy.exchanges, tmp_path / "exchanges.jsonl")  # for whoever reads a failure

    # Claude Code ran every scripted step: the tools' work is in the project folder.
    for play, result in results.items():
        assert result["result"] == scripted[play][-1].text, result
    assert results["alpha"]["subagent_stats"]["completed"] == 2, results["alpha"]
    notes = project / "notes"
    assert (notes / "todo.txt").read_text() == "1. write notes\n2. read them, then count them\n"
    assert (notes / "beta.txt").read_text() == "beta read it\n"
    assert (notes / "gamma.txt").read_text() == "gamma found the plan\n"
    assert sorted(p.name for p in (project / "build").iterdir()) == [
        "beta.txt",
        "gamma.txt",
        "todo.txt",
    ]
    assert (notes / "delta.txt").exists() and (notes / "epsilon.txt").exists()
    assert "POST /v1/messages?beta=true" in log and not failed_requests(log)

    tokens_of = PromptTokens(model, MODEL_ID)
    encode = tokens_of.tokenizer.encode
    answer_ids = {
        encode(c, add_special_tokens=False)[0]: encode(a, add_special_tokens=False)
        for c, a in answers(family, scripted).items()
    }
    engine = engine_requests(log)
    # The server's number and time to first token of each request, matched by usage (in the
    # order they came, where two have the same).
    served = {e.seq: engine[usage_of(e)].popleft() for e in model_calls(proxy.exchanges)}
    turns = held_turns(
        proxy.exchanges,
        tokens_of,
        lambda prompt: answer_ids.get(prompt[-1], []),
        lambda exchange: served[exchange.seq][0],
        BLOCK_SIZE,
    )
    dump(turns, tmp_path / "turns.jsonl")
    decode = tokens_of.tokenizer.decode
    cue_of = {t.seq: decode([t.tokens[-1]], skip_special_tokens=False) for t in turns}

    # Every scripted step was asked for once (a side request would get OTHER_CUE).
    steps = [cue(p, i) for p, s in scripted.items() for i in range(len(s))]
    asked = [cue_of[t.seq] for t in turns if cue_of[t.seq] != OTHER_CUE]
    assert sorted(asked) == sorted(steps), asked
    assert len(asked) >= 30

    # The prompts rendered here are the server's own, token for token...
    assert [len(t.tokens) for t in turns] == [t.prompt for t in turns]
    # ...and of no request did the server compute again what an earlier one left it.
    lost = [t for t in turns if t.recomputed]
    assert not lost, [(t.seq, cue_of[t.seq], t.prompt, t.cached, t.held, t.held_from) for t in lost]

    # The two sub-agents started together: the one the server took second restores what it
    # shares with the first (waiting for it while the first computes it), and answers no later.
    first, second = (t for t in turns if cue_of[t.seq] in (cue("beta", 0), cue("gamma", 0)))
    assert second.started < first.ended  # started together
    shared = common_prefix(first.tokens, second.tokens)
    assert shared > 5000
    assert second.cached >= 0.95 * shared, (shared, second)
    ttft = {t.seq: served[t.seq][1] for t in (first, second)}
    assert ttft[second.seq] <= 1.2 * ttft[first.seq], ttft

    # After the restart, --continue restored the session from disk.
    continued = next(t for t in turns if cue_of[t.seq] == cue("epsilon", 0))
    assert continued.order[0] == 1 and continued.cached > 0.9 * continued.prompt
    if family == "mistral":
        assert "refuses system messages after the first user message" in log

    report(family, turns, cue_of, (first, second), shared, ttft)


def engine_requests(log: str) -> dict[tuple[int, int], deque[tuple[tuple[int, int], float]]]:
    """Each finished request's (server run, request number) and time to first token (from
    when the server took it), by its (prompt tokens, cached tokens), in the log's order."""
    found: dict[tuple[int, int], deque[tuple[tuple[int, int], float]]] = defaultdict(deque)
    runs = log.split("Started server process")[1:]
    pattern = re.compile(
        r"request (\d+) \(\S+\) \w+: prompt (\d+) tokens, (\d+) cached.*?, first token ([\d.]+) s"
    )
    for run, text in enumerate(runs):
        for m in pattern.finditer(text):
            usage = int(m.group(2)), int(m.group(3))
            found[usage].append(((run, int(m.group(1))), float(m.group(4))))
    return found


def report(
    family: str,
    turns: list[Turn],
    cue_of: dict[int, str],
    pair: tuple[Turn, Turn],
    shared: int,
    ttft: dict[int, float],
) -> None:
    """The session's figures, for the test log and docs/clients.md."""
    prompt = sum(t.prompt for t in turns)
    cached = sum(t.cached for t in turns)
    first, second = pair
    figures = {
        "template": family,
        "model_calls": len(turns),
        "scripted_calls": sum(1 for t in turns if cue_of[t.seq] != OTHER_CUE),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_share": round(cached / prompt, 4),
        "held_tokens": sum(t.held for t in turns),
        "recomputed_held_tokens": sum(t.recomputed for t in turns),
        "sub_agents": {
            "shared_tokens": shared,
            "first": {"cached": first.cached, "ttft_s": ttft[first.seq]},
            "second": {"cached": second.cached, "ttft_s": ttft[second.seq]},
        },
    }
    print("claude code session:", json.dumps(figures))
