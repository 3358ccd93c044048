"""``SqlResponseStore``: the ``ResponseStore`` port in the index database (``responses`` table).

SQLAlchemy Core only, no dialect-specific SQL, so the same code serves the PostgreSQL
index. One transaction per call; a write prunes by the retention rule (count, age,
bytes) in the same transaction. A chain is read with one recursive query. Database
trouble (PostgreSQL down, a full or read-only disk, a damaged file) is raised as
``IndexUnavailable`` naming the database, never as a driver traceback.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
from sqlalchemy import Engine, delete, func, insert, literal, select, update
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

from omlx.adapters.sqlindex.availability import Availability
from omlx.adapters.sqlindex.database import writer_engine
from omlx.adapters.sqlindex.models import ResponseRow
from omlx.adapters.sqlindex.urls import display
from omlx.domain.cache.ports import IndexUnavailable
from omlx.domain.responses import BrokenChain, Retention, StoredResponse, TooLargeToStore, folded

_T = ResponseRow.metadata.tables["responses"]
_C = _T.c
_MAX_CHAIN = 100_000  # a bound for the recursive query, far past any conversation


class SqlResponseStore:
    """Implements ``ResponseStore``; safe to call from several threads."""

    def __init__(
        self, engine: Engine, retention: Retention, clock: Callable[[], float] = time.time
    ) -> None:
        self.retention = retention
        self._clock = clock
        self._label = display(engine.url)
        shared = engine.dialect.name == "postgresql"
        self._available = Availability(engine, self._label) if shared else None
        self._reader = sessionmaker(engine)
        self._writer = sessionmaker(writer_engine(engine) if not shared else engine)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """PostgreSQL's availability rule; any database error as ``IndexUnavailable``."""
        with self._available.guard() if self._available else contextlib.nullcontext():
            try:
                yield
            except sa_exc.DBAPIError as exc:
                if self._available is not None and isinstance(
                    exc, sa_exc.OperationalError | sa_exc.InterfaceError
                ):
                    raise  # the availability guard names the outage
                text = str(exc.orig or exc).strip().splitlines()
                raise IndexUnavailable(
                    f"index {self._label}: {text[0] if text else type(exc).__name__}"
                ) from exc

    def put(self, record: StoredResponse) -> None:
        row = _row(record)
        if not self.retention.fits(row["nbytes"]):
            raise TooLargeToStore(
                f"{row['nbytes']} bytes, over responses_max_bytes ({self.retention.max_bytes})"
            )
        with self._guard(), self._writer() as session, session.begin():
            session.execute(delete(_T).where(_C.id == record.id))
            session.execute(insert(_T).values(**row))
            self._prune(session)

    def get(self, response_id: str) -> StoredResponse | None:
        query = select(_T).where(
            _C.id == response_id, _C.created_at >= self.retention.cutoff(self._clock())
        )
        with self._guard(), self._reader() as session:
            row = session.execute(query).first()
        return _record(row) if row is not None else None

    def chain(self, response_id: str) -> list[StoredResponse] | None:
        start = (
            select(_C.id, _C.previous_id, literal(0).label("depth"))
            .where(_C.id == response_id, _C.created_at >= self.retention.cutoff(self._clock()))
            .cte("chain", recursive=True)
        )
        step = (
            select(_C.id, _C.previous_id, (start.c.depth + 1).label("depth"))
            .join(start, _C.id == start.c.previous_id)
            .where(start.c.depth < _MAX_CHAIN)
        )
        walked = start.union_all(step)
        query = select(_T).join(walked, _C.id == walked.c.id).order_by(walked.c.depth.desc())
        with self._guard(), self._reader() as session:
            rows = session.execute(query).all()
        if not rows:
            return None
        chain = [_record(r) for r in rows]
        if chain[0].previous_id is not None:
            raise BrokenChain(f"{chain[0].previous_id} (continued by {chain[0].id}) is missing")
        return chain

    def delete(self, response_id: str) -> bool:
        with self._guard(), self._writer() as session, session.begin():
            return self._remove(session, response_id)

    def count(self) -> int:
        with self._guard(), self._reader() as session:
            return session.scalar(select(func.count()).select_from(_T)) or 0

    def total_bytes(self) -> int:
        with self._guard(), self._reader() as session:
            return session.scalar(select(func.coalesce(func.sum(_C.nbytes), 0))) or 0

    # --- inside a write transaction ---------------------------------------------------

    def _remove(self, session: Session, response_id: str) -> bool:
        """Delete one row; the rows that continued it take its items (stay whole)."""
        row = session.execute(select(_T).where(_C.id == response_id)).first()
        if row is None:
            return False
        removed = _record(row)
        for child_row in session.execute(select(_T).where(_C.previous_id == response_id)).all():
            kept = _row(folded(removed, _record(child_row)))
            session.execute(update(_T).where(_C.id == kept.pop("id")).values(**kept))
        session.execute(delete(_T).where(_C.id == response_id))
        return True

    def _prune(self, session: Session) -> None:
        """Expired rows, then the oldest while over the count or the byte budget."""
        cutoff = self.retention.cutoff(self._clock())
        for rid in list(
            session.scalars(select(_C.id).where(_C.created_at < cutoff).order_by(_C.created_at))
        ):
            self._remove(session, rid)
        while True:
            count, total = session.execute(
                select(func.count(), func.coalesce(func.sum(_C.nbytes), 0)).select_from(_T)
            ).one()
            if not self.retention.excess(count) and not self.retention.over_bytes(total):
                return
            oldest = session.scalar(select(_C.id).order_by(_C.created_at, _C.id).limit(1))
            if oldest is None:
                return
            self._remove(session, oldest)


def _row(record: StoredResponse) -> dict[str, Any]:
    response = msgspec.json.encode(record.response).decode()
    items = msgspec.json.encode(record.input_items).decode()
    return {
        "id": record.id,
        "created_at": record.created_at,
        "response": response,
        "input_items": items,
        "previous_id": record.previous_id,
        "tenant": record.tenant,
        "nbytes": len(response.encode()) + len(items.encode()),
    }


def _record(row: Any) -> StoredResponse:
    return StoredResponse(
        id=row.id,
        created_at=row.created_at,
        response=msgspec.json.decode(row.response),
        input_items=msgspec.json.decode(row.input_items),
        previous_id=row.previous_id,
        tenant=row.tenant,
    )
