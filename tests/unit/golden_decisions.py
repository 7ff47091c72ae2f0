"""Golden plans of the three planners, so that a faster planner is proved to decide exactly as before.

``tests/unit/golden/{reconcile,plan_reclaim,plan_gang}.jsonl.gz`` hold one case per line (gzip, written
with no timestamp so that an unchanged regeneration is byte-identical; read one with ``zcat``): the planner's
input (its frozen models as canonical JSON) and what it returned (the report or plan as canonical JSON,
or the error it raised: class, message, attributes). ``test_decision_equivalence.py`` re-runs every
case and compares the whole output exactly (floats included: a changed summation order is a change).

Where the cases come from:

* every call the existing table tests make (``RECORDED_TESTS``, run under pytest with the three planners
  wrapped to record their arguments): the doctor's, the stranded arithmetic's, the reclaimer's and the
  gang planner's one-line cases;
* the benchmark's synthetic snapshots at small sizes (``benchmarks.bench_reconcile.synthetic_snapshot``
  with every 3rd worker idle, plus pending placement groups, some with label selectors);
* seeded random reclaimer worlds (``reclaim_gen.random_world``, ``competing_world``,
  ``pending_pg_world``), planned by ``plan_reclaim`` and by ``reconcile``;
* gang requests of every strategy on the benchmark's 1/4/8-GPU cluster.

Regenerate ONLY for an intended behaviour change (and say so in the commit):

    .venv/bin/python -m tests.unit.golden_decisions

A pure speed-up must leave these files unchanged: ``git diff tests/unit/golden`` is then empty.
"""

from __future__ import annotations

import enum
import gzip
import inspect
import json
import random
import sys
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

GOLDEN = Path(__file__).parent / "golden"
PLANNERS = ("reconcile", "plan_reclaim", "plan_gang")
RECORDED_TESTS = ("test_reconcile.py", "test_stranded.py", "test_plan_reclaim.py", "test_plan_reclaim_joint.py",
                  "test_plan_gang.py", "test_reclaim_cycle.py", "test_doctor_cli.py", "test_reclaim_drain.py")


def planners() -> dict[str, Callable]:
    from raygpu.plan.doctor.reconcile import reconcile
    from raygpu.plan.gang.reservation import plan_gang
    from raygpu.plan.reclaim.scale_down import plan_reclaim

    return {"reconcile": reconcile, "plan_reclaim": plan_reclaim, "plan_gang": plan_gang}


def _types() -> dict[str, dict[str, Any]]:
    """Per planner, the model class of each argument (a list of one class: an iterable of it)."""
    from raygpu.model.annotations import ClusterPolicy
    from raygpu.model.gang import GangRequest
    from raygpu.model.raycluster import GroupTemplate, RayClusterView
    from raygpu.model.reclaim import ReclaimPolicy
    from raygpu.model.views import Snapshot

    return {"reconcile": {"snapshot": Snapshot, "templates": [GroupTemplate]},
            "plan_reclaim": {"snapshot": Snapshot, "cluster": RayClusterView, "policy": ReclaimPolicy},
            "plan_gang": {"request": GangRequest, "cluster": RayClusterView, "policy": ClusterPolicy}}


