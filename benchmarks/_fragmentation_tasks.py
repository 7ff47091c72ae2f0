"""The fragmentation benchmark's tasks: the openb trace's GPU tasks (real shapes), their fill order and arrival draw.

See ``bench_fragmentation.py`` for what is real and what is synthesized.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from benchmarks._common import OPENB, read_csv

NODES_CSV = OPENB / "openb_node_list_gpu_node.csv"
TASKS_CSV = OPENB / "openb_pod_list_default.csv"
ARRIVALS_CSV = OPENB / "openb_pod_list_multigpu50.csv"
SHARE_CPU_M, SHARE_MEM_MIB = 12_000, 48 * 1024  # one share worker: 1 GPU, 12 CPUs, 48 GiB


@dataclass(frozen=True)
class Task:
    name: str
    gpus: int
    milli: int  # gpu_milli per GPU
    cpu: int  # milli-CPU
    mem: int  # MiB

    @property
    def frac(self) -> bool:
        return self.gpus == 1 and self.milli < 1000

    @property
    def offered(self) -> float:
        return self.milli / 1000 if self.frac else float(self.gpus)

    @property
    def group(self) -> str:
        return "share" if self.frac else f"gpu{self.gpus}"

    def pod_shape(self) -> tuple[int, int, int]:
        """(GPUs, milli-CPU, MiB) of the pod this task needs when no existing worker takes it."""
        return (1, SHARE_CPU_M, SHARE_MEM_MIB) if self.frac else (self.gpus, self.cpu, self.mem)


def read_tasks(path, prefix: str) -> list[Task]:
    out = []
    for r in read_csv(path):
        if int(r["num_gpu"]) >= 1:
            out.append(Task(f"{prefix}{r['name']}", int(r["num_gpu"]), int(r["gpu_milli"]), int(r["cpu_milli"]),
                            int(r["memory_mib"])))
    return out


def fill_stream() -> list[Task]:
    """The default list's GPU tasks in creation order (the file's order: creation_time is sorted)."""
    rows = read_csv(TASKS_CSV)
    rows.sort(key=lambda r: (float(r["creation_time"]), r["name"]))
    return [Task(r["name"], int(r["num_gpu"]), int(r["gpu_milli"]), int(r["cpu_milli"]), int(r["memory_mib"]))
            for r in rows if int(r["num_gpu"]) >= 1]


def unit(*parts: object) -> float:
    """A deterministic uniform draw in [0, 1) from a hash of ``parts`` (same in every policy)."""
    return zlib.crc32("/".join(map(str, parts)).encode()) / 2**32


def draw_arrivals(pool: list[Task], n: int, seed: int) -> list[Task]:
    """One seeded sequence of ``n`` arrivals drawn from ``pool``, consumed in order by every policy."""
    rnd = random.Random(seed)
    return [Task(f"new-{i:05d}-{t.name}", t.gpus, t.milli, t.cpu, t.mem)
            for i, t in enumerate(rnd.choice(pool) for _ in range(n))]
