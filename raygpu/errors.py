"""The small error vocabulary of raygpu.

Every exception raygpu raises derives from :class:`RayGpuError`:

* :class:`TransientError` - retry after ``delay_s`` (bounded by the caller).
* :class:`PermanentError` - retrying cannot help (bad input, missing object, denied).
* :class:`InfeasibleError` - a request that can never fit the cluster's templates;
  it names the bundle, the resource and the limit.
* :class:`ConflictError` - an optimistic-concurrency test failed; re-read and re-plan.
* :class:`NotFoundError`, :class:`ForbiddenError`, :class:`InvalidError` - the
  API server answered 404, 401/403 or 422; all three are PermanentErrors, so an
  ``except PermanentError`` still catches them.
* :class:`MissingExtraError` - an optional dependency is not installed; it names
  the extra that installs it (``pip install "raygpu[ray]"``). A PermanentError and
  an ImportError both.

The adapters (``raygpu.adapters``) raise these classes; callers catch a class,
never search an error's message.
"""

from __future__ import annotations


class RayGpuError(Exception):
    """Base of every raygpu error."""


class TransientError(RayGpuError):
    """A failure that may pass: retry after ``delay_s`` seconds."""

    def __init__(self, message: str, delay_s: float = 1.0) -> None:
        super().__init__(message)
        self.delay_s = delay_s


class PermanentError(RayGpuError):
    """A failure that retrying cannot fix."""


class ConflictError(TransientError):
    """The object changed between read and write (resourceVersion test failed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, delay_s=0.0)


class NotFoundError(PermanentError):
    """The object does not exist (HTTP 404)."""


class ForbiddenError(PermanentError):
    """The caller may not do this (HTTP 401 or 403); retrying cannot help.

    For a 403 of an adapter request, ``verb`` (get, list, create, patch, delete...), ``resource``
    (``podgroups.scheduling.x-k8s.io``, ``pods``: RBAC's resource names) and ``namespace`` (None:
    cluster-scoped) name the permission that was missing, and so does the message; else they are None.
    """

    def __init__(self, message: str, *, verb: str | None = None, resource: str | None = None,
                 namespace: str | None = None) -> None:
        super().__init__(message)
        self.verb = verb
        self.resource = resource
        self.namespace = namespace


class MissingExtraError(PermanentError, ImportError):
    """An optional dependency is not installed: ``pip install "raygpu[<extra>]"`` installs it.

    ``extra`` names the extra of pyproject.toml, ``name`` (ImportError's) the module that is missing. Also an
    ImportError, so code that guards an optional import with ``except ImportError`` still catches it.
    """

    def __init__(self, message: str, *, extra: str, module: str) -> None:
        super().__init__(message, name=module)
        self.extra = extra


class InvalidError(PermanentError):
    """The API server rejected the request as malformed (HTTP 422, Kubernetes reason ``Invalid``)."""


class InfeasibleError(PermanentError):
    """A request that no template of the cluster can ever satisfy.

    ``bundle_index`` and ``resource`` say which bundle and which resource;
    ``requested`` and ``limit`` the numbers; ``template`` the largest template
    that exists for that resource (or None when there is none).
    """

    def __init__(
        self,
        message: str,
        *,
        bundle_index: int | None = None,
        resource: str | None = None,
        requested: float | None = None,
        limit: float | None = None,
        template: str | None = None,
    ) -> None:
        super().__init__(message)
        self.bundle_index = bundle_index
        self.resource = resource
        self.requested = requested
        self.limit = limit
        self.template = template
