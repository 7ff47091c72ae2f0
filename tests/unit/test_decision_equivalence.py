"""The three planners decide exactly as the golden files say (issue 10 item 1: faster, not different).

Each case of ``tests/unit/golden/*.jsonl.gz`` (see ``golden_decisions.py``: the table tests' inputs, the
benchmark's synthetic snapshots at small sizes, seeded random reclaimer worlds) is planned again and its
whole output, errors included, compared with the recorded one. Regenerate the files only for an intended
behaviour change: ``.venv/bin/python -m tests.unit.golden_decisions``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from golden_decisions import PLANNERS, canon, decode_args, load, run_case  # noqa: E402

from raygpu.errors import PermanentError  # noqa: E402
from raygpu.plan.gang.reservation import gang_templates, plan_gang  # noqa: E402

CASES = [(planner, case) for planner in PLANNERS for case in load(planner)]


def test_golden_files_cover_every_planner_and_source():
    names = {planner: [c["name"] for c in load(planner)] for planner in PLANNERS}
    for planner in PLANNERS:
        assert any(n.startswith("test:") for n in names[planner]), planner
    assert any(n.startswith("bench:") and "pending PGs" in n for n in names["plan_reclaim"])
    assert sum(n.startswith("competing world") for n in names["plan_reclaim"]) >= 100
    assert any("error" in c["output"] for c in load("plan_gang"))  # errors are compared too


@pytest.mark.parametrize("planner, case", CASES, ids=[f"{p}:{c['name']}" for p, c in CASES])
def test_same_output_as_before(planner, case):
    got = run_case(planner, case["input"])
    # compared as JSON text, so that 8 and 8.0 differ (a model built without validation could give the int)
    want, have = (json.dumps(x, indent=1, sort_keys=True).splitlines() for x in (case["output"], got))
    if want != have:
        first = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
        pytest.fail(f"{planner} {case['name']}: output differs from the golden file at line {first}:\n"
                    f"  golden: {want[first] if first < len(want) else '<end>'}\n"
                    f"  now:    {have[first] if first < len(have) else '<end>'}")


def test_gang_templates_computed_once_give_the_same_plans():
    """plan_gang(..., templates=gang_templates(cluster)) decides every golden case as plan_gang alone did."""
    for case in load("plan_gang"):
        args = decode_args("plan_gang", case["input"])
        try:
            got = canon(plan_gang(**args, templates=gang_templates(args["cluster"])))
        except Exception as e:  # noqa: BLE001 - the same error, at the same step
            got = {"error": type(e).__name__, "message": str(e), "attrs": {k: canon(v) for k, v in sorted(vars(e).items())}}
        assert got == case["output"], case["name"]


def test_gang_templates_of_another_cluster_are_refused():
    case = next(c for c in load("plan_gang") if "error" not in c["output"])
    args = decode_args("plan_gang", case["input"])
    other = args["cluster"].model_copy(update={"name": "other"})
    with pytest.raises(PermanentError, match="templates were computed for RayCluster default/other"):
        plan_gang(**args, templates=gang_templates(other))
