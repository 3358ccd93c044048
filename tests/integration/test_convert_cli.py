"""``omlx convert``: progress lines while it works, and a last line saying it wrote float32."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from omlx.app.cli import main
from tests.tiny_gguf import write_tiny_gguf


def test_convert_says_each_stage_and_that_it_writes_float32(tmp_path: Path) -> None:
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    result = CliRunner().invoke(main, ["convert", str(gguf), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == f"reading {gguf}"
    assert "dequantizing" in result.stderr and "to float32 into" in result.stderr
    last = result.stdout.strip()
    assert last.startswith(f"wrote {tmp_path / 'out'} in ") and "(float32, from a " in last
    assert (tmp_path / "out" / "model.safetensors").exists()


def test_convert_refuses_an_unsupported_gguf_in_one_line(tmp_path: Path) -> None:
    gguf = tmp_path / "qwen.gguf"
    write_tiny_gguf(gguf, arch="qwen2")
    result = CliRunner().invoke(main, ["convert", str(gguf), str(tmp_path / "out")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"reading {gguf}",
        "omlx: GGUF architecture 'qwen2' is not supported (only 'llama')",
    ]
