"""Export and import at their limits, against a real ``omlx serve`` and the real CLI.

An archive over ``max_import_bytes`` (or ``max_import_blocks``) is refused with a 413 that
names the setting, and the CLI prints that answer rather than a broken connection; a
malformed manifest and token ids outside the vocabulary are 400s naming the field; an
import answers only once its blocks are in the index, so its counts match the rows.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_cache_controls import (
    admin,
    ask,
    full_blocks,
    index_rows,
    rows_when,
    settled_rows,
)
from tests.server_process import ServerProcess

CONVERSATION = [
    {
        "role": "system",
        "content": " ".join(f"Fact {i}: primes are odd past two." for i in range(40)),
    },
    {"role": "user", "content": "Name a prime."},
]


@pytest.fixture(scope="module")
def exported(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real archive of the tiny model's conversation (63 blocks of 16 tokens)."""
    folder = tmp_path_factory.mktemp("exported")
    request = folder / "request.json"
    request.write_text(json.dumps({"model": "tiny-llama", "messages": CONVERSATION}))
    archive = folder / "conversation.tar"
    with ServerProcess(
        "--model", str(tiny_model_dir), "--block-size", "16", cache_dir=folder / "cache"
    ) as server:
        stored = full_blocks(ask(server, CONVERSATION))
        rows_when(folder / "cache", lambda rows: len(rows) >= stored)  # the writer's, on disk
        done = admin(
            "export", "--messages", str(request), "--out", str(archive), "--url", server.base_url
        )
        assert done.returncode == 0, done.stderr
    return archive


