"""Runtime hints and backfill on the one fake Kubernetes (issue 11 item 2): the hint on a gang's pods, the
holder's estimated start on its Lease (resourceVersion-guarded), nodes chosen by known ends, the pass on a
backfilling gang's own pending pods, granted and revoked by the holder alone on its Lease, each gang asking on
its own ask Lease and labelling only its own pods. Fake clocks throughout."""

from __future__ import annotations

import datetime as dt
import time

from raygpu.errors import ConflictError
from raygpu.guard.backfill import Backfill
from raygpu.guard.holder import Guard
from raygpu.gang.reservation import reserve
from raygpu.model.gang import ReservationState
from raygpu.model.labels import (ANNOTATION_GUARD_ASK, ANNOTATION_GUARD_GRANTS, ANNOTATION_GUARD_START, BACKFILL_GATE,
                                 LABEL_GUARD_PASS, LABEL_RESERVATION)
from raygpu.plan.backfill import BACKFILL_MARGIN_S
from raygpu.testing.builders.clusters import cluster, gang, gpus
from raygpu.testing.fake_kube import FakeKube
from tests.unit.test_gang_guard import World

S = ReservationState
WALL = 1_800_000_000.0  # the drivers' wall clock (unix s), fake


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Wall:
    def __init__(self, now_s: float = WALL) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


RIGHTS = {("patch", "pods"), ("get", "leases"), ("create", "leases"), ("patch", "leases"), ("delete", "leases")}  # to backfill


def hinted_world(t1_ads: int | None = None, t3_ads: int | None = 200) -> tuple[World, Wall]:
    """World's tenants, started by their kubelets 100 s ago: t1 (6 GPUs on n1) and t3 (2 GPUs on n3), with
    activeDeadlineSeconds ``t1_ads`` / ``t3_ads``; the guard reads time from a fake wall clock."""
    w, wall = World(), Wall()
    w.kube.allowed |= RIGHTS
    for name, ads in (("t1", t1_ads), ("t3", t3_ads)):
        pod = w.kube.objects[("Pod", "default", name)]
        pod["status"]["startTime"] = rfc3339(WALL - 100)
        if ads is not None:
            pod["spec"]["activeDeadlineSeconds"] = ads
    w.guard = Guard.of(w.rsv, w.clock, w.said.append, wall=wall)
    return w, wall


def backfiller(w: World, wall: Wall, name: str, hint: float, bound: bool = False) -> tuple[Backfill, str]:
    """A second, unguarded raygpu gang (1 x 8 GPUs, hint ``hint``) of the same cluster, with one pod."""
    rsv = reserve(w.kube, gang(gpus(8, 1), name=name, backend="none", expected_runtime_s=hint, timeout_s=600),
                  time.time())
    pod = f"{rsv.plan.reservation_group}-0"
    tpl = next(g for g in w.kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == rsv.plan.reservation_group)
    assert tpl["template"]["spec"]["schedulingGates"] == [{"name": BACKFILL_GATE}]  # KubeRay makes it gated
    w.kube.objects[("Pod", "default", pod)] = {"metadata": {"name": pod, "namespace": "default", "resourceVersion": "1",
                                                 "labels": {LABEL_RESERVATION: rsv.plan.reservation_group}},
                                    "spec": {"nodeName": "n2"} if bound else {"schedulingGates": [
                                        {"name": BACKFILL_GATE}]}}
    bf = Backfill.of(rsv, w.clock, w.said.append)
    assert bf is not None
    return bf, pod


def pass_of(w: World, pod: str) -> str | None:
    return w.kube.objects[("Pod", "default", pod)]["metadata"]["labels"].get(LABEL_GUARD_PASS)


def test_the_hint_goes_on_the_gangs_pods_and_only_an_unguarded_hinted_gang_backfills():
    kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True)
    kube.allowed |= RIGHTS
    rsv = reserve(kube, gang(gpus(8, 2), backend="none", expected_runtime_s=90.5), time.time())
    group = next(g for g in kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == rsv.plan.reservation_group)
    assert group["template"]["metadata"]["annotations"]["raygpu.io/expected-runtime-s"] == "90.5"
    assert rsv.wiring.scope_lease == "raygpu-guard-default" and Backfill.of(rsv, time.monotonic, print) is not None
    plain = reserve(kube, gang(gpus(8, 1), name="plain", backend="none"), time.time())
    spec = next(g for g in kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == plain.plan.reservation_group)
    assert "raygpu.io/expected-runtime-s" not in (spec["template"].get("metadata") or {}).get("annotations", {})
    assert Backfill.of(plain, time.monotonic, print) is None  # no hint: never backfills
    guarded = World(expected_runtime_s=60)
    assert Backfill.of(guarded.rsv, time.monotonic, print) is None  # a guarded gang waits its turn, gated


