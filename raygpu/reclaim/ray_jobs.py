"""Ray's job table, read straight from the GCS: which driver jobs are alive.

This is adapter code (it talks to the GCS) kept next to its only user until
``raygpu.adapters.ray_gcs`` grows a job reader; it follows that module's
promises: no ``ray.init``, bounded time, never raises.
"""

from __future__ import annotations

import threading
from typing import Any


def read_job_liveness(gcs_address: str, timeout_s: float = 5.0) -> dict[str, bool] | None:
    """Ray job id (hex) -> alive, for every job the GCS knows; None when it cannot be read in ``timeout_s``."""
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            from ray._raylet import GcsClientOptions, GlobalStateAccessor
            from ray.core.generated.gcs_pb2 import JobTableData
            accessor = GlobalStateAccessor(GcsClientOptions.create(gcs_address, None, allow_cluster_id_nil=True,
                                                                   fetch_cluster_id_if_nil=False))
            if not accessor.connect():
                raise ConnectionError("GlobalStateAccessor could not connect")
            try:
                rows = accessor.get_job_table(skip_submission_job_info_field=True, skip_is_running_tasks_field=True)
            finally:
                accessor.disconnect()
            jobs = {}
            for raw in rows:
                entry = JobTableData.FromString(raw)
                jobs[entry.job_id.hex()] = not entry.is_dead
            result["jobs"] = jobs
        except BaseException as e:  # noqa: BLE001 - reported as None
            result["error"] = e

    t = threading.Thread(target=read, name="raygpu-gcs-jobs", daemon=True)
    t.start()
    t.join(timeout_s)
    return result.get("jobs") if not t.is_alive() else None
