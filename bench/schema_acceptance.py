"""How many JSONSchemaBench schemas omlx accepts for structured output, per subset.

    .venv/bin/python bench/schema_acceptance.py DATA_DIR [--strict]

DATA_DIR holds the benchmark's ``data/<subset>/*.json`` files (github.com/guidance-ai/
jsonschemabench). Each schema is compiled as a ``response_format`` is, for the default
model's tokenizer: by llguidance alone, then as omlx does (exclusive ``oneOf`` as
``anyOf``). Counts only whether the schema is taken; what a taken schema lets through is
llguidance's (JSONSchemaBench measures that compliance).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from llguidance import LLMatcher

from omlx.adapters.grammar import LLGuidanceCompiler
from omlx.adapters.grammar.lark import json_options
from omlx.adapters.mlx.models.default_model import default_model_path
from omlx.adapters.mlx.models.gguf import load_gguf_tokenizer
from omlx.domain.grammar import GrammarError, OutputGrammar


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", type=Path)
    parser.add_argument("--strict", action="store_true", help="refuse unenforceable keywords")
    args = parser.parse_args()
    import mlx.core as mx

    _, metadata = mx.load(str(default_model_path()), return_metadata=True)
    tokenizer = load_gguf_tokenizer(metadata)
    compiler = LLGuidanceCompiler(tokenizer, sorted(tokenizer.eos_token_ids), cache_size=1)
    llg = compiler.tokenizer
    totals: dict[str, Counter] = {}
    reasons: Counter = Counter()
    started = time.monotonic()
    for path in sorted(args.data.glob("*/*.json")):
        subset = path.parent.name
        count = totals.setdefault(subset, Counter())
        try:
            schema = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(schema, dict):
            continue
        count["schemas"] += 1
        alone = {**schema, "x-guidance": json_options(args.strict)}
        grammar = "%llguidance {}\nstart: answer\nanswer: %json " + json.dumps(alone) + "\n"
        if not LLMatcher(llg, grammar, log_level=0).is_error():
            count["llguidance"] += 1
        try:
            compiler.constraint(OutputGrammar(json_schema=json.dumps(schema), strict=args.strict))
            count["omlx"] += 1
        except GrammarError as exc:
            reasons[str(exc)[:70]] += 1
    print(f"{'subset':<16} {'schemas':>7} {'llguidance':>10} {'omlx':>6}")
    for subset, c in totals.items():
        print(f"{subset:<16} {c['schemas']:>7} {c['llguidance']:>10} {c['omlx']:>6}")
    all_ = sum(totals.values(), Counter())
    print(f"{'all':<16} {all_['schemas']:>7} {all_['llguidance']:>10} {all_['omlx']:>6}")
    print(f"({time.monotonic() - started:.0f} s) refused by omlx, most common reasons:")
    for reason, n in reasons.most_common(8):
        print(f"  {n:5d}  {reason}")


if __name__ == "__main__":
    sys.exit(main())