def test_the_holder_publishes_its_estimated_start_from_the_pods_known_ends():
    w, _ = hinted_world(t3_ads=200)  # t3 ends at WALL + 100 (kubelet started it at WALL - 100)
    w.step()
    assert sorted(b["spec"]["nodeName"] for b in w.blockers().values()) == ["n2", "n3"]
    assert w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_START] == f"{WALL + 100:.0f}"


def test_nodes_are_chosen_by_known_ends_before_free_gpus():
    w, _ = hinted_world(t1_ads=130, t3_ads=None)  # n1 frees at WALL + 30; n3 (more free) never, as far as known
    w.step()
    assert sorted(b["spec"]["nodeName"] for b in w.blockers().values()) == ["n1", "n2"]
    assert w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_START] == f"{WALL + 30:.0f}"


def test_a_conflict_on_the_lease_is_never_overwritten_and_the_start_is_published_next_step():
    w, _ = hinted_world()
    w.kube.fail("merge_patch", ConflictError("409"), when=lambda *a: a[1] == "Lease" and "annotations" in a[4]["metadata"])
    w.step()  # the publication met a 409: nothing written over it
    assert ANNOTATION_GUARD_START not in (w.lease()["metadata"].get("annotations") or {})
    w.step()
    assert w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_START] == f"{WALL + 100:.0f}"
    patches = [c[1][4] for c in w.kube.calls if c[0] == "merge_patch" and c[1][1] == "Lease"]
    assert all(p["metadata"].get("resourceVersion") for p in patches)  # every Lease write is guarded


def test_freeing_the_lease_clears_the_estimated_start():
    w, _ = hinted_world()
    w.step()
    w.clock.tick(91)
    w.step()  # past max-hold
    lease = w.lease()
    assert "holderIdentity" not in lease["spec"]
    assert not (lease["metadata"].get("annotations") or {}).get(ANNOTATION_GUARD_START)


def test_without_the_rights_to_backfill_the_gang_is_made_as_usual_ungated():
    kube = FakeKube(cluster("c").worker("gpu", gpus=8).raw(), kuberay=True)
    said: list[str] = []
    rsv = reserve(kube, gang(gpus(8, 1), backend="none", expected_runtime_s=60), time.time(), progress=said.append)
    spec = next(g for g in kube.raw["spec"]["workerGroupSpecs"] if g["groupName"] == rsv.plan.reservation_group)
    assert "schedulingGates" not in spec["template"]["spec"] and Backfill.of(rsv, time.monotonic, print) is None
    assert any("backfill off" in m for m in said)


def test_a_lease_read_forbidden_later_still_lifts_the_gate_without_a_pass():
    from raygpu.errors import ForbiddenError
    w, wall = hinted_world()
    w.step()
    bf, pod = backfiller(w, wall, "norbac", hint=1)
    w.kube.fail("get", ForbiddenError("403"), when=lambda *a: a[1] == "Lease")
    bf.step(S.RESERVED)
    assert pass_of(w, pod) is None and not w.kube.objects[("Pod", "default", pod)]["spec"].get("schedulingGates")


def test_the_decision_is_said_once_while_only_its_numbers_change():
    w, wall = hinted_world()
    w.step()
    bf, _ = backfiller(w, wall, "long", hint=600)
    for _ in range(3):
        w.clock.tick()
        wall.now_s += 2
        bf.step(S.RESERVED)
    assert sum(m.startswith("backfill: no pass") for m in w.said) == 1


def gated(w: World, pod: str) -> bool:
    return any(g["name"] == BACKFILL_GATE for g in w.kube.objects[("Pod", "default", pod)]["spec"].get("schedulingGates") or [])


def ask_and_answer(w: World, *bfs: Backfill) -> None:
    """Each backfilling gang asks, the holder answers on its Lease, each acts on the answer (steps 2 s apart)."""
    for bf in bfs:
        bf.step(S.RESERVED)
    w.step()
    w.clock.tick()
    for bf in bfs:
        bf.step(S.RESERVED)


