"""The one base class of raygpu's data, and the one Kubernetes timestamp parser.

Every model in ``raygpu.model`` (and the plans in ``raygpu.plan``) derives from
:class:`Frozen`: immutable once built (``model_copy(update=...)`` makes a
changed copy), fields in snake_case, filled by field name or by their
camelCase alias when they have one.
"""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """An immutable pydantic model; populated by field name or alias."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)


def timestamp_s(raw: str | None) -> float:
    """An RFC 3339 timestamp as Kubernetes writes it (``2024-05-01T12:00:00Z``) -> unix seconds; empty -> 0.0.

    Raises ValueError for a non-empty value that is not a timestamp.
    """
    if not raw:
        return 0.0
    return dt.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
