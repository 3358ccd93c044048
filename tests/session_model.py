"""A tiny model that plays a scripted Claude Code session: real tool calls, on cue.

Built as ``agent_model`` is (a BPE trained on this repository's text, so Claude Code's
long prompts fit; attention and MLP outputs zero, so the next token depends only on the
last one), but the answers are the steps of *plays*. A play is a conversation Claude Code
has with the model: the user prompt (or a sub-agent's brief) that names it, ``(play:
alpha)``, then one step per model call: tool calls with real arguments (Bash, Read, Write,
Edit, Glob, Grep, two Agents at once) or a closing text.

The chat template picks the step: it follows the conversation, notes the latest user
message that names a play and counts the assistant turns since, and ends the generation
prompt with that step's cue token (``<|cue:alpha:3|>``; ``<|cue:other|>`` past a play's
end or in a conversation no play names). Each cue's next token is the step's whole answer,
one added token; after it, the end of the turn. An earlier answer is rendered behind the
same cue, exactly as the model wrote it, so a turn's prompt starts with the previous prompt
and its answer (where the template writes calls back as they came).

Two templates: ``chatml`` renders system messages wherever they come and calls as
``<tool_call>`` JSON; ``mistral`` is ``strict_templates.MISTRAL`` (system prompt first
only, strict alternation, ``[TOOL_CALLS]`` with ids) with the cues added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.agent_model import CONTEXT, train_agent_bpe
from tests.strict_templates import FAMILIES, MISTRAL

MODEL_ID = "session"
OTHER_ANSWER = "Nothing in the script for this."
CHATML_EOS = "<|im_end|>"
TOOL_MARKERS = ["<tool_call>", "</tool_call>"]


@dataclass(frozen=True, slots=True)
class Step:
    """One model call's answer: tool calls (name, arguments) made together, or a text."""

    calls: tuple[tuple[str, dict], ...] = ()
    text: str = ""


def bash(command: str, description: str) -> tuple[str, dict]:
    return ("Bash", {"command": command, "description": description})


def plays(project: Path) -> dict[str, list[Step]]:
    """The session's conversations; Read, Write and Edit need absolute paths in ``project``."""
    notes = project / "notes"
    todo, plan = str(notes / "todo.txt"), str(notes / "plan.md")

    def agent(play: str, task: str) -> tuple[str, dict]:
        return (
            "Agent",
            {
                "description": f"Sub-agent {play}",
                "prompt": f"(play: {play}) {task}",
                "subagent_type": "general-purpose",
                "run_in_background": False,
            },
        )

    return {
        "alpha": [
            Step((("Write", {"file_path": todo, "content": "1. write notes\n2. read them\n"}),)),
            Step((("Read", {"file_path": todo}),)),
            Step(
                (
                    (
                        "Edit",
                        {
                            "file_path": todo,
                            "old_string": "2. read them",
                            "new_string": "2. read them, then count them",
                        },
                    ),
                )
            ),
            Step((bash("ls notes && wc -l notes/todo.txt", "List the notes"),)),
            Step((("Glob", {"pattern": "**/*.txt"}),)),
            Step((("Grep", {"pattern": "count", "output_mode": "content"}),)),
            Step((("Write", {"file_path": plan, "content": "# Plan\n\nCount the notes.\n"}),)),
            Step((bash("python3 -c 'print(sum(range(10)))'", "Add up to nine"),)),
            Step(
                (
                    agent("beta", "Read the notes and leave a beta note."),
                    agent("gamma", "Look for the plan and leave a gamma note."),
                )
            ),
            Step((bash("cat notes/beta.txt notes/gamma.txt", "Show the sub-agents' notes"),)),
            Step((("Read", {"file_path": plan}),)),
            Step((bash("mkdir -p build && cp notes/*.txt build/ && ls build", "Copy the notes"),)),
            Step(text="Alpha: the notes are written, checked and copied."),
        ],
        "beta": [
            Step((bash("ls notes", "List the notes"),)),
            Step((("Read", {"file_path": todo}),)),
            Step((("Write", {"file_path": str(notes / "beta.txt"), "content": "beta read it\n"}),)),
            Step(text="Beta: the todo list has two items."),
        ],
        "gamma": [
            Step((("Glob", {"pattern": "notes/*"}),)),
            Step((("Grep", {"pattern": "Plan", "output_mode": "files_with_matches"}),)),
            Step((bash("echo 'gamma found the plan' > notes/gamma.txt", "Leave a note"),)),
            Step(text="Gamma: the plan is in notes/plan.md."),
        ],
        "delta": [
            Step((bash("ls -R", "List everything"),)),
            Step((("Write", {"file_path": str(notes / "delta.txt"), "content": "delta\n"}),)),
            Step((("Read", {"file_path": str(notes / "delta.txt")}),)),
            Step((("Glob", {"pattern": "build/*"}),)),
            Step((("Grep", {"pattern": "beta", "output_mode": "count"}),)),
            Step(text="Delta: the build folder holds the notes."),
        ],
        "epsilon": [
            Step((("Read", {"file_path": todo}),)),
            Step((bash("wc -c notes/*", "Count the bytes"),)),
            Step((("Write", {"file_path": str(notes / "epsilon.txt"), "content": "epsilon\n"}),)),
            Step((("Glob", {"pattern": "**/*.md"}),)),
            Step(text="Epsilon: the session went on where it stopped."),
        ],
    }