def pass_writers(w: World, guard_step, bf_steps: dict) -> list[tuple[str, str]]:
    """(who, pod) for every patch of the label raygpu.io/guard-pass; who: the holder's step or a backfill's."""
    log: list[tuple[str, str]] = []
    who = {"now": "nobody"}
    real = w.kube.merge_patch

    def merge_patch(api, kind, name, ns, body):
        if kind == "Pod" and LABEL_GUARD_PASS in ((body.get("metadata") or {}).get("labels") or {}):
            log.append((who["now"], name))
        return real(api, kind, name, ns, body)
    w.kube.merge_patch = merge_patch

    def as_(name, fn):
        def run(*a):
            who["now"] = name
            try:
                return fn(*a)
            finally:
                who["now"] = "nobody"
        return run
    w.guard.step = as_("holder", guard_step)
    for name, bf in bf_steps.items():
        bf.step = as_(name, bf.step)
    return log


def test_an_unknown_end_publishes_no_start_and_the_holder_refuses_every_ask():
    w, wall = hinted_world(t3_ads=None)  # t3 has no deadline and is no raygpu pod: its end is unknown
    w.step()
    assert not (w.lease()["metadata"].get("annotations") or {}).get(ANNOTATION_GUARD_START)
    bf, pod = backfiller(w, wall, "short", hint=1)
    bf.step(S.RESERVED)
    assert gated(w, pod) and "no answer yet" in bf.reason  # kept gated: its first try must carry the answer
    w.step()
    w.clock.tick()
    bf.step(S.RESERVED)
    assert pass_of(w, pod) is None and not gated(w, pod) and "refused" in bf.reason


def test_a_short_hint_is_granted_the_pass_on_its_own_pending_pods_and_a_long_one_is_not():
    w, wall = hinted_world(t3_ads=200)  # the hold starts at WALL + 100
    w.step()
    tag = w.guard.tag
    short, short_pod = backfiller(w, wall, "short", hint=100 - BACKFILL_MARGIN_S)  # ends a margin before: in
    long, long_pod = backfiller(w, wall, "long", hint=100 - BACKFILL_MARGIN_S + 1)  # one second too long: out
    bound, bound_pod = backfiller(w, wall, "bound", hint=1, bound=True)  # already bound: never relabelled
    w.clock.tick()
    ask_and_answer(w, short, long, bound)
    asks = {k[2]: o for k, o in w.kube.objects.items() if k[0] == "Lease" and ".ask." in k[2]}
    assert len(asks) == 3 and all(o["spec"]["holderIdentity"] in k for k, o in asks.items())  # each its own ask
    answers = w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_GRANTS]
    assert f"{short.tag}=yes" in answers and f"{long.tag}=no" in answers  # the holder alone decides
    assert pass_of(w, short_pod) == tag and pass_of(w, long_pod) is None and pass_of(w, bound_pod) is None
    patched = [c[1][2] for c in w.kube.calls if c[0] == "merge_patch" and c[1][1] == "Pod"]
    assert patched == [short_pod, long_pod]  # the bound pod is never patched
    for p in (short_pod, long_pod):  # the answer lifts the gate: scheduled as usual, with or without pass
        assert not gated(w, p)
    assert w.kube.objects[("Pod", "default", "t1")]["metadata"]["labels"] == {}  # nobody else's pod is touched
    assert asks[short.ask]["metadata"]["annotations"][ANNOTATION_GUARD_ASK] == "1;1"  # acted on rev 1, one pass
    wall.now_s += 5  # still pending 5 s later: it would now end inside the hold, so the holder revokes the pass
    w.clock.tick()
    w.step()
    w.clock.tick()
    short.step(S.RESERVED)
    assert pass_of(w, short_pod) is None


def test_the_holders_clock_behind_the_kubelets_is_covered_by_the_margin():
    w, wall = hinted_world(t3_ads=200)  # the hold starts at WALL + 100 on the kubelet's clock
    w.step()
    wall.now_s = WALL - 25  # the holder's clock (which decides) runs 25 s behind
    bf, pod = backfiller(w, wall, "skewed", hint=96)  # by its clock it ends at WALL + 71, truly at WALL + 96
    bf2, pod2 = backfiller(w, wall, "skewed2", hint=95)  # truly ends at WALL + 95, before the start
    w.clock.tick()
    ask_and_answer(w, bf, bf2)
    assert pass_of(w, pod) is None  # 96 + 30 > 100 + 25: refused, although it would truly end before the start
    assert pass_of(w, pod2) == w.guard.tag


