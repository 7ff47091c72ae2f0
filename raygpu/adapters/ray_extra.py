"""Ray, an optional dependency: the ``ray`` extra of pyproject.toml (``pip install "raygpu[ray]"``).

What needs Ray: the driver library (``raygpu.placement_group`` and the calls built on it, which create the
Ray placement group on the driver's own connection) and the sidecar (which reads Ray's GCS every cycle).
What does not: the dry run (``raygpu.plan_placement_group``, ``raygpu plan``), the doctor's Kubernetes side,
the plans and the models. Code that needs Ray imports it through here, so that a missing Ray names the
extra to install (``MissingExtraError``) instead of a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

from raygpu.errors import MissingExtraError

RAY_EXTRA = "ray"  # the key of [project.optional-dependencies] in pyproject.toml
RAY_INSTALL = f'pip install "raygpu[{RAY_EXTRA}]"'


def import_ray(needed_by: str) -> ModuleType:
    """Import and return ``ray``.

    Raises MissingExtraError (``extra == "ray"``; a PermanentError and an ImportError) when Ray is not
    installed, with a message that names ``needed_by`` and the install command. A Ray that is installed but
    fails to import (a broken installation) raises what Ray's import raised.
    """
    try:
        import ray
    except ModuleNotFoundError as e:
        if e.name != "ray":
            raise
        raise MissingExtraError(f"{needed_by} needs Ray, which is not installed: {RAY_INSTALL}",
                                extra=RAY_EXTRA, module="ray") from e
    return ray


def ray_installed() -> bool:
    """Whether ``ray`` is installed, found without importing it (Ray's import takes seconds)."""
    return importlib.util.find_spec("ray") is not None
