"""``raygpu plan``: dry-run a gang reservation against a real RayCluster; nothing is created."""

from __future__ import annotations

import argparse
import json
import sys

from raygpu.commands.argtypes import add_request_timeout
from raygpu.errors import InfeasibleError, PermanentError, RayGpuError, TransientError

MAX_COUNT = 10_000  # --count above this is a typo, not a gang


def register(sub) -> None:
    p = sub.add_parser("plan", help="dry-run a gang reservation (no side effects)",
                       description="Read RayCluster NAMESPACE/CLUSTER and print which worker pods a placement group "
                                   "of BUNDLES would reserve, with which gang backend. Writes nothing.",
                       epilog='gang backends (--backend), what makes the reserved pods all-or-nothing:\n'
                              '  coscheduling  a scheduler-plugins PodGroup (scheduling.x-k8s.io/v1alpha1);\n'
                              '                pods go to --scheduler-name (default: the RayCluster\'s\n'
                              '                raygpu.io/gang-scheduler-name, else scheduler-plugins-scheduler)\n'
                              '  kueue         a Kueue plain-pod group, admitted whole; needs --queue or\n'
                              '                raygpu.io/queue\n'
                              '  volcano       a Volcano PodGroup (scheduling.volcano.sh/v1beta1); schedulerName\n'
                              '                volcano\n'
                              '  workload      a Kubernetes Workload + PodGroup (scheduling.k8s.io, Kubernetes\n'
                              '                >= 1.36, gate GenericWorkload) for the default kube-scheduler;\n'
                              '                with KubeRay < 1.7 also deploy/workload\'s admission policy\n'
                              '  none          the reservation\'s worker group alone: one atomic scale-up, no\n'
                              '                Kubernetes gang (the default)\n\n'
                              'example: raygpu plan --cluster tenant-a -n team-a --bundle GPU=8,CPU=8 --count 6 '
                              '--strategy STRICT_SPREAD\n\nexit codes: 0 a plan, 1 infeasible, 2 bad input (checked '
                              'before connecting), an invalid RayCluster, or cannot reach the cluster',
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", required=True, help="RayCluster name")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--bundle", action="append", required=True,
                   help='one bundle as RES=AMOUNT[,RES=AMOUNT], e.g. "GPU=8,CPU=8"; repeat for more')
    p.add_argument("--count", type=_count, default=1, help="repeat the bundle list this many times (default 1)")
    p.add_argument("--strategy", default="PACK", help="PACK | SPREAD | STRICT_PACK | STRICT_SPREAD")
    p.add_argument("--backend", default=None, metavar="BACKEND",
                   help="coscheduling | kueue | volcano | workload | none (default: the RayCluster's "
                        "raygpu.io/gang-backend annotation, else none); each explained below")
    p.add_argument("--queue", default=None,
                   help="Kueue LocalQueue or Volcano queue (default: the RayCluster's raygpu.io/queue annotation)")
    p.add_argument("--scheduler-name", default=None, metavar="NAME",
                   help="backend coscheduling: the schedulerName the pods ask for, the scheduler profile running "
                        "the Coscheduling plugin (default: the RayCluster's raygpu.io/gang-scheduler-name "
                        "annotation, else scheduler-plugins-scheduler)")
    p.add_argument("--kubeconfig", default=None)
    add_request_timeout(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 1 <= n <= MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be between 1 and {MAX_COUNT}, got {n}")
    return n


def parse_bundle(text: str) -> dict[str, float]:
    """``"GPU=8,CPU=8"`` -> {"GPU": 8.0, "CPU": 8.0}; PermanentError unless every amount is finite and > 0."""
    from raygpu.model.gang import check_bundle
    out = {}
    for part in text.split(","):
        key, eq, val = part.partition("=")
        if not eq or not key.strip():
            raise PermanentError(f"bundle item {part!r} is not RES=AMOUNT")
        try:
            out[key.strip()] = float(val)
        except ValueError:
            raise PermanentError(f"bundle item {part!r}: {val!r} is not a number") from None
    return check_bundle(out)


def _fail(code: int, message: str) -> int:
    print(f"raygpu plan: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """Print the plan (0), or why there is none: infeasible (1), or one line and 2 for bad input, an
    invalid or unknown RayCluster, a refused credential or an unreachable cluster. Input is checked
    before anything is contacted."""
    from raygpu.gang.requests import plan_placement_group
    from raygpu.model.gang import Backend, Strategy, parse_enum, parse_scheduler_name
    try:
        bundles = [parse_bundle(b) for b in args.bundle] * args.count
        parse_enum(Strategy, args.strategy, "placement strategy")
        backend = None if args.backend is None else parse_enum(Backend, args.backend, "gang backend")
        if args.scheduler_name is not None:
            parse_scheduler_name(args.scheduler_name)
            if backend not in (None, Backend.COSCHEDULING):
                raise PermanentError(f"--scheduler-name names the scheduler of backend coscheduling, not of "
                                     f"backend {backend.value}")
    except PermanentError as e:
        return _fail(2, str(e))
    except ValueError as e:
        return _fail(2, f"--scheduler-name {args.scheduler_name!r}: {e}")
    try:
        plan = plan_placement_group(bundles, args.strategy, cluster=args.cluster, namespace=args.namespace,
                                    backend=args.backend, queue=args.queue, kubeconfig=args.kubeconfig,
                                    request_timeout_s=args.request_timeout, scheduler_name=args.scheduler_name)
    except InfeasibleError as e:
        print(json.dumps({"feasible": False, "error": str(e), "bundle_index": e.bundle_index,
                          "resource": e.resource, "requested": e.requested, "limit": e.limit}) if args.json
              else f"infeasible: {e}", file=sys.stdout if args.json else sys.stderr)
        return 1
    except TransientError as e:
        return _fail(2, f"cannot reach the cluster: {e}")
    except RayGpuError as e:
        return _fail(2, str(e))
    if args.json:
        print(plan.model_dump_json(indent=2))
        return 0
    n = plan.need
    print(f"plan for {plan.namespace}/{plan.cluster}: {len(bundles)} bundles, {plan.strategy.value}")
    print(f"  reserve {n.pod_count} pod(s) of worker group '{n.template_group}' as new group "
          f"'{plan.reservation_group}', backend {plan.backend.value}" + (f", queue {plan.queue}" if plan.queue else "")
          + (f", scheduler {plan.scheduler_name}" if plan.scheduler_name else ""))
    print(f"  per pod: Kubernetes {n.k8s_requests}  Ray {n.ray_resources}")
    for i in range(n.pod_count):
        print(f"  pod {i}: bundles {list(plan.bundles_on_pod(i))}")
    print(f"  why: {plan.reason}")
    for note in plan.notes:
        print(f"  note: {note}")
    return 0
