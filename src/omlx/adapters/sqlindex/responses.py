"""``SqlResponseStore``: the ``ResponseStore`` port in the index database (``responses`` table).

SQLAlchemy Core only, no dialect-specific SQL, so the same code serves the PostgreSQL
index. One transaction per call; a write prunes by the retention rule in the same
transaction, so the table never holds more than the rule allows once a write commits.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
from sqlalchemy import Engine, delete, func, insert, select
from sqlalchemy.orm import sessionmaker

from omlx.adapters.sqlindex.database import writer_engine
from omlx.adapters.sqlindex.models import ResponseRow
from omlx.domain.responses import Retention, StoredResponse

_T = ResponseRow.metadata.tables["responses"]
_C = _T.c
_CHUNK = 500  # ids per IN (...) list


class SqlResponseStore:
    """Implements ``ResponseStore``; safe to call from several threads."""

    def __init__(
        self, engine: Engine, retention: Retention, clock: Callable[[], float] = time.time
    ) -> None:
        self.retention = retention
        self._clock = clock
        self._reader = sessionmaker(engine)
        self._writer = sessionmaker(writer_engine(engine))

    def put(self, record: StoredResponse) -> None:
        row = {
            "id": record.id,
            "created_at": record.created_at,
            "response": msgspec.json.encode(record.response).decode(),
            "input_items": msgspec.json.encode(record.input_items).decode(),
        }
        with self._writer() as session, session.begin():
            session.execute(delete(_T).where(_C.id == record.id))
            session.execute(insert(_T).values(**row))
            session.execute(delete(_T).where(_C.created_at < self.retention.cutoff(self._clock())))
            count = session.scalar(select(func.count()).select_from(_T)) or 0
            excess = self.retention.excess(count)
            if excess:
                oldest = select(_C.id).order_by(_C.created_at, _C.id).limit(excess)
                ids = list(session.scalars(oldest))
                for i in range(0, len(ids), _CHUNK):
                    session.execute(delete(_T).where(_C.id.in_(ids[i : i + _CHUNK])))

    def get(self, response_id: str) -> StoredResponse | None:
        query = select(_C.created_at, _C.response, _C.input_items).where(
            _C.id == response_id, _C.created_at >= self.retention.cutoff(self._clock())
        )
        with self._reader() as session:
            row = session.execute(query).first()
        if row is None:
            return None
        return StoredResponse(
            id=response_id,
            created_at=row.created_at,
            response=msgspec.json.decode(row.response),
            input_items=msgspec.json.decode(row.input_items),
        )

    def delete(self, response_id: str) -> bool:
        with self._writer() as session, session.begin():
            result = session.execute(delete(_T).where(_C.id == response_id))
        return bool(result.rowcount)

    def count(self) -> int:
        with self._reader() as session:
            return session.scalar(select(func.count()).select_from(_T)) or 0
