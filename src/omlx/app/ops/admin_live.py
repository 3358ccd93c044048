"""``omlx admin cache explain|pin|unpin|pins|export|import``: the cache controls of a running server.

What a prompt would restore and the pins live in the server's memory, so these commands
ask it over HTTP (``/v1/cache/...``) with the standard library only: no Litestar, no MLX.
A request file is any chat request body (OpenAI ``messages``, or Anthropic ``system`` +
``messages``), or ``--prompt TEXT``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import click

from omlx.app.ops.archive_http import export_to_file, import_file
from omlx.domain.json_values import JsonObject

server_option = click.option(
    "--url",
    default="http://127.0.0.1:8000",
    envvar="OMLX_URL",
    show_default=True,
    show_envvar=True,
    help="The running omlx server.",
)
key_option = click.option(
    "--api-key", default=None, envvar="OMLX_API_KEY", help="The server's API key, if it has one."
)
model_option = click.option("--model", default=None, help="The model (else the request file's).")


def call(url: str, method: str, path: str, key: str | None, body: Any = None) -> Any:
    """One JSON request to the server; errors become click errors."""
    data, kind = (None if body is None else json.dumps(body).encode()), "application/json"
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    request.add_header("content-type", kind)
    if key:
        request.add_header("authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise click.ClickException(f"{method} {path}: {exc.code} {message}") from exc
    except urllib.error.URLError as exc:
        raise click.ClickException(f"cannot reach the server at {url}: {exc.reason}") from exc


def request_body(request_file: Path | None, prompt: str | None, model: str | None) -> JsonObject:
    if (request_file is None) == (prompt is None):
        raise click.UsageError("give a request file or --prompt, one of them")
    if request_file is not None:
        try:
            body = json.loads(request_file.read_text())
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"{request_file}: not a JSON request body ({exc})") from exc
        if isinstance(body, list):  # a bare list of messages
            body = {"messages": body}
    else:
        body = {"prompt": prompt}
    if model is not None:
        body["model"] = model
    if "model" not in body:
        raise click.UsageError("name the model: --model, or a model field in the request file")
    return body


def _when(at: float) -> str:
    left = at - time.time()
    return f"in {left / 60:.0f} min" if left < 5400 else f"in {left / 3600:.1f} h"


@click.command("explain")
@click.argument(
    "request_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
@click.option("--prompt", default=None, help="A raw prompt instead of a request file.")
@model_option
@server_option
@key_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def explain_command(
    request_file: Path | None,
    prompt: str | None,
    model: str | None,
    url: str,
    api_key: str | None,
    as_json: bool,
) -> None:
    """What the server's cache holds of a request's prompt, and where the prompt leaves it."""
    found = call(
        url, "POST", "/v1/cache/explain", api_key, request_body(request_file, prompt, model)
    )
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    click.echo(f"x-omlx-cache: {found['header']}")
    click.echo(
        f"{found['cached_tokens']} of {found['prompt_tokens']} prompt tokens cached ({found['tier']})"
    )
    if found["full_hit"]:
        return
    where = (
        f"message {found['message']} ({found['role']}"
        if found["message"] is not None
        else "the prompt ("
    )
    click.echo(
        f"diverges at token {found['diverged_at']} ({found['outcome'].replace('_', ' ')}): "
        f"{where}, part {found['part'] or '-'})"
    )
    excerpt = found["excerpt"]
    click.echo(f"  before: {excerpt['before']!r}")
    click.echo(f"  prompt: {excerpt['prompt']!r}")
    click.echo(
        f"  cached: {excerpt['cached']!r}"
        if excerpt["cached"]
        else "  cached: (the cache ends here)"
    )


@click.command("pin")
@click.argument(
    "request_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=False
)
@click.option("--prompt", default=None, help="A raw prompt instead of a request file.")
@click.option("--ttl", type=float, default=3600.0, show_default=True, help="Seconds to keep it.")
@model_option
@server_option
@key_option
def pin_command(
    request_file: Path | None,
    prompt: str | None,
    ttl: float,
    model: str | None,
    url: str,
    api_key: str | None,
) -> None:
    """Keep a request's prompt prefix from eviction, in RAM and on disk, for --ttl seconds."""
    body = {**request_body(request_file, prompt, model), "ttl_seconds": ttl}
    pin = call(url, "POST", "/v1/cache/pins", api_key, body)
    click.echo(
        f"pinned {pin['id']}: {pin['tokens']} tokens of {pin['model']} "
        f"({pin['held_blocks']}/{pin['blocks']} blocks cached now), until {_when(pin['expires_at'])}"
    )


