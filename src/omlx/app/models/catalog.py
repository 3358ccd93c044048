"""The models a server can serve: found in ``--model-dir``, named by ``--model``, or the default.

Each is a *spec*: an id, where its files are, and its task, which its folder says:

- ``chat``: an mlx-lm model folder (``config.json``) or a llama-family ``.gguf`` file;
- ``embedding``: a decoder laid out as a sentence-transformers folder (``modules.json``
  beside ``config.json``; its pooling and normalization modules say how to pool);
- ``rerank``: a causal-LM reranker whose folder has an ``omlx.json`` saying
  ``{"task": "rerank", ...}`` (the prompt and its yes/no tokens; ``docs/models.md``).

Nothing is loaded here: specs are cheap, and the pool loads a model on its first request.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from omlx.domain.model_ids import DEFAULT_MODEL_ID as DEFAULT_ID
from omlx.domain.model_ids import model_id_for

log = logging.getLogger(__name__)

CHAT, EMBEDDING, RERANK = "chat", "embedding", "rerank"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    id: str
    path: Path | None  # None: the bundled default model
    task: str = CHAT

    @property
    def label(self) -> str:
        return str(self.path) if self.path is not None else f"the bundled {DEFAULT_ID}"


def task_of(path: Path) -> str:
    """What a model folder or file is for, from the files it holds."""
    if path.is_file():
        return CHAT
    declared = path / "omlx.json"
    if declared.exists():
        try:
            task = json.loads(declared.read_text()).get("task", CHAT)
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"{declared}: not a JSON object ({exc})") from exc
        if task not in (CHAT, EMBEDDING, RERANK):
            raise ValueError(f"{declared}: task {task!r} is not chat, embedding or rerank")
        return task
    if (path / "modules.json").exists():
        return EMBEDDING
    return CHAT


def spec_for(path: Path) -> ModelSpec:
    path = path.expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"model {str(path)!r} not found: give an mlx-lm model folder or a .gguf file"
        )
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ValueError(f"{path} is a file but not a .gguf file")
    if path.is_dir() and not (path / "config.json").exists():
        raise ValueError(f"{path} has no config.json: not an mlx-lm model folder")
    return ModelSpec(model_id_for(path), path.resolve(), task_of(path))


def discover(model_dir: Path) -> list[ModelSpec]:
    """Every model folder and .gguf file under ``model_dir`` (a folder holding a model is not
    searched further), in path order.

    Symbolic links are followed, but never into a folder already searched (two links to
    ``..`` would loop forever); a model folder that cannot be read or says nonsense
    (an unreadable or invalid ``omlx.json``) is skipped with a warning, and the rest served.
    """
    root = model_dir.expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--model-dir {str(model_dir)!r} is not a folder")
    found: list[ModelSpec] = []
    searched: set[Path] = set()

    def add(entry: Path) -> None:
        try:
            found.append(spec_for(entry))
        except (OSError, ValueError) as exc:
            log.warning("--model-dir: skipped %s: %s", entry, exc)

    def walk(folder: Path) -> None:
        real = folder.resolve()
        if real in searched:
            if folder.is_symlink():
                log.warning(
                    "--model-dir: %s links to %s, already searched; not followed", folder, real
                )
            return
        searched.add(real)
        try:
            entries = sorted(folder.iterdir())
        except OSError as exc:
            log.warning("--model-dir: skipped %s: %s", folder, exc)
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_file, is_dir = entry.is_file(), entry.is_dir()
                holds_model = is_dir and (entry / "config.json").exists()
            except OSError as exc:  # a link loop of its own (ELOOP), a folder we may not read
                log.warning("--model-dir: skipped %s: %s", entry, exc)
                continue
            if (is_file and entry.suffix.lower() == ".gguf") or holds_model:
                add(entry)
            elif is_dir:
                walk(entry)

    walk(root)
    if not found:
        log.warning("--model-dir %s holds no mlx-lm model folder and no .gguf file", root)
    return found


def catalog(models: list[str], model_dir: str = "") -> list[ModelSpec]:
    """The specs ``--model`` (repeatable) and ``--model-dir`` name; the default model if none.

    Two models with one id are refused: a request could not say which it means.
    """
    specs = [spec_for(Path(m)) for m in models if m]
    if model_dir:
        specs += discover(Path(model_dir))
    if not specs:
        specs = [ModelSpec(DEFAULT_ID, None)]
    seen: dict[str, ModelSpec] = {}
    for spec in specs:
        other = seen.get(spec.id)
        if other is not None and other.path != spec.path:
            raise ValueError(
                f"two models are both called {spec.id!r}: {other.label} and {spec.label}"
            )
        seen[spec.id] = spec
    return list(seen.values())