# ------------------------------------------------------------------ canonical JSON
def canon(value: Any) -> Any:
    """Plain JSON data, the same whatever the hash seed: models dumped, sets sorted, enums by value."""
    if isinstance(value, BaseModel):
        if type(value).__name__ == "Bundle":  # GangRequest takes its bundles as plain dicts
            return canon(value.resources)
        out = {}
        for k, field in type(value).model_fields.items():  # defaults left out: validation puts them back
            v = getattr(value, k)
            if not field.is_required() and v == field.get_default(call_default_factory=True):
                continue
            out[k] = canon(v)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): canon(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(canon(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [canon(v) for v in value]
    if isinstance(value, float) and value != value:
        return "nan"
    return value


def encode_args(planner: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = inspect.signature(planners()[planner]).bind(*args, **kwargs)
    bound.apply_defaults()
    if planner == "plan_gang":
        bound.arguments.pop("templates", None)  # gang_templates(cluster): how fast, not what is decided
    return {k: canon(list(v) if k == "templates" else v) for k, v in bound.arguments.items()}


def decode_args(planner: str, data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in data.items():
        t = _types()[planner].get(k)
        if v is None or t is None:
            out[k] = v
        elif isinstance(t, list):
            out[k] = [t[0].model_validate(x) for x in v]
        else:
            out[k] = t.model_validate(v)
    return out


def run_case(planner: str, data: dict[str, Any]) -> Any:
    """The canonical output of ``planner`` on the decoded ``data``: its result, or the error it raised."""
    try:
        return canon(planners()[planner](**decode_args(planner, data)))
    except Exception as e:  # noqa: BLE001 - an error is an output too
        attrs = {k: canon(v) for k, v in sorted(vars(e).items())}
        return {"error": type(e).__name__, "message": str(e), "attrs": attrs}


def load(planner: str) -> list[dict[str, Any]]:
    with gzip.open(GOLDEN / f"{planner}.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------ case sources
class _Recorder:
    """A pytest plugin: wraps the three planners wherever they are bound and records each call's input."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.test = ""

    def pytest_configure(self, config) -> None:
        originals = planners()
        for name, fn in originals.items():
            wrapper = self._wrap(name, fn)
            for mod in list(sys.modules.values()):
                if getattr(mod, name, None) is fn:
                    setattr(mod, name, wrapper)
            sys.modules[fn.__module__].__dict__[name] = wrapper

    def pytest_runtest_setup(self, item) -> None:
        self.test = item.nodeid.split("::", 1)[-1]

    def _wrap(self, name: str, fn: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            try:
                self.calls.append((name, self.test, encode_args(name, args, kwargs)))
            except Exception:  # noqa: BLE001 - an argument that is no model (a test of bad input): not recorded
                pass
            return fn(*args, **kwargs)

        wrapper.__wrapped__ = fn
        return wrapper


def recorded_cases() -> list[tuple[str, str, dict]]:
    import pytest

    rec = _Recorder()
    here = Path(__file__).parent
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "-x", *[str(here / t) for t in RECORDED_TESTS]], plugins=[rec])
    if rc != 0:
        raise SystemExit(f"the recorded tests failed (exit {rc}): fix them before regenerating")
    return [(p, f"test:{t}", d) for p, t, d in rec.calls]


def synthetic_cases() -> list[tuple[str, str, dict]]:
    from benchmarks.bench_decision_cost import gang_cluster
    from benchmarks.bench_reconcile import NOW_S, synthetic_snapshot
    from raygpu.model.gang import GangRequest
    from raygpu.model.reclaim import ReclaimPolicy
    from raygpu.model.views import PgState, PlacementGroupView
    from raygpu.testing.builders.reclaim import NOW_S as WORLD_NOW_S
    from raygpu.testing.builders.reclaim_gen import competing_world, pending_pg_world, random_world

    out: list[tuple[str, str, dict]] = []
    policy = ReclaimPolicy(idle_timeout_s=600.0, startup_grace_s=0.0)
    for n in (10, 40):
        snap = with_idle_workers(synthetic_snapshot(n))
        ids = [rn.node_id for rn in snap.ray.nodes if not rn.is_head]
        pgs = tuple(PlacementGroupView(
            pg_id=f"pg{i:03d}", state=PgState.PENDING, strategy=("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")[i % 4],
            bundles=({"GPU": 4.0, "CPU": 8.0},) * (1 + i % 3),
            bundle_label_selectors=({"ray.io/node-type": "gpu-group"},) * (1 + i % 3) if i % 2 else (),
            bundle_node_ids=(ids[i],) + (None,) * (i % 3) if i % 5 == 4 else ())
            for i in range(max(1, n // 5)))
        with_pgs = snap.model_copy(update={"ray": snap.ray.model_copy(update={"placement_groups": pgs})})
        for label, s in (("", snap), (" + pending PGs", with_pgs)):
            out.append(("reconcile", f"bench:{n} nodes{label}", encode_args("reconcile", (s, NOW_S), {})))
            out.append(("plan_reclaim", f"bench:{n} nodes{label}",
                        encode_args("plan_reclaim", (s, reclaim_cluster(n), policy, NOW_S), {})))
    gc = gang_cluster()
    for i, bundles in enumerate(([{"GPU": 1.0}] * 4, [{"GPU": 8.0}] * 3, [{"GPU": 2.0, "CPU": 4.0}] * 5,
                                 [{"GPU": 4.0}, {"GPU": 1.0}, {"CPU": 2.0}], [{"GPU": 16.0}], [{"GPU": 0.5}])):
        for strategy in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
            req = GangRequest(name=f"pg-{i}", cluster="rc", bundles=bundles, strategy=strategy)
            out.append(("plan_gang", f"bench gang {i} {strategy}", encode_args("plan_gang", (req, gc), {})))
    gens = (("random", random_world, 300), ("competing", competing_world, 200))
    for label, gen, count in gens:
        for seed in range(count):
            w, kw = gen(random.Random(seed).randint)
            snapshot, cluster = w.obj()
            out.append(("plan_reclaim", f"{label} world {seed}",
                        encode_args("plan_reclaim", (snapshot, cluster, ReclaimPolicy(**kw), WORLD_NOW_S), {})))
            if seed % 4 == 0:
                out.append(("reconcile", f"{label} world {seed}", encode_args("reconcile", (snapshot, WORLD_NOW_S), {})))
    snapshot, cluster = pending_pg_world(20).obj()
    out.append(("plan_reclaim", "pending_pg_world 20",
                encode_args("plan_reclaim", (snapshot, cluster, ReclaimPolicy(), WORLD_NOW_S), {})))
    return out


GiB = 2**30


def with_idle_workers(snap):
    """The benchmark's state as the golden files were first made from it (issue 10): every 3rd Ray node idle
    for 700 s; kept here, so that a change to the benchmark's states does not change these inputs."""
    from benchmarks.bench_reconcile import NOW_S

    nodes = [n.model_copy(update={"idle_since_s": NOW_S - 700.0}) if (not n.is_head and i % 3 == 0) else n
             for i, n in enumerate(snap.ray.nodes)]
    return snap.model_copy(update={"ray": snap.ray.model_copy(update={"nodes": tuple(nodes)})})


def reclaim_cluster(n: int):
    from raygpu.testing.builders import cluster_view

    res = {"cpu": 8.0, "memory": 64.0 * GiB, "nvidia.com/gpu": 4.0}
    return (cluster_view("rc", resource_version="1").head(limits={"cpu": 4, "memory": 16 * GiB})
            .group("gpu-group", replicas=2 * n, min_replicas=0, max_replicas=4 * n, limits=res, requests=res).obj())


def main() -> int:
    cases = recorded_cases() + synthetic_cases()
    GOLDEN.mkdir(exist_ok=True)
    for planner in PLANNERS:
        seen: set[str] = set()
        lines = []
        for p, name, data in cases:
            key = json.dumps(data, sort_keys=True)
            if p != planner or key in seen:
                continue
            seen.add(key)
            if canon(decode_args(planner, data)) != data:
                raise SystemExit(f"{planner} {name}: its input does not survive a JSON round trip")
            case = {"name": name, "input": data, "output": run_case(planner, data)}
            lines.append(json.dumps(case, sort_keys=True, separators=(",", ":")))
        path = GOLDEN / f"{planner}.jsonl.gz"
        with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
            f.write(("\n".join(lines) + "\n").encode())
        print(f"{planner}: {len(lines)} cases, {sum(map(len, lines)) // 1024} KiB, {path.stat().st_size // 1024} KiB gzipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
