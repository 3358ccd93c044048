"""The ``omlx`` command line (STYLE §9): imports lazily so admin commands stay light."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import ClassVar, NoReturn

import click

from omlx.domain.sizes import format_bytes

SERVE_HELP = "Serve a model over OpenAI- and Anthropic-compatible HTTP APIs."


class _LazyGroup(click.Group):
    """Subcommand groups imported when named: ``omlx serve`` never pays for the admin
    commands' SQLAlchemy and Alembic imports (about a second here)."""

    lazy: ClassVar[dict[str, tuple[str, str]]] = {
        "admin": ("omlx.app.ops.admin", "admin_group"),
        "db": ("omlx.app.ops.admin", "db_group"),
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            import importlib

            module, attr = self.lazy[name]
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=_LazyGroup)
@click.version_option(package_name="omlx")
def main() -> None:
    """omlx: a local LLM server on MLX whose KV cache outlives requests and restarts."""


def _serve_options(fn):
    options = [
        click.option(
            "--model",
            "model_args",
            multiple=True,
            help="mlx-lm model folder or .gguf file; repeatable (default: the bundled SmolLM2-135M-Instruct).",
        ),
        click.option(
            "--model-dir",
            default=None,
            help="Serve every mlx-lm folder and .gguf file under this folder (loaded on first use).",
        ),
        click.option(
            "--max-model-memory",
            default=None,
            help='Weights + KV of all loaded models: a size, "auto" (RAM less 8 GB) or "off".',
        ),
        click.option(
            "--pin-model",
            "pin_models",
            multiple=True,
            help="A model id never unloaded (loaded at start); repeatable.",
        ),
        click.option(
            "--model-idle-timeout",
            type=float,
            default=None,
            help="Unload a model idle this many seconds (0: never).",
        ),
        click.option("--host", default=None, help="Address to bind (default 127.0.0.1)."),
        click.option("--port", type=int, default=None, help="Port (default 8000)."),
        click.option(
            "--config",
            "config_file",
            type=click.Path(exists=True, dir_okay=False, path_type=Path),
            default=None,
            help="A TOML settings file (see config/omlx.toml).",
        ),
        click.option(
            "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None
        ),
        click.option(
            "--no-cache",
            is_flag=True,
            default=False,
            help="Turn the prefix cache off (both tiers).",
        ),
        click.option(
            "--block-size", type=int, default=None, help="Tokens per cache block (default 64)."
        ),
        click.option(
            "--kv-bits",
            type=click.Choice(["off", "8", "4"]),
            default=None,
            help="Store cache blocks quantized to 8 or 4 bits (default off); RAM and disk per token shrink ~3.8x / ~7x on float32 KV.",
        ),
        click.option(
            "--kv-group-size",
            type=int,
            default=None,
            help="Values per quantization group along head_dim: 32, 64 or 128 (default 64).",
        ),
        click.option(
            "--kv-mode",
            type=click.Choice(["auto", "exact", "store"]),
            default=None,
            help="With --kv-bits: exact (the running cache holds the codes: a hit equals a miss), store (blocks only: RAM stays full precision while decoding, a hit is close), auto (exact on a GPU, store on the CPU; the default).",
        ),
        click.option(
            "--hot-cache-max-size", default=None, help="RAM budget of the hot tier, e.g. 4GB."
        ),
        click.option(
            "--paged-ssd-cache-dir",
            default=None,
            help="Folder of the SSD tier (default ~/.omlx/cache).",
        ),
        click.option(
            "--paged-ssd-cache-max-size",
            default=None,
            help="Disk budget of the SSD tier, e.g. 200GB (default 100GB).",
        ),
        click.option(
            "--no-ssd-cache",
            is_flag=True,
            default=False,
            help="Keep the RAM tier, turn the SSD tier off.",
        ),
        click.option(
            "--no-warm-restart",
            is_flag=True,
            default=False,
            help="Neither record RAM's hot set nor read it back from the SSD tier at start.",
        ),
        click.option(
            "--index-url",
            default=None,
            help="The SSD tier's index: empty for SQLite in the cache folder, or postgresql+psycopg://… shared by several servers.",
        ),
        click.option(
            "--block-store",
            default=None,
            help="Keep the SSD tier's blocks in an S3-compatible object store: s3://bucket/prefix "
            "(endpoint, region and keys from the usual AWS_* variables or ~/.aws files); the "
            "cache folder keeps local copies, the lock, and index.db unless --index-url is given.",
        ),
        click.option(
            "--read-through-max-size",
            default=None,
            help="With --block-store: local copies of its blocks kept in the cache folder, e.g. 50GB (default 20GB).",
        ),
        click.option(
            "--server-id",
            default=None,
            help="This server's name among those sharing an index (default HOSTNAME-PORT).",
        ),
        click.option(
            "--max-concurrent-requests",
            type=int,
            default=None,
            help="Requests decoded together (default 8).",
        ),
        click.option(
            "--max-import-bytes",
            type=int,
            default=None,
            help="Largest cache archive accepted by /v1/cache/import, in bytes (default 8 GiB).",
        ),
        click.option(
            "--max-import-blocks",
            type=int,
            default=None,
            help="Most blocks in one imported cache archive (default 100000).",
        ),
        click.option(
            "--max-image-pixels",
            type=int,
            default=None,
            help="Most pixels (width x height) of one image in a prompt (default 25000000).",
        ),
        click.option(
            "--max-image-bytes",
            type=int,
            default=None,
            help="Largest image in a prompt, encoded, in bytes (default 20 MiB).",
        ),
        click.option(
            "--max-images-per-request",
            type=int,
            default=None,
            help="Most images in one request (default 16).",
        ),
        click.option(
            "--allow-image-urls",
            "allow_image_urls",
            is_flag=True,
            default=None,
            help="Fetch http(s) image URLs clients send (off: data URLs only).",
        ),
        click.option(
            "--image-url-timeout",
            "image_url_timeout_s",
            type=float,
            default=None,
            help="Seconds one image URL's fetch may take, all of it (default 10).",
        ),
        click.option(
            "--max-queued-requests",
            type=int,
            default=None,
            help="Waiting requests before 429 (default 64).",
        ),
        click.option(
            "--no-speculation",
            is_flag=True,
            default=False,
            help="Turn speculative decoding off (on by default: drafts from the prompt, verified in one pass; same tokens).",
        ),
        click.option(
            "--draft-model",
            default=None,
            help="Draft with this small model (mlx-lm folder or .gguf, same tokenizer) instead of prompt lookup.",
        ),
        click.option(
            "--prefill-step-size",
            type=int,
            default=None,
            help="Tokens prefilled per engine step (default 256).",
        ),
        click.option(
            "--kv-memory-limit",
            default=None,
            help='RAM for KV (running requests + hot tier): a size, "auto" (half of RAM) or "off".',
        ),
        click.option(
            "--api-key",
            default=None,
            envvar="OMLX_API_KEY",
            help="Require this key (Bearer or x-api-key).",
        ),
        click.option(
            "--api-keys-file",
            default=None,
            help="Tenants: a file of 'TENANT KEY [tenant|operator]' lines; each tenant its own "
            "cache namespace, requests and reports.",
        ),
        click.option(
            "--no-report-excerpts",
            is_flag=True,
            default=False,
            help="Keep prompt excerpts out of cache reports (for a key shared by several people).",
        ),
        click.option(
            "--allowed-host",
            "allowed_hosts",
            multiple=True,
            help="A Host name this server answers besides localhost, its addresses and the machine's name (DNS rebinding is refused); '*' for any; repeatable.",
        ),
        click.option(
            "--allowed-origin",
            "allowed_origins",
            multiple=True,
            help="A web origin (scheme://host[:port]) whose pages may send requests, besides the server's own; '*' for any; repeatable.",
        ),
        click.option(
            "--model-alias",
            "model_aliases",
            multiple=True,
            help="NAME=ID: answer NAME (a glob like 'claude-*' allowed) with served model ID; repeatable.",
        ),
        click.option(
            "--any-model",
            "answer_any_model",
            is_flag=True,
            default=None,
            help="With one served model, answer every model name with it.",
        ),
        click.option(
            "--no-prompt-normalization",
            is_flag=True,
            default=False,
            help="Keep volatile prompt text (e.g. Claude Code's billing header) as sent.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _serve(**flags) -> None:
    from omlx.app.settings import load_settings

    config_file = flags.pop("config_file")
    if flags.pop("no_cache"):
        flags["cache_enabled"] = False
    if flags.pop("no_ssd_cache"):
        flags["ssd_cache_enabled"] = False
    if flags.pop("no_warm_restart"):
        flags["warm_restart"] = False
    if flags.pop("no_speculation"):
        flags["speculation"] = False
    if flags.pop("no_report_excerpts"):
        flags["report_excerpts"] = False
    if flags.pop("no_prompt_normalization"):
        flags["prompt_normalizations"] = []
    added_aliases = list(flags.pop("model_aliases"))  # added to the settings' own (claude-*)
    flags["pin_models"] = list(flags["pin_models"]) or None
    flags["allowed_hosts"] = list(flags["allowed_hosts"]) or None
    flags["allowed_origins"] = list(flags["allowed_origins"]) or None
    models = list(flags.pop("model_args"))
    if models:
        flags["model"], flags["models"] = models[0], models[1:]
    try:
        settings = load_settings(config_file, flags=flags, added_aliases=added_aliases)
    except ValueError as exc:
        _fail(str(exc))
    from omlx.app.ops.logs import configure_logging

    configure_logging(settings.log_level)
    from omlx.app.errors import AppError
    from omlx.app.server import run_server

    try:
        run_server(settings)
    # AppError: a model named at start that cannot be loaded (too large for max_model_memory)
    except (FileNotFoundError, ValueError, RuntimeError, AppError) as exc:
        _fail(str(exc))


def _fail(message: str) -> NoReturn:
    """A start-up mistake: one line on stderr, exit status 2, no traceback."""
    click.echo(f"omlx: {message}", err=True)
    sys.exit(2)


@main.command(help=SERVE_HELP)
@_serve_options
def serve(**flags) -> None:
    _serve(**flags)


@main.command(help=SERVE_HELP + " Alias of `omlx serve`.")
@_serve_options
def run(**flags) -> None:
    _serve(**flags)


LAUNCH_HELP = """Run an agent CLI (claude, codex or opencode) against omlx, ARGS passed to it.

Uses the omlx already answering on --host/--port, or starts one with the options given here
(its log in ~/.omlx/logs) and stops it when the agent exits. The agent gets the base URL,
key, model and context settings of docs/clients/; Codex and opencode get their config from
~/.omlx/agents/, never from the user's own. Put omlx's options before AGENT: everything
after it is the agent's."""


@main.command(
    help=LAUNCH_HELP,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@_serve_options
@click.argument("agent", type=click.Choice(["claude", "codex", "opencode"]))
@click.argument("agent_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def launch(ctx: click.Context, agent: str, agent_args: tuple[str, ...], **flags) -> None:
    from omlx.app.launch import LaunchPlan
    from omlx.app.launch import launch as launch_agent
    from omlx.app.settings import load_settings

    picked = {k: flags[k] for k in ("host", "port", "api_key")}
    try:
        settings = load_settings(flags["config_file"], flags=picked)
    except ValueError as exc:
        _fail(str(exc))
    plan = LaunchPlan(
        agent=agent,
        agent_args=agent_args,
        host=settings.host,
        port=settings.port,
        api_key=settings.api_key,
        serve_args=tuple(_given_options(ctx, skip={"host", "port"})),
        home=Path("~/.omlx").expanduser(),
    )
    sys.exit(launch_agent(plan, lambda line: click.echo(f"omlx launch: {line}", err=True)))


def _given_options(ctx: click.Context, skip: set[str]) -> list[str]:
    """The options typed on the command line, as typed: what a server started here gets."""
    from click.core import ParameterSource

    argv: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        if not isinstance(param, click.Option) or name in skip:
            continue
        if ctx.get_parameter_source(name) is not ParameterSource.COMMANDLINE:
            continue
        value, flag = ctx.params[name], param.opts[0]
        if param.is_flag:
            argv += [flag] if value else []
        else:
            for one in value if param.multiple else [value]:
                argv += [flag, str(one)]
    return argv


@main.command()
@click.argument("gguf", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
def convert(gguf: Path, out_dir: Path) -> None:
    """Write GGUF as an mlx-lm model folder OUT_DIR (for mlx_lm tools), weights in float32."""
    from omlx.adapters.mlx.models.blas import load_optimized_blas

    load_optimized_blas()
    from omlx.adapters.mlx.models.convert import convert_gguf

    started = time.monotonic()
    try:
        convert_gguf(gguf, out_dir, step=lambda line: click.echo(line, err=True))
    except ValueError as exc:  # UnsupportedModelError: a GGUF omlx cannot read correctly
        _fail(str(exc))
    written = sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file())
    click.echo(
        f"wrote {out_dir} in {time.monotonic() - started:.0f} s: {format_bytes(written)} "
        f"(float32, from a {format_bytes(gguf.stat().st_size)} GGUF: quantized weights are "
        "dequantized, since MLX has no fast quantized kernels on the CPU)"
    )
