"""A server of two models with room for one: TTFT of a request that loads its model, and RSS.

    .venv/bin/python bench/model_pool.py [--rounds 3] [--json bench/out/model_pool.json]

The model dir holds the default SmolLM2 GGUF and the same weights as an mlx-lm folder
(``omlx convert``), two ids; ``--max-model-memory`` fits one of them, so each request for
the other unloads the first. Per round: a request for ``gguf`` (loads it), the same
request again (loaded), a request for ``folder`` (unloads ``gguf``, loads ``folder``), then
``gguf`` again (reloaded: its prompt comes back from the SSD tier). TTFT is the client's;
the load time is the server's own (``/health`` ``models.<id>.load_seconds``), so the rest
of a loading request's TTFT is its prompt's prefill. RSS (``/proc/<pid>/status`` VmRSS) is
read at start (nothing loaded), after each step, and after ``--model-idle-timeout``
unloads everything: the weights of an unloaded model must really leave the process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    ensure_mlx_lm_folder,
    fmt_s,
    free_port,
    load_average,
    machine_note,
    omlx_server,
    stream_chat,
    table,
)

IDLE_TIMEOUT_S = 5  # the reaper looks every 10 s, so everything is gone within ~15 s
SYSTEM = (
    "You are a coding assistant working in a Python repository. Answer briefly and cite the "
    "files you read. " * 12
)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def health(base_url: str) -> dict:
    return httpx.get(base_url + "/health", timeout=10).json()


def ask(base_url: str, model: str, question: str):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return stream_chat(base_url, model, messages, max_tokens=8)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("bench/out/model_pool.json"))
    args = parser.parse_args()

    folder = ensure_mlx_lm_folder()
    from omlx.adapters.mlx.models.gguf import default_model_path

    gguf = Path(default_model_path())
    work = Path(tempfile.mkdtemp(prefix="omlx-pool-bench-"))
    models = work / "models"
    models.mkdir()
    (models / "gguf.gguf").symlink_to(gguf)
    (models / "folder").symlink_to(folder)
    sizes = {"gguf": gguf.stat().st_size, "folder": (folder / "model.safetensors").stat().st_size}
    # Room for the larger one and its KV reserve, never for both.
    limit = int(max(sizes.values()) * 1.6)
    print(machine_note(), "|", load_average(), flush=True)
    print(
        f"weights on disk: gguf {sizes['gguf'] / 1e6:.0f} MB, folder {sizes['folder'] / 1e6:.0f} MB; "
        f"--max-model-memory {limit / 1e6:.0f} MB",
        flush=True,
    )

    server = omlx_server(
        free_port(),
        work / "cache",
        work / "server.log",
        [
            "--model-dir",
            str(models),
            "--max-model-memory",
            str(limit),
            "--model-idle-timeout",
            str(IDLE_TIMEOUT_S),
        ],
    )
    rows: list[dict] = []
    rss: list[tuple[str, float]] = []
    with server:
        pid = server.proc.pid
        rss.append(("start (nothing loaded)", rss_mb(pid)))
        for r in range(args.rounds):
            question = f"Round {r}: which file holds the scheduler?"
            for step, model in (
                ("load", "gguf"),
                ("loaded", "gguf"),
                ("swap", "folder"),
                ("reload", "gguf"),
            ):
                result = ask(server.base_url, model, question)
                h = health(server.base_url)["models"][model]
                load_s = h.get("load_seconds") if step in ("load", "swap", "reload") else 0.0
                rows.append(
                    {
                        "round": r,
                        "step": step,
                        "model": model,
                        "ttft_s": result.ttft,
                        "load_s": load_s,
                        "rest_s": result.ttft - (load_s or 0.0),
                        "prompt_tokens": result.prompt_tokens,
                        "cached_tokens": result.cached_tokens,
                        "rss_mb": rss_mb(pid),
                    }
                )
                print(
                    f"round {r} {step:6s} {model:6s} ttft {result.ttft:.3f} s load {load_s or 0:.3f} s "
                    f"cached {result.cached_tokens}/{result.prompt_tokens} rss {rows[-1]['rss_mb']:.0f} MB",
                    flush=True,
                )
            rss.append((f"after round {r} (gguf loaded)", rss_mb(pid)))
            # Back to the round's starting state: folder loaded would make the next "load"
            # a swap; unload gguf by asking for folder, then let both go idle is too slow
            # per round, so the next round's "load" is itself a swap from folder.
            ask(server.base_url, "folder", question)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
            m.get("state") == "loaded" for m in health(server.base_url)["models"].values()
        ):
            time.sleep(1)
        time.sleep(1)
        rss.append(("after the idle timeout unloaded both", rss_mb(pid)))

    def median(step: str, key: str) -> float:
        return statistics.median(row[key] for row in rows if row["step"] == step)

    def spread(step: str, key: str) -> str:
        values = [row[key] for row in rows if row["step"] == step]
        return f"{min(values):.3f}-{max(values):.3f}"

    summary = [
        [
            step,
            model,
            fmt_s(median(step, "ttft_s")),
            spread(step, "ttft_s"),
            fmt_s(median(step, "load_s")),
            fmt_s(median(step, "rest_s")),
            f"{statistics.median(row['cached_tokens'] or 0 for row in rows if row['step'] == step):.0f}"
            f"/{rows[0]['prompt_tokens']}",
        ]
        for step, model in (
            ("load", "gguf"),
            ("loaded", "gguf"),
            ("swap", "folder"),
            ("reload", "gguf"),
        )
    ]
    print()
    print(
        table(
            ["request", "model", "TTFT (median)", "spread", "load", "TTFT - load", "cached"],
            summary,
        )
    )
    print()
    print(table(["when", "RSS"], [[when, f"{mb:.0f} MB"] for when, mb in rss]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "machine": machine_note(),
                "limit_bytes": limit,
                "weights_bytes": sizes,
                "rows": rows,
                "rss_mb": rss,
            },
            indent=2,
        )
    )
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