def prompt_for(play: str, task: str) -> str:
    """The user prompt that starts (or continues a session with) ``play``."""
    return f"(play: {play}) {task}"


def cue(play: str, step: int) -> str:
    return f"<|cue:{play}:{step}|>"


OTHER_CUE = "<|cue:other|>"


# The template's state: the play named by the latest user message, the assistant turns since.
_STATE = "{%- set ns = namespace(play='', step=0) -%}"
_NOTE_PLAY = (
    "{%- if m.role == 'user' and m.content is string -%}"
    "{%- for name in steps -%}"
    "{%- if ('(play: ' ~ name ~ ')') in m.content -%}"
    "{%- set ns.play = name -%}{%- set ns.step = 0 -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
)
_CUE = (
    "{{ ('<|cue:' ~ ns.play ~ ':' ~ ns.step ~ '|>') "
    "if ns.play in steps and ns.step < steps[ns.play] else '" + OTHER_CUE + "' }}"
)
_NEXT_STEP = "{%- set ns.step = ns.step + 1 -%}"

_CHATML = (
    "{%- if tools %}<|im_start|>system\nTools you can call:\n"
    "{% for tool in tools %}{{ tool.function | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}" + _NOTE_PLAY + "{%- if m.role == 'assistant' %}"
    "<|im_start|>assistant\n" + _CUE + "{{ m.content or '' }}"
    "{%- for call in m.tool_calls or [] %}"
    '<tool_call>{"name": {{ call.function.name | tojson }}, '
    '"arguments": {{ call.function.arguments | tojson }}}</tool_call>'
    "{%- endfor %}<|im_end|>\n" + _NEXT_STEP + "{%- else %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n" + _CUE + "{% endif %}"
)


def _mistral() -> str:
    """``strict_templates.MISTRAL`` with the play's state and cues put in."""
    anchors = {
        "{%- if m.role == 'user' -%}[INST]": _NOTE_PLAY + "{%- if m.role == 'user' -%}[INST]",
        "{%- elif m.role == 'assistant' and m.tool_calls -%}[TOOL_CALLS][": (
            "{%- elif m.role == 'assistant' and m.tool_calls -%}"
            + _CUE
            + _NEXT_STEP
            + "[TOOL_CALLS]["
        ),
        "{%- elif m.role == 'assistant' -%}{{ m.content }}": (
            "{%- elif m.role == 'assistant' -%}" + _CUE + _NEXT_STEP + "{{ m.content }}"
        ),
    }
    template = MISTRAL
    for anchor, replacement in anchors.items():
        assert template.count(anchor) == 1, anchor  # strict_templates.MISTRAL changed
        template = template.replace(anchor, replacement)
    return template + "{%- if add_generation_prompt -%}" + _CUE + "{%- endif -%}"