@pytest.fixture(scope="module")
def refusing_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server for the requests it must refuse: each test checks its index stays empty,
    so no test leaves anything behind for the next."""
    folder = tmp_path_factory.mktemp("refusing")
    with ServerProcess(
        "--model", str(tiny_model_dir), "--block-size", "16", cache_dir=folder / "cache"
    ) as server:
        yield server


def post_archive(server: ServerProcess, data: bytes) -> httpx.Response:
    return httpx.post(
        server.base_url + "/v1/cache/import",
        params={"model": "tiny-llama"},
        content=data,
        headers={"content-type": "application/x-tar"},
        timeout=120,
    )


def with_manifest(archive: bytes, manifest: bytes) -> bytes:
    out = io.BytesIO()
    with (
        tarfile.open(fileobj=io.BytesIO(archive)) as source,
        tarfile.open(fileobj=out, mode="w") as tar,
    ):
        for member in source.getmembers():
            data = manifest if member.name == "manifest.json" else source.extractfile(member).read()
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_an_archive_over_the_limit_is_a_413_naming_the_setting(
    tiny_model_dir: Path, tmp_path: Path, exported: Path
) -> None:
    size = exported.stat().st_size
    with ServerProcess(
        "--model", str(tiny_model_dir), "--block-size", "16",
        "--max-import-bytes", "100000", "--max-import-blocks", "5",
        cache_dir=tmp_path / "cache",
    ) as server:  # fmt: skip
        done = admin("import", str(exported), "--model", "tiny-llama", "--url", server.base_url)
        print(done.stderr.strip())
        assert done.returncode != 0
        assert f"413 the body is {size} bytes" in done.stderr
        assert "max_import_bytes = 100000" in done.stderr and "--max-import-bytes" in done.stderr
        r = post_archive(server, exported.read_bytes())
        assert r.status_code == 413 and r.json()["error"]["param"] == "max_import_bytes"
        # Under the byte limit but over the block limit: 413 naming the other setting.
        with tarfile.open(exported) as tar:
            manifest = json.loads(tar.extractfile("manifest.json").read())
            blocks = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for entry in manifest["blocks"][:6]:
                name = f"blocks/{entry['key']}.safetensors"
                info = tarfile.TarInfo(name)
                info.size = len(blocks[name])
                tar.addfile(info, io.BytesIO(blocks[name]))
            data = json.dumps({**manifest, "blocks": manifest["blocks"][:6]}).encode()
            info = tarfile.TarInfo("manifest.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        r = post_archive(server, out.getvalue())
        assert r.status_code == 413, r.text
        assert "6 blocks" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "max_import_blocks"
        assert index_rows(tmp_path / "cache") == []
        r = httpx.get(server.base_url + "/health", timeout=10)
        assert r.status_code == 200  # the server is fine after the refusals


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "manifest.json"),
        (b'{"format": "omlx-cache-export", "version": 1}', "missing required field"),
        (b'{"format": "omlx-cache-export", "version": 1, "cache_format_version": 1, '
         b'"namespace": "x", "blocks": [{"key": 1}]}', "manifest.blocks[0].key"),
        (b"not json", "not JSON"),
        (b'{"format": "omlx-cache-export", "version": 1, "cache_format_version": 1, '
         b'"namespace": "x", "blocks": ' + b"[" * 5000 + b"]" * 5000 + b"}", "manifest.blocks"),
    ],
)  # fmt: skip
def test_a_malformed_manifest_is_a_400_naming_the_field(
    refusing_server: ServerProcess, exported: Path, manifest: bytes, words: str
) -> None:
    server = refusing_server
    r = post_archive(server, with_manifest(exported.read_bytes(), manifest))
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"] and r.json()["error"]["param"] == "archive"
    assert post_archive(server, b"x" * 100).status_code == 400  # not a tar at all
    assert index_rows(server.cache_dir) == []


def test_token_ids_outside_the_vocabulary_are_400s_on_every_cache_route(
    refusing_server: ServerProcess,
) -> None:
    server = refusing_server
    for route in ("explain", "pins", "export"):
        for prompt in ([-1], [1, 2, 10**9], [2**63], [10**30], [1.5], ["a"]):
            r = httpx.post(
                f"{server.base_url}/v1/cache/{route}",
                json={"model": "tiny-llama", "prompt": prompt},
                timeout=60,
            )
            assert r.status_code == 400, (route, prompt, r.status_code, r.text)
            assert r.json()["error"]["param"].startswith("prompt"), (route, prompt, r.text)
    assert index_rows(server.cache_dir) == []
    pins = httpx.get(server.base_url + "/v1/cache/pins", timeout=10).json()["data"]
    assert pins == []  # a refused pin holds nothing


def test_an_import_answers_once_its_blocks_are_rows(
    tiny_model_dir: Path, tmp_path: Path, exported: Path
) -> None:
    with ServerProcess(
        "--model", str(tiny_model_dir), "--block-size", "16", cache_dir=tmp_path / "cache"
    ) as server:
        r = post_archive(server, exported.read_bytes())
        assert r.status_code == 200, r.text
        done = r.json()
        rows = index_rows(tmp_path / "cache")  # read at once: no waiting for the writer
        assert (done["blocks"], done["written"], done["present"], done["refused"]) == (
            63,
            63,
            0,
            {},
        )
        assert len(rows) == 63
        again = post_archive(server, exported.read_bytes()).json()
        assert (again["written"], again["present"]) == (0, 63)


@pytest.mark.slow
def test_a_2000_token_default_model_conversation_moves_to_a_fresh_server(tmp_path: Path) -> None:
    """SmolLM2-135M: the archive is far over the old 16 MB body limit; the fresh server
    restores the prefix from the imported blocks and answers with the same greedy text."""
    facts = " ".join(
        f"Note {i}: the {i}th prime is a number that only one and itself divide."
        for i in range(100)
    )
    conversation = [
        {"role": "system", "content": facts},
        {"role": "user", "content": "Summarize the notes in one sentence."},
    ]
    model = "smollm2-135m-instruct"
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": model, "messages": conversation}))
    archive = tmp_path / "conversation.tar"

    def answer(server: ServerProcess) -> dict:
        body = {"model": model, "messages": conversation, "max_tokens": 24, "temperature": 0}
        r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    with ServerProcess(cache_dir=tmp_path / "a") as a:
        first = answer(a)
        settled_rows(tmp_path / "a", quiet=2.0)
        done = admin(
            "export", "--messages", str(request), "--out", str(archive), "--url", a.base_url
        )
        assert done.returncode == 0, done.stderr
        print(done.stdout.strip())
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert prompt_tokens >= 2000, prompt_tokens
    assert archive.stat().st_size > 16_000_000  # more than the app-wide body limit
    with ServerProcess(cache_dir=tmp_path / "b") as b:
        done = admin("import", str(archive), "--model", model, "--url", b.base_url)
        assert done.returncode == 0, done.stderr
        print(done.stdout.strip())
        again = answer(b)
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    print(f"fresh server: {cached} of {prompt_tokens} prompt tokens restored")
    assert cached >= prompt_tokens - 64  # all whole blocks of the prompt
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]


def with_nan_in_block(archive: bytes, index: int) -> tuple[bytes, str]:
    """The archive with one NaN written into block ``index``'s last tensor, its checksum
    updated so only the block check can tell; and that block's key."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as source:
        files = {m.name: source.extractfile(m).read() for m in source.getmembers()}
    manifest = json.loads(files["manifest.json"])
    entry = manifest["blocks"][index]
    name = f"blocks/{entry['key']}.safetensors"
    data = bytearray(files[name])
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    tensor = next(v for k, v in header.items() if k.startswith("v."))
    start = 8 + length + tensor["data_offsets"][0]
    nan = {"F32": struct.pack("<f", math.nan), "F16": b"\x00\x7e", "BF16": b"\xc0\x7f"}
    data[start : start + len(nan[tensor["dtype"]])] = nan[tensor["dtype"]]
    files[name] = bytes(data)
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    files["manifest.json"] = json.dumps(manifest).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for member, body in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue(), entry["key"]


def test_a_block_with_a_nan_is_refused_over_http_and_nothing_is_written(
    tiny_model_dir: Path, tmp_path: Path, exported: Path
) -> None:
    crafted, key = with_nan_in_block(exported.read_bytes(), 10)
    cache = tmp_path / "cache"
    with ServerProcess(
        "--model", str(tiny_model_dir), "--block-size", "16", cache_dir=cache
    ) as server:
        refused = post_archive(server, crafted)
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert f"block {key}: " in message and "non-finite" in message
        assert index_rows(cache) == []  # not one block of the archive, before it or after
        answer = ask(server, CONVERSATION).json()
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        done = post_archive(server, exported.read_bytes()).json()  # the sound one goes in
        assert done["blocks"] == 63 and done["refused"] == {}
        # The ask wrote the same blocks too (its writes may still be queued).
        assert len(rows_when(cache, lambda rows: len(rows) >= 63)) >= 63
    checked = admin("verify", "--cache-dir", str(cache))
    assert checked.returncode == 0, checked.stdout + checked.stderr
