"""plan_reclaim against its spec on random small worlds (hypothesis), and against the plans it made before.

The spec is written here, independently of the planner:

* ``counted``: the Ray nodes whose capacity counts, alive Ray nodes whose pod of this cluster exists, is not
  deleting, is not listed in ``workersToDelete`` and belongs to a group of the spec (or is the head);
* ``placeable``: an exhaustive search, can these bundles go on these nodes now (free resources, label
  selectors, the strategy)?
* the protections of docs/reclaimer.md, checked pod by pod on what the plan deletes.

The property of issue 14 item 7: a pending or rescheduling PG that could be placed on the counted nodes before
the plan can still be placed on them after it (each PG on its own).

Hypothesis profile: ``ci`` (the default, 20,000 examples, derandomized so every run checks the same worlds) or
``dev`` (1,000): ``RAYGPU_HYPOTHESIS_PROFILE=dev``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raygpu.model.reclaim import ReclaimPolicy
from raygpu.model.views import PgState
from raygpu.plan.reclaim.scale_down import plan_reclaim
from raygpu.testing.builders.reclaim import NOW_S
from raygpu.testing.builders.reclaim_gen import pending_pg_world, random_world
from raygpu.testing.builders.recorded import ALL_IDLE, RECORDED, plan_on, ray_view
from test_plan_reclaim import VERDICTS

settings.register_profile("ci", max_examples=20_000, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", parent=settings.get_profile("ci"), max_examples=1_000)
PROFILE = settings.get_profile(os.environ.get("RAYGPU_HYPOTHESIS_PROFILE", "ci"))
GOLDEN = json.loads((Path(__file__).parent / "data" / "reclaim_plans_before.json").read_text())
EPS = 1e-9


# ------------------------------------------------------------------ the spec
def counted(snapshot, cluster) -> dict:
    """Ray node id -> node, for the nodes whose capacity counts (before any plan)."""
    listed = {n for g in cluster.worker_groups for n in g.workers_to_delete}
    pods = {p.name: p for p in snapshot.k8s.pods if p.ray_cluster == cluster.name and p.namespace == cluster.namespace}
    out = {}
    for n in snapshot.ray.nodes:
        p = pods.get(n.instance_id or "")
        if n.alive and p is not None and not p.deleting and p.name not in listed and (
                p.is_head or cluster.group(p.ray_group or "") is not None):
            out[n.node_id] = n
    return out


def label_ok(selector: dict, labels: dict) -> bool:
    for key, want in selector.items():
        have = labels.get(key)
        neg, expr = (True, want[1:]) if want.startswith("!") else (False, want)
        values = expr[3:-1].split(",") if expr.startswith("in(") else [expr]
        if (have in [v.strip() for v in values]) == neg:
            return False
    return True


def placeable(pg, nodes: dict) -> bool:
    """Exhaustive: can every unplaced bundle of ``pg`` go on ``nodes`` (their ``available``) at once?"""
    placed = {n for n in pg.bundle_node_ids if n}
    todo = [i for i in range(len(pg.bundles)) if i >= len(pg.bundle_node_ids) or not pg.bundle_node_ids[i]]
    sel = [pg.bundle_label_selectors[i] if i < len(pg.bundle_label_selectors) else {} for i in range(len(pg.bundles))]
    free = {nid: dict(n.available) for nid, n in nodes.items()}

    def fits(i, nid):
        return label_ok(sel[i], nodes[nid].labels) and all(
            free[nid].get(k, 0.0) + EPS >= v for k, v in pg.bundles[i].items() if v > 0)

    def take(i, nid, sign):
        for k, v in pg.bundles[i].items():
            free[nid][k] = free[nid].get(k, 0.0) - sign * v

    def place(j, used) -> bool:
        if j == len(todo):
            return True
        i = todo[j]
        for nid in nodes:
            if pg.strategy == "STRICT_SPREAD" and (nid in used or nid in placed):
                continue
            if pg.strategy == "STRICT_PACK" and (used and nid not in used or placed and nid not in placed):
                continue
            if fits(i, nid):
                take(i, nid, 1)
                if place(j + 1, used | {nid}):
                    return True
                take(i, nid, -1)
        return False

    return place(0, frozenset())


def violations(snapshot, cluster, policy: ReclaimPolicy, plan) -> list[str]:
    """Every way ``plan`` breaks the protections or the placement property (empty: none)."""
    bad = []
    pods = {p.name: p for p in snapshot.k8s.pods if p.ray_cluster == cluster.name and p.namespace == cluster.namespace}
    if sorted(pods) != [d.pod_name for d in plan.decisions]:
        bad.append("not one decision per pod")
    deleted = set(plan.deleted_pods)
    nodes = {n.instance_id: n for n in snapshot.ray.nodes if n.alive}
    held = {nid for pg in snapshot.ray.placement_groups if pg.state is not PgState.REMOVED
            for nid in pg.bundle_node_ids if nid}
    for d in plan.decisions:
        if (d.pod_name in deleted) != (d.action.value == "delete") or (d.reason.value == "Idle") != (d.action.value == "delete"):
            bad.append(f"{d.pod_name}: action {d.action.value} reason {d.reason.value} listed {d.pod_name in deleted}")
    for name in deleted:
        p, g, n = pods.get(name), cluster.group(pods[name].ray_group or "") if name in pods else None, nodes.get(name)
        res = p.labels.get("raygpu.io/reservation") if p else None
        res = res or (p.ray_group if p and (p.ray_group or "").startswith("rg-") else None)
        why = [w for w, broken in [
            ("Ray unreachable", not snapshot.ray.reachable), ("no such pod", p is None), ("head", p and p.is_head),
            ("group not in spec", g is None), ("deleting", p and p.deleting),
            ("already listed", g and name in g.workers_to_delete),
            ("startup grace", p and NOW_S - p.created_at_s < policy.startup_grace_s),
            ("no live Ray node", n is None), ("busy", n and n.idle_since_s is None),
            ("idle too short", n and n.idle_since_s is not None and NOW_S - n.idle_since_s < policy.idle_timeout_for_s(g.group_name if g else "")),
            ("holds a bundle", n and n.node_id in held),
            ("live reservation", res and (policy.live_reservations is None or res in policy.live_reservations))] if broken]
        bad += [f"{name} deleted: {w}" for w in why]
    for g in cluster.worker_groups:
        pending = len({n for n in g.workers_to_delete if n in pods})
        gone = sum(1 for n in deleted if n in pods and pods[n].ray_group == g.group_name)
        if gone and gone > g.replicas - pending - g.min_replicas:
            bad.append(f"group {g.group_name}: {gone} deleted below minReplicas {g.min_replicas}")
    for sd in plan.to_delete:
        if sd.replicas != sd.old_replicas - len(sd.added):
            bad.append(f"group {sd.group_name}: replicas {sd.replicas} != {sd.old_replicas} - {len(sd.added)}")
    before = counted(snapshot, cluster)
    after = {nid: n for nid, n in before.items() if n.instance_id not in deleted}
    for pg in snapshot.ray.placement_groups:
        if pg.state in (PgState.PENDING, PgState.RESCHEDULING) and placeable(pg, before) and not placeable(pg, after):
            bad.append(f"{pg.pg_id} ({pg.strategy}) placeable before the plan, not after it")
    return bad


def plan_and_check(w, policy_kw: dict):
    snapshot, cluster = w.obj()
    policy = ReclaimPolicy(**policy_kw)
    plan = plan_reclaim(snapshot, cluster, policy, NOW_S)
    return plan, violations(snapshot, cluster, policy, plan)


# ------------------------------------------------------------------ the tests
def _picker(data: bytes):
    """``pick(lo, hi)`` reading one byte per value from ``data`` (``lo`` once it runs out): one hypothesis draw
    per world instead of ~100 keeps 20,000 examples fast, and shrinking ``data`` towards zeros still shrinks
    the world towards its smallest choices."""
    it = iter(data)
    return lambda lo, hi: lo + next(it, 0) % (hi - lo + 1)


@st.composite
def worlds(draw):
    return random_world(_picker(draw(st.binary(min_size=300, max_size=300))))


@settings(PROFILE)
@given(worlds())
def test_random_worlds_keep_every_protection_and_every_placeable_pg(w_policy):
    w, policy_kw = w_policy
    plan, bad = plan_and_check(w, policy_kw)
    assert not bad, describe(w, policy_kw, plan)


def describe(w, policy_kw: dict, plan) -> str:
    """The world and the verdicts, one line each, for a failing example."""
    snapshot, cluster = w.obj()
    lines = [f"policy {policy_kw}; Ray reachable {snapshot.ray.reachable}"]
    lines += [f"group {g.group_name}: replicas {g.replicas} min {g.min_replicas} max {g.max_replicas} "
              f"gpus {g.ray_gpus} listed {g.workers_to_delete}" for g in cluster.worker_groups]
    lines += [f"pod {p.name} group {p.ray_group} deleting {p.deleting} labels {p.labels}" for p in snapshot.k8s.pods]
    lines += [f"ray {n.node_id} alive {n.alive} {n.labels} total {n.total} free {n.available} idle {n.idle_since_s}"
              for n in snapshot.ray.nodes]
    lines += [f"{pg.pg_id} {pg.state.value} {pg.strategy} {pg.bundles} on {pg.bundle_node_ids} "
              f"selectors {pg.bundle_label_selectors}" for pg in snapshot.ray.placement_groups]
    lines += [f"-> {d.pod_name} {d.reason.value}: {d.detail}" for d in plan.decisions]
    return "\n".join(lines)


def test_the_oracle_sees_what_it_should():
    """The spec itself: a selector-bound PACK pair fits two zone-split workers, not one worker of the wrong zone."""
    from raygpu.testing.builders.reclaim import world

    w = (world().worker("a", gpus=1, idle_for_s=900, ray_labels={"zone": "a"}).worker("b", gpus=1, idle_for_s=900)
         .pg_pending([{"GPU": 1}, {"GPU": 1}], selectors=[{}, {"zone": "a"}]))
    snapshot, cluster = w.obj()
    (pg,) = snapshot.ray.placement_groups
    nodes = counted(snapshot, cluster)
    assert placeable(pg, nodes)
    assert not placeable(pg, {k: v for k, v in nodes.items() if v.instance_id != "a"})
    assert placeable(pg.model_copy(update={"strategy": "STRICT_SPREAD"}), nodes)
    assert not placeable(pg.model_copy(update={"strategy": "STRICT_PACK"}), nodes)


@pytest.mark.parametrize("case,w,policy,_", VERDICTS, ids=[c[0] for c in VERDICTS])
def test_table_plans_are_those_made_before(case, w, policy, _):
    """Every field of every plan of the verdict table, as the planner before issue 10's rewrite made it."""
    snapshot, cluster = w.obj()
    assert _as_before(plan_reclaim(snapshot, cluster, ReclaimPolicy(**policy), NOW_S)) == GOLDEN["tables"][case]


