"""Gang backends, one module each, and the registry that picks one by name."""

from __future__ import annotations

from typing import Iterable, Mapping

from raygpu.gang.backends.base import GangBackend
from raygpu.gang.backends.coscheduling import CoschedulingBackend
from raygpu.gang.backends.kueue import KueueBackend
from raygpu.gang.backends.none import NoneBackend
from raygpu.gang.backends.volcano import VolcanoBackend
from raygpu.gang.backends.workload import WorkloadBackend, choose_api_version
from raygpu.model.gang import Backend, parse_enum

_REGISTRY: dict[Backend, type[GangBackend]] = {
    Backend.COSCHEDULING: CoschedulingBackend,
    Backend.KUEUE: KueueBackend,
    Backend.VOLCANO: VolcanoBackend,
    Backend.NONE: NoneBackend,
    Backend.WORKLOAD: WorkloadBackend,
}


def get_backend(name: str | Backend, *, served: Mapping[str, Iterable[str]] | None = None) -> GangBackend:
    """A backend instance for ``name`` (coscheduling|kueue|volcano|workload|none, case-insensitive).

    ``served`` (``scheduling.k8s.io`` version -> kinds, from API discovery) picks the API version of
    backend ``workload`` (default: v1beta1); other backends ignore it. Raises PermanentError for any
    other name, and for ``workload`` when ``served`` holds no version it can use (the message names the API).
    """
    backend = parse_enum(Backend, name, "gang backend")
    if backend is Backend.WORKLOAD and served is not None:
        return WorkloadBackend(choose_api_version(served))
    return _REGISTRY[backend]()


__all__ = ["GangBackend", "CoschedulingBackend", "KueueBackend", "NoneBackend", "VolcanoBackend", "WorkloadBackend",
           "get_backend"]