def one_asker_answered(name: str) -> tuple[World, Backfill, str]:
    """A holder whose gang starts 200 s from now, and one backfilling gang (hint 10 s) that asked and was
    answered: its world, its backfiller and its pod."""
    w, wall = hinted_world(t3_ads=200)
    w.step()
    bf, pod = backfiller(w, wall, name, hint=10)
    w.clock.tick()
    ask_and_answer(w, bf)
    return w, bf, pod


def test_before_its_swap_the_holder_revokes_every_pass_and_swaps_once_the_asker_took_it_off():
    w, bf, pod = one_asker_answered("late")
    assert pass_of(w, pod) == w.guard.tag
    del w.kube.objects[("Pod", "default", "t3")]  # t3 ends early: room on every held node now
    w.step()
    assert not w.guard.swapped and f"{bf.tag}=no" in w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_GRANTS]
    assert pass_of(w, pod) == w.guard.tag  # revoked on the Lease; the pod's label is its own gang's to take off
    assert w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_START] == f"{WALL:.0f}"  # starts now
    w.step()
    assert not w.guard.swapped  # the asker has not acted on the revocation yet
    w.clock.tick()
    bf.step(S.RESERVED)
    assert pass_of(w, pod) is None
    w.step()
    assert w.guard.swapped


def test_the_pass_label_has_one_writer_the_backfilling_gang_never_the_holder():
    w, wall = hinted_world(t3_ads=200)
    w.step()
    bf, pod = backfiller(w, wall, "late", hint=10)
    log = pass_writers(w, w.guard.step, {"backfill": bf})
    w.clock.tick()
    ask_and_answer(w, bf)
    del w.kube.objects[("Pod", "default", "t3")]
    for _ in range(4):  # grant, revoke, take off, swap
        w.step()
        w.clock.tick()
        bf.step(S.RESERVED)
    assert w.guard.swapped and pass_of(w, pod) is None
    assert log and {who for who, _ in log} == {"backfill"}, log  # the holder never patched the label


def asks(w: World) -> dict[str, dict]:
    return {k[2]: o for k, o in w.kube.objects.items() if k[0] == "Lease" and ".ask." in k[2]}


def test_a_gone_askers_ask_is_deleted_by_the_holder_under_its_uid_and_a_renewed_one_never():
    w, wall = hinted_world(t3_ads=200)
    w.step()
    alive, _ = backfiller(w, wall, "alive", hint=10)
    dead, _ = backfiller(w, wall, "dead", hint=10)
    w.clock.tick()
    ask_and_answer(w, alive, dead)
    uid = asks(w)[dead.ask]["metadata"]["uid"]
    for _ in range(20):  # 40 s: the dead gang's driver no longer steps; the live one renews every 10 s
        w.step()
        alive.step(S.RESERVED)
    assert set(asks(w)) == {alive.ask}  # gone once unchanged for 30 s on the holder's clock
    assert ("Lease", dead.ask, uid) in w.deletes  # under its uid: never a same-named newer ask
    assert f"{dead.tag}=" not in w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_GRANTS]  # no longer answered


def test_an_ask_deleted_while_its_gang_lives_is_made_again_and_a_release_withdraws_it():
    w, bf, _ = one_asker_answered("cut")
    del w.kube.objects[("Lease", w.guard.ns, bf.ask)]  # (the holder took it for gone: its driver was cut off)
    for _ in range(6):  # renewed within LEASE_DURATION_S / 3: the patch finds it gone and makes it again
        w.clock.tick()
        bf.step(S.RESERVED)
    assert bf.ask in asks(w)
    bf.release()  # the reservation was removed while its pods were pending (the watchdog no longer steps)
    assert not asks(w) and bf.done
    bf.release()  # idempotent


def test_taking_or_freeing_the_lease_clears_the_answers_and_keeps_counting_their_revision():
    w, bf, _ = one_asker_answered("short")
    assert w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_GRANTS] == f"1;{bf.tag}=yes"
    w.guard.release("test")
    assert w.lease()["metadata"]["annotations"][ANNOTATION_GUARD_GRANTS] == "2;"  # an asker's "1" names one write
    w.clock.tick()
    bf.step(S.RESERVED)
    assert bf.reason == "no other gang holds the scope"
