"""The container's view of every Ray node: ``probe_nvml`` run in a tiny task pinned to each node.

Needs a connected driver (``ray.init``): a task can only run through one.
Each probe is a ``num_cpus=0`` task with a hard ``NodeAffinitySchedulingStrategy``
(so a full node still answers and no other node answers for it), no retries.
NVML ignores ``CUDA_VISIBLE_DEVICES``: the task sees every GPU the node's
container has, which is the point.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from raygpu.adapters.ray_gcs import gcs_address
from raygpu.model.views import NvmlView


def collect_nvml(node_ids: Iterable[str], timeout_s: float = 30.0, ship_code: bool = True) -> dict[str, NvmlView]:
    """Probe NVML on each Ray node; one ``NvmlView`` per distinct node id.

    Never raises. A node whose task cannot be submitted, fails, or does not
    answer within ``timeout_s`` (all probes share that deadline; late ones are
    cancelled) gets ``NvmlView(available=False, reason="probe failed: ...")``,
    which tells it apart from NVML's own ``"NVML unavailable: ..."``.
    ``ship_code`` sends the ``raygpu`` package with the task (``py_modules``)
    for nodes whose image lacks it; without it raygpu must be importable there.
    """
    ids = list(dict.fromkeys(node_ids))
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError as e:
        return {n: _failed(n, f"ray is not installed ({e})") for n in ids}
    if not ray.is_initialized():
        return {n: _failed(n, "no connected Ray driver (ray.init first)") for n in ids}
    out: dict[str, NvmlView] = {}
    try:
        runtime_env = _shipped_code() if ship_code else None
    except Exception as e:  # noqa: BLE001 - the upload to the GCS failed
        return {n: _failed(n, f"cannot ship raygpu to the cluster: {e}") for n in ids}
    probe = ray.remote(_probe)
    refs: dict[str, Any] = {}
    for n in ids:
        try:
            pin = NodeAffinitySchedulingStrategy(n, soft=False)
            refs[n] = probe.options(num_cpus=0, max_retries=0, runtime_env=runtime_env,
                                    scheduling_strategy=pin).remote(n)
        except Exception as e:  # noqa: BLE001 - a malformed node id, a bad runtime env
            out[n] = _failed(n, f"{type(e).__name__}: {e}")
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s) if refs else ([], [])
    for n, ref in refs.items():
        if ref not in ready:
            with contextlib.suppress(Exception):  # it may have finished meanwhile
                ray.cancel(ref, force=True)
            out[n] = _failed(n, f"no answer within {timeout_s:g}s")
            continue
        try:
            out[n] = NvmlView.model_validate(ray.get(ref))
        except Exception as e:  # noqa: BLE001 - task error, node died, unschedulable
            out[n] = _failed(n, f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    return out


def collect_nvml_at(alive: list[str], ray_address: str | None, timeout_s: float) -> dict[str, NvmlView]:
    """``collect_nvml(alive)`` on the Ray cluster whose GCS is at ``ray_address``; never raises.

    Uses this process's driver when it is connected to that cluster, else
    connects one for the duration of the probe; a driver connected elsewhere,
    or one that cannot connect, gives every node ``available=False`` and why.
    """
    import ray
    target = gcs_address(ray_address)
    if ray.is_initialized():
        mine = ray.get_runtime_context().gcs_address
        if mine != target:
            why = f"probe failed: this driver is connected to {mine}, not {target}"
            return {n: NvmlView(node_id=n, available=False, reason=why) for n in alive}
        return collect_nvml(alive, timeout_s=timeout_s)
    try:
        ray.init(address=target, namespace="raygpu", log_to_driver=False, logging_level="WARNING")
    except Exception as e:  # noqa: BLE001
        why = f"probe failed: cannot connect a driver to {target}: {type(e).__name__}: {e}"
        return {n: NvmlView(node_id=n, available=False, reason=why) for n in alive}
    try:
        return collect_nvml(alive, timeout_s=timeout_s)
    finally:
        ray.shutdown()


def _shipped_code() -> dict[str, Any]:
    """Upload this raygpu package to the GCS (once per content hash) as a task ``py_modules`` URI.

    Tasks may not name local directories (only ``ray.init`` may), so we do
    the upload step ``ray.init`` does for job-level ``py_modules``.
    """
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    package = str(Path(__file__).resolve().parents[1])
    env = {"py_modules": [package], "excludes": ["__pycache__"]}
    uploaded = upload_py_modules_if_needed(env, include_gitignore=True, scratch_dir=tempfile.gettempdir())
    return {"py_modules": uploaded["py_modules"]}


def _probe(node_id: str) -> dict[str, Any]:
    """Runs on the node. Prefers nvidia-ml-py; falls back to the pynvml Ray vendors."""
    from raygpu.adapters.nvml import probe_nvml

    try:
        import pynvml as nvml
    except ImportError:
        from ray._private.thirdparty import pynvml as nvml
    return probe_nvml(node_id, nvml=nvml).model_dump(mode="json")


def _failed(node_id: str, why: str) -> NvmlView:
    return NvmlView(node_id=node_id, available=False, reason=f"probe failed: {why}")
