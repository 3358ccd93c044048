"""Convert a llama GGUF file into an mlx-lm model folder.

Peers such as `mlx_lm.server --model FOLDER` need config.json, safetensors and
tokenizer files; this writes them from the same reading code the loader uses, so the
folder holds exactly the model omlx serves from the GGUF file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from omlx.adapters.mlx.models.gguf import read_gguf
from omlx.adapters.mlx.models.gguf_tokenizer import write_tokenizer_files

WEIGHTS_FILE = "model.safetensors"


def convert_gguf(
    gguf_path: Path | str, out_dir: Path | str, step: Callable[[str], None] | None = None
) -> Path:
    """Write config.json, model.safetensors (float32) and tokenizer files to `out_dir`.

    Weights are dequantized to float32, the dtype omlx computes in on CPU, so a peer
    loading the folder runs the same numbers (float16 on CPU is far slower there).
    ``step`` hears one line as each stage starts: a conversion takes seconds to minutes.
    """
    say = step or (lambda line: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    say(f"reading {gguf_path}")
    contents = read_gguf(gguf_path, dequantize=True)

    # Tokenizer first: it is the part that can still refuse the model.
    say("writing the tokenizer files")
    write_tokenizer_files(contents.metadata, out)
    count = sum(v.size for v in contents.weights.values())
    say(f"dequantizing {count / 1e6:.0f}M weights to float32 into {out / WEIGHTS_FILE}")
    mx.save_safetensors(str(out / WEIGHTS_FILE), contents.weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(contents.config, indent=2), encoding="utf-8")
    return out
