"""The vision bench's model: a bench-sized random-weight gemma3 VLM built with the tests' builder.

    .venv/bin/python bench/vision_model.py [--out /tmp/omlx-bench/vision-gemma3]

``tests/vlm_models.py``'s gemma3 (byte-level BPE tokenizer, chat template, Gemma3Processor
files, seeded N(0, 0.02) weights) at a size whose prefill a 2-core CPU can time: a
gemma3_text of 8 layers x hidden 512 (8 heads x 64, 4 KV heads, MLP 1024), sliding window
512 on three layers of four (layers 3 and 7 global), and a SigLIP tower on 448 px images in 14 px
patches (32 x 32) average-pooled to 256 image tokens per image, as real Gemma 3 does.
Random weights (embeddings at N(0, 0.02) so that greedy text varies with the context):
the numbers are compute and cache numbers, the text is noise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = Path("/tmp/omlx-bench/vision-gemma3")

TEXT = {
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "intermediate_size": 1024,
    "num_attention_heads": 8,
    "head_dim": 64,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 64,
    "sliding_window": 512,
    "sliding_window_pattern": 4,
    "max_position_embeddings": 16384,
}
VISION = {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 1024}
IMAGE = {"image_size": 448, "patch": 14, "mm_tokens": 256}
# The tests' 0.3 makes embeddings dwarf the layers at this width: greedy decoding would just
# repeat the prompt's last token ("\n"). At 0.02 the text depends on the context, so a
# hit == miss check compares real, varied text.
SCALES = {"embed_tokens.weight": 0.02}


def build_bench_vlm(out: Path = FOLDER, seed: int = 0) -> Path:
    """Write the bench model into ``out`` (once: an existing folder of the same sizes is reused)."""
    out = Path(out)
    stamp = out / "bench_sizes.json"
    sizes = {"text": TEXT, "vision": VISION, **IMAGE, "scales": SCALES, "seed": seed}
    if stamp.exists() and json.loads(stamp.read_text()) == sizes:
        return out
    sys.path.insert(0, str(ROOT))
    from tests.vlm_models import build_vlm

    build_vlm("gemma3", out, seed, text=TEXT, vision=VISION, scales=SCALES, **IMAGE)
    tokenizer = json.loads((out / "tokenizer_config.json").read_text())
    tokenizer["model_max_length"] = TEXT["max_position_embeddings"]
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2))
    stamp.write_text(json.dumps(sizes))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FOLDER)
    args = parser.parse_args()
    print(build_bench_vlm(args.out))


if __name__ == "__main__":
    main()
