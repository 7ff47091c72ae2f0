"""``raygpu demo``: the gang deadlock, without and with raygpu, on the local testbed."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
import time
import uuid

EXPLAIN = """\
Two teams share 8 machines x 8 GPUs = 64 GPUs. At the same moment each asks Ray
for a placement group of 6 bundles x 8 GPUs (one per machine, STRICT_SPREAD).
That needs 12 machines; there are 8. Someone has to wait - the question is
whether the waiting team sits on GPUs while it waits.
"""


def register(sub) -> None:
    p = sub.add_parser("demo", help="the gang-deadlock demo on the local testbed",
                       description=EXPLAIN + "\nStarts the testbed if it is not up (first time: builds it).",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="coscheduling", choices=["coscheduling", "kueue", "workload"],
                   help="the Kubernetes gang backend raygpu uses (default: coscheduling). workload: Kubernetes' "
                        "own Workload API with the default kube-scheduler alone, on a Kubernetes 1.37 testbed "
                        "(RAYGPU_TESTBED_KUBERNETES defaults to 1.37 for it) with deploy/workload applied")
    p.add_argument("--unmodified", action="store_true",
                   help="the same two tenants with UNMODIFIED Ray Train jobs (no raygpu in the job), three ways: "
                        "Ray's own autoscaler; raygpu's gang scale-up beside Ray's autoscaler; gang scale-up alone "
                        "(docs/gang-scale-up.md). Backend coscheduling. About 10 minutes")
    p.add_argument("--arm", action="append", choices=["autoscaler", "scale-up+autoscaler", "scale-up"],
                   help="with --unmodified: run only this arm (repeatable; default all three)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--keep-testbed", action="store_true", help="leave a testbed this command started running")
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from raygpu.testing.testbed_lock import hold_testbed_lock
    if args.arm and not args.unmodified:
        print("raygpu demo: --arm needs --unmodified", file=sys.stderr)
        return 2
    if args.unmodified and args.backend != "coscheduling":
        print("raygpu demo: --unmodified runs gang scale-up on backend coscheduling; leave --backend out",
              file=sys.stderr)
        return 2
    with hold_testbed_lock(progress=_say):  # the whole demo: no one restarts the testbed under it (docs/testbed.md)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from raygpu.demo import deadlock
    from raygpu.model.labels import LABEL_POOL
    from raygpu.testing import addons
    from raygpu.testing import manifests as m
    from raygpu.testing.controlplane import Testbed
    from raygpu.testing.kube import apply, dynamic
    if args.backend == "workload":  # the Workload API needs a 1.37 control plane (docs/testbed.md)
        os.environ.setdefault("RAYGPU_TESTBED_KUBERNETES", "1.37")
    tb = Testbed()
    started = False
    if not tb.is_up():
        tb.up(progress=lambda msg: _say(f"[testbed] {msg}"))
        started = True
    ns = f"raygpu-demo-{uuid.uuid4().hex[:5]}"
    dyn = dynamic(tb.kubeconfig)
    apply(dyn, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    nodes = {f"{ns}-gpu{i}": "h100x8" for i in range(8)} | {f"{ns}-cpu": "cpu16"}
    _say(EXPLAIN)
    try:
        addons.add_nodes(tb, nodes, labels={LABEL_POOL: ns})
        queue = None
        if args.backend == "kueue":
            apply(dyn, m.cluster_queue(f"{ns}-cq", {"cpu": "768", "memory": "8Ti", "nvidia.com/gpu": "64"}))
            apply(dyn, m.local_queue("gpus", ns, f"{ns}-cq"))
            queue = "gpus"
        if args.backend == "workload":  # cluster-wide, idempotent: puts the reserved pods in their PodGroup
            install_workload_policy(dyn, ns)
        if args.unmodified:
            return _unmodified(args, tb, ns)
        _say("1) WITHOUT raygpu: plain Ray placement groups, the autoscalers add workers one by one")
        plain = deadlock.run(tb, ns, ns, "plain", progress=_say)
        deadlock.teardown(tb, ns)
        _say(f"\n2) WITH raygpu: raygpu.placement_group(..., backend={args.backend!r}) reserves each gang whole")
        gang = deadlock.run(tb, ns, ns, "raygpu", args.backend, queue=queue, progress=_say)
        deadlock.teardown(tb, ns)
    finally:
        addons.remove_nodes(tb, list(nodes))
        try:
            dyn.resources.get(api_version="v1", kind="Namespace").delete(name=ns)
            if args.backend == "kueue":
                dyn.resources.get(api_version="kueue.x-k8s.io/v1beta2", kind="ClusterQueue").delete(name=f"{ns}-cq")
        except Exception:  # noqa: BLE001 - best-effort cleanup
            pass
        if started and not args.keep_testbed:
            tb.down(quiet=True)
    if args.json:
        from dataclasses import asdict
        print(json.dumps({"plain": asdict(plain), "raygpu": asdict(gang)}, indent=2, default=str))
    else:
        print(render(plain, gang, args.backend))
    return 0 if plain.deadlocked and all(t.ready_after_s for t in gang.tenants.values()) else 1


UNMODIFIED = """\
Now each team runs an UNMODIFIED Ray Train job (DataParallelTrainer, 6 workers x 8 GPUs; Ray Train makes
the placement group, the job never imports raygpu), three ways.
"""


def _unmodified(args: argparse.Namespace, tb, ns: str) -> int:
    from dataclasses import asdict

    from raygpu.demo import deadlock, unmodified
    _say(UNMODIFIED)
    results = {}
    for i, arm in enumerate(a for a in unmodified.ARMS if not args.arm or a in args.arm):
        _say(f"{i + 1}) {arm}")
        try:
            results[arm] = unmodified.run_arm(tb, ns, ns, arm, progress=_say)
        finally:
            deadlock.teardown(tb, ns)
    if args.json:
        print(json.dumps({a: asdict(r) for a, r in results.items()}, indent=2, default=str))
    else:
        print(unmodified.render(results))
    return 0 if unmodified.verdict(results) else 1


def workload_policy() -> list[dict]:
    """The objects of deploy/workload (the MutatingAdmissionPolicy and its binding), as shipped."""
    import yaml
    path = Path(__file__).resolve().parents[2] / "deploy" / "workload" / "mutating-admission-policy.yaml"
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def install_workload_policy(dyn, namespace: str, timeout_s: float = 30.0) -> None:
    """Apply deploy/workload and wait until the API server enforces it: it loads admission policies through an
    informer, so the first pods created right after the apply may pass unmutated. Polls a dry-run pod create
    in ``namespace`` (nothing is stored) until it comes back in its PodGroup; RuntimeError past ``timeout_s``."""
    import time

    from raygpu.testing.kube import apply
    for obj in workload_policy():
        apply(dyn, obj)
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "policy-probe-", "namespace": namespace,
             "labels": {"raygpu.io/reservation": "probe", "raygpu.io/scheduling-group": "probe"}},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    deadline = time.monotonic() + timeout_s
    while True:
        out = pods.create(body=probe, namespace=namespace, dry_run="All").to_dict()
        if (out["spec"].get("schedulingGroup") or {}).get("podGroupName") == "probe":
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"deploy/workload's MutatingAdmissionPolicy is not enforced {timeout_s:g} s after "
                               "it was applied (is admissionregistration.k8s.io/v1 MutatingAdmissionPolicy on?)")
        time.sleep(0.5)


def render(plain, gang, backend: str) -> str:
    a, b = (gang.tenants[t] for t in ("tenant-a", "tenant-b"))
    pa, pb = (plain.tenants[t] for t in ("tenant-a", "tenant-b"))

    def plain_cell(t):
        return f"never ready: {t.bound_pods_at_deadline}/6 pods, {t.bound_pods_at_deadline * 8} GPUs held"

    def gang_cell(t):
        return f"ready after {t.ready_after_s:.0f} s" if t.ready_after_s else "NOT ready"
    rows = [
        ("", "without raygpu", f"with raygpu ({backend})"),
        ("tenant-a placement group", plain_cell(pa), gang_cell(a)),
        ("tenant-b placement group", plain_cell(pb), gang_cell(b)),
        ("GPUs held by half-placed gangs", f"{plain.gpus_held_by_partial_gangs_at_deadline} of 64 at the deadline",
         f"{gang.max_gpus_held_by_partial_gangs} of 64 at most"),
        ("GPU-seconds held by half-placed gangs", f"{plain.partial_gang_gpu_s:,.0f} in {plain.duration_s:.0f} s",
         f"{gang.partial_gang_gpu_s:,.0f} in {gang.duration_s:.0f} s"),
        ("GPU-seconds held idle (incl. Ray start-up)", f"{plain.idle_gpu_s:,.0f}", f"{gang.idle_gpu_s:,.0f}"),
    ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    lines = [f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    waiting = [t for t in (a, b) if t.pods_bound_while_other_ran is not None]
    verdict = ("\nWithout raygpu both teams hold GPUs and neither can start: a deadlock that lasts until someone "
               "kills a job.\nWith raygpu each placement group is reserved all-or-nothing: one team runs, the other "
               f"waits holding {waiting[0].pods_bound_while_other_ran if waiting else 0} pods, then runs.")
    return "\n".join(lines) + "\n" + verdict


_ = time