def test_scale_and_recorded_plans_are_those_made_before():
    snapshot, cluster = pending_pg_world(30).obj()
    assert _as_before(plan_reclaim(snapshot, cluster, ReclaimPolicy(), NOW_S)) == \
        GOLDEN["tables"]["pending_pg_world(30)"]
    assert _as_before(plan_on(RECORDED, ray_view(ALL_IDLE))) == GOLDEN["tables"]["recorded all idle"]


def _as_before(plan) -> dict:
    """The plan as JSON, less ``search_budget_spent`` (added after these plans were recorded): none of these
    small worlds may run out of search budget."""
    out = plan.model_dump(mode="json")
    assert out.pop("search_budget_spent") == ""
    return out


def test_random_plans_are_those_made_before_unless_those_were_unsafe():
    """1,000 seeded worlds: the same verdicts as before the rewrite, except where the old plan broke the
    placement property (issue 14 item 7, each PG on its own or PGs together) or counted a Ray node whose pod
    is gone (item 6)."""
    from test_reclaim_properties_joint import joint_violations

    changed = []
    for seed, before in GOLDEN["random"].items():
        w, policy_kw = random_world(random.Random(int(seed)).randint)
        plan, bad = plan_and_check(w, policy_kw)
        assert not bad, (seed, bad)
        now = " ".join(f"{d.pod_name}:{d.reason.value}" for d in plan.decisions if d.pod_name != "rc-head")
        if now == before:
            continue
        snapshot, cluster = w.obj()
        old_deleted = {p.split(":")[0] for p in before.split() if p.endswith(":Idle")}
        old = plan.model_copy(update={"to_delete": ()})  # only the deletions matter to the spec
        old_plan = _with_deleted(old, old_deleted)
        old_bad = [v for v in violations(snapshot, cluster, ReclaimPolicy(**policy_kw), old_plan)
                   if "placeable before" in v] + joint_violations(snapshot, cluster, old_plan)
        ghost = any(n.alive and n.node_id not in counted(snapshot, cluster) for n in snapshot.ray.nodes)
        assert old_bad or ghost, (seed, before, now)
        changed.append(seed)
    assert len(changed) < len(GOLDEN["random"]) // 10, changed


def _with_deleted(plan, names: set[str]):
    """``plan`` with exactly ``names`` deleted (for checking an old plan's deletions against the spec)."""
    from raygpu.model.reclaim import DecisionAction, GroupScaleDown, ReclaimReason

    decisions = tuple(d.model_copy(update={"action": DecisionAction.DELETE, "reason": ReclaimReason.IDLE})
                      if d.pod_name in names else d for d in plan.decisions)
    added = tuple(sorted(names))
    sd = GroupScaleDown(group_name="*", group_index=0, old_replicas=len(added), replicas=0,
                        workers_to_delete=added, added=added)
    return plan.model_copy(update={"decisions": decisions, "to_delete": (sd,) if added else ()})
