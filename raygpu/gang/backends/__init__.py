"""Gang backends, one module each, and the registry that picks one by name."""

from __future__ import annotations

from raygpu.gang.backends.base import GangBackend
from raygpu.gang.backends.coscheduling import CoschedulingBackend
from raygpu.gang.backends.kueue import KueueBackend
from raygpu.gang.backends.none import NoneBackend
from raygpu.gang.backends.volcano import VolcanoBackend
from raygpu.model.gang import Backend, parse_enum

_REGISTRY: dict[Backend, type[GangBackend]] = {
    Backend.COSCHEDULING: CoschedulingBackend,
    Backend.KUEUE: KueueBackend,
    Backend.VOLCANO: VolcanoBackend,
    Backend.NONE: NoneBackend,
}


def get_backend(name: str | Backend) -> GangBackend:
    """A backend instance for ``name`` (coscheduling|kueue|volcano|none, case-insensitive).

    Raises PermanentError for any other name.
    """
    return _REGISTRY[parse_enum(Backend, name, "gang backend")]()


__all__ = ["GangBackend", "CoschedulingBackend", "KueueBackend", "NoneBackend", "VolcanoBackend", "get_backend"]