@click.command("unpin")
@click.argument("pin_id")
@server_option
@key_option
def unpin_command(pin_id: str, url: str, api_key: str | None) -> None:
    """Drop a pin (its blocks become ordinary LRU blocks again)."""
    done = call(url, "DELETE", f"/v1/cache/pins/{pin_id}", api_key)
    click.echo(f"unpinned {done['id']} ({done['model']})")


@click.command("pins")
@server_option
@key_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pins_command(url: str, api_key: str | None, as_json: bool) -> None:
    """The server's live pins."""
    pins = call(url, "GET", "/v1/cache/pins", api_key)["data"]
    if as_json:
        click.echo(json.dumps(pins, indent=2))
        return
    if not pins:
        click.echo("no pins")
    for p in pins:
        group = f" group {p['group']}" if p["group"] else ""
        click.echo(
            f"{p['id']}  {p['model']}  {p['tokens']} tokens  {p['held_blocks']}/{p['blocks']} blocks  "
            f"{p['source']}{group}  expires {_when(p['expires_at'])}"
        )


@click.command("export")
@click.option(
    "--messages",
    "messages_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A request body (or messages list) whose prompt to export.",
)
@click.option(
    "--response-id", default=None, help="A stored response (Responses API): its conversation."
)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The archive to write.",
)
@model_option
@server_option
@key_option
def export_command(
    messages_file: Path | None,
    response_id: str | None,
    out: Path,
    model: str | None,
    url: str,
    api_key: str | None,
) -> None:
    """Write a conversation's cached prefix (block files + manifest) to one archive."""
    if (messages_file is None) == (response_id is None):
        raise click.UsageError("give --messages FILE or --response-id ID, one of them")
    if messages_file is not None:
        body = request_body(messages_file, None, model)
    else:
        if model is None:
            raise click.UsageError("--response-id needs --model")
        body = {"model": model, "response_id": response_id}
    size, headers = export_to_file(url, "/v1/cache/export", api_key, body, out)
    click.echo(
        f"wrote {out}: {headers.get('x-omlx-export-tokens', '?')} of "
        f"{headers.get('x-omlx-prompt-tokens', '?')} prompt tokens, {size} bytes"
    )


@click.command("import")
@click.argument("archive", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--model", required=True, help="The served model to import into (its namespace must match)."
)
@server_option
@key_option
def import_command(archive: Path, model: str, url: str, api_key: str | None) -> None:
    """Verify an archive whole (namespace, versions, checksums, keys), then write its blocks.

    The file is streamed; a server that refuses it (over its max_import_bytes, say) says why.
    """
    path = "/v1/cache/import?" + urllib.parse.urlencode({"model": model})
    done = import_file(url, path, api_key, archive)
    refused = ", ".join(f"{n} {reason}" for reason, n in done["refused"].items())
    click.echo(
        f"imported {done['blocks']} blocks ({done['tokens']} tokens) into {done['model']}: "
        f"{done['written']} written, {done['present']} already there"
        + (f", refused: {refused}" if refused else "")
    )


COMMANDS = (
    explain_command,
    pin_command,
    unpin_command,
    pins_command,
    export_command,
    import_command,
)