def _answer_text(step: Step, family: str) -> str:
    """The step's answer as the model writes it, and as the template writes it back."""
    if not step.calls:
        return step.text
    if family == "mistral":
        calls = ", ".join(
            f'{{"name": {json.dumps(n)}, "arguments": {json.dumps(a, ensure_ascii=False)}}}'
            for n, a in step.calls
        )
        return f"[TOOL_CALLS][{calls}]"
    return "".join(
        f'<tool_call>{{"name": {json.dumps(n)}, "arguments": {json.dumps(a, ensure_ascii=False)}}}'
        "</tool_call>"
        for n, a in step.calls
    )


def template_for(family: str, scripted: dict[str, list[Step]]) -> str:
    lengths = json.dumps({name: len(steps) for name, steps in scripted.items()})
    body = _CHATML if family == "chatml" else _mistral()
    return "{%- set steps = " + lengths + " -%}" + _STATE + body


def answers(family: str, scripted: dict[str, list[Step]]) -> dict[str, str]:
    """Each cue token's answer."""
    out = {
        cue(p, i): _answer_text(s, family)
        for p, steps in scripted.items()
        for i, s in enumerate(steps)
    }
    out[OTHER_CUE] = OTHER_ANSWER
    return out


def build_session_model(out: Path, project: Path, family: str = "chatml") -> Path:
    """Write the session model (an mlx-lm llama folder) for a session run in ``project``,
    with the ``chatml`` or the ``mistral`` template."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    scripted = plays(project)
    cued = answers(family, scripted)
    markers = FAMILIES["mistral"][1]
    eos = CHATML_EOS if family == "chatml" else FAMILIES["mistral"][3]
    special = ["<|endoftext|>", "<|im_start|>", CHATML_EOS, *markers, *cued]
    tok = train_agent_bpe(4096, special, TOOL_MARKERS + sorted(set(cued.values())))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config_tok = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None if family == "chatml" else "<s>",
        "eos_token": eos,
        "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "chat_template": template_for(family, scripted),
        "add_bos_token": False,
        "model_max_length": CONTEXT,
    }
    if family == "chatml":
        config_tok["tool_parser_type"] = "json_tools"
    (out / "tokenizer_config.json").write_text(json.dumps(config_tok))
    vocab = tok.get_vocab(with_added_tokens=True)
    size = max(vocab.values()) + 1
    hidden = 64 * (len(cued) // 64 + 1)  # a direction for each cue, one shared by all tokens
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
        "num_attention_heads": hidden // 16,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "vocab_size": size,
        "rope_theta": 10000.0,
        "max_position_embeddings": CONTEXT,
        "tie_word_embeddings": False,
    }
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    params = dict(tree_flatten(model.parameters()))
    for name in params:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            params[name] = mx.zeros_like(params[name])
    # Dimension 0: shared by every token (its next token: the end of the turn);
    # dimension 1 + j: cue j alone (its next token: its answer).
    embed = [[0.0] * hidden for _ in range(size)]
    for row in embed:
        row[0] = 1.0
    head = [[0.0] * hidden for _ in range(size)]
    head[vocab[eos]][0] = 3.0
    for j, (token, answer) in enumerate(cued.items()):
        embed[vocab[token]][1 + j] = 1.0
        head[vocab[answer]][1 + j] = 6.0
    params["model.embed_tokens.weight"] = mx.array(embed)
    params["lm_head.weight"] = mx.array(head)
    mx.save_safetensors(str(out / "model.safetensors"), params, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
