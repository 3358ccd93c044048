"""Every sqlite3 query in docs/guide.md and the README runs against a real, migrated index."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from omlx.adapters.blockfiles.store import FileBlockStore
from omlx.adapters.sqlindex import index_path, open_index
from tests.storage_checks import make_chain, make_namespace, record_block

ROOT = Path(__file__).resolve().parents[2]


def _queries(text: str) -> list[str]:
    """The SQL of each ``sqlite3 ... DB 'SQL'`` command (continued on indented lines)."""
    commands, current = [], None
    for line in text.splitlines():
        if re.match(r"^(\$ )?sqlite3 ", line):
            current = [line]
            commands.append(current)
        elif current is not None and line.startswith(" "):
            current.append(line)
        else:
            current = None
    queries = []
    for command in commands:
        joined = " ".join(part.strip().rstrip("\\") for part in command)
        match = re.search(r"""(?:\$DB|index\.db) +(['"])(.*)\1\s*$""", joined)
        assert match, f"no query in {joined!r}"
        queries.append(match.group(2))
    return queries


GUIDE = _queries((ROOT / "docs" / "guide.md").read_text(encoding="utf-8"))
README = _queries((ROOT / "README.md").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def index_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cache")
    ns = make_namespace("tiny")
    index, store = open_index(folder), FileBlockStore(folder)
    index.upsert_namespace(ns)
    for i, (meta, _, data) in enumerate(make_chain(ns, 5)):
        record_block(store, index, ns, meta, data, 1.0 + i, hit_count=i % 2)
    index.close()
    return index_path(folder)


def test_the_guide_has_its_queries() -> None:
    assert len(GUIDE) >= 9 and len(README) >= 4


@pytest.mark.parametrize("sql", GUIDE + README)
def test_query_runs(index_db: Path, sql: str) -> None:
    with sqlite3.connect(f"file:{index_db}?mode=ro", uri=True) as db:
        db.execute(sql).fetchall()


def test_the_longest_prefix_query_walks_the_chain(index_db: Path) -> None:
    (sql,) = [q for q in GUIDE if "longest_prefix_tokens" in q]
    with sqlite3.connect(f"file:{index_db}?mode=ro", uri=True) as db:
        assert db.execute(sql).fetchall() == [("tiny", 5 * 4)]  # 5 blocks of 4 tokens
