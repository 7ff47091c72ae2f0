"""NodeRow.typed_many / NodeStranded.typed_many (reconcile's one row per GPU node, built without validation)
give the validated models, state for state, on every golden and random snapshot's rows (issue 10)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from golden_decisions import decode_args, load  # noqa: E402
from test_reconcile_random import NOW_S, random_snapshot  # noqa: E402

from raygpu.model.findings import NodeRow, NodeStranded  # noqa: E402
from raygpu.plan.doctor.reconcile import reconcile  # noqa: E402


def _same_as_validated(model) -> None:
    slow = type(model).model_validate(dict(model.__dict__))
    assert model.__getstate__() == slow.__getstate__() and list(model.__dict__) == list(slow.__dict__)
    # JSON text: a value of the wrong type (8 for 8.0, a list for a tuple) would differ here
    assert model.model_dump_json() == slow.model_dump_json() and hash(model) == hash(slow)
    for name, value in model.__dict__.items():
        assert type(value) is type(slow.__dict__[name]), name
    changed = model.model_copy(update={"node": "x"})
    assert changed == slow.model_copy(update={"node": "x"}) and changed.model_fields_set == set(type(model).model_fields)


def test_typed_rows_equal_the_validated_ones():
    reports = [reconcile(**decode_args("reconcile", case["input"])) for case in load("reconcile")]
    reports += [reconcile(random_snapshot(seed), NOW_S) for seed in range(60)]
    rows = [r for rep in reports for r in rep.rows]
    stranded = [n for rep in reports for n in rep.stranded.nodes]
    assert len(rows) > 200 and len(stranded) > 200
    assert any(r.nvml_gpus is not None for r in rows) and any(n.reasons for n in stranded)
    for model in rows + stranded:
        _same_as_validated(model)


def test_typed_many_is_validated_construction_in_field_order():
    row = NodeRow.typed_many([("n1", None, 8.0, 4.0, 8.0, 8.0, 3, True, 2)])[0]
    assert row == NodeRow(node="n1", ray_gpus=8.0, pod_gpus=4.0, kubelet_capacity=8.0, kubelet_allocatable=8.0,
                          nvml_gpus=3, nvml_unavailable=True, findings=2)
    st = NodeStranded.typed_many([("n1", 8.0, 6.0, 2.0, 0.5, 0.0, 2.0, 1.0, 2.0, ("why",))])[0]
    assert st == NodeStranded(node="n1", allocatable_gpus=8.0, requested_gpus=6.0, free_gpus=2.0, integer_model_gpus=0.5,
                              fragment_gpus=2.0, free_cpu=1.0, free_memory_bytes=2.0, reasons=("why",))
    assert st.stranded_gpus == 2.5
    _same_as_validated(row)
    _same_as_validated(st)
