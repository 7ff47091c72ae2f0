"""Render a DoctorReport for ``raygpu doctor``: a text table or JSON. Strings only, no I/O.

Text layout: one row per GPU node with the Ray / pod / kubelet / NVML counts
side by side, then the findings lowest layer first (each with its evidence
and fix), then the stranded-GPU arithmetic, then the verdict and exit code.
"""

from __future__ import annotations

import json
from typing import Any

from raygpu.model.findings import BlastRadius, DoctorReport, Finding, NodeRow, StrandedReport

_HEADER = ("NODE", "PRODUCT", "RAY", "POD", "KUBELET alloc/cap", "NVML", "FINDINGS")
_VERDICT = {0: "healthy", 1: "findings", 2: "cannot reach the cluster"}


def _n(x: float | None) -> str:
    if x is None:
        return "-"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _row_cells(r: NodeRow) -> tuple[str, ...]:
    nvml = "n/a" if r.nvml_unavailable and r.nvml_gpus is None else _n(r.nvml_gpus)
    if r.nvml_unavailable and r.nvml_gpus is not None:
        nvml += "+n/a"
    return (
        r.node,
        r.product or "-",
        _n(r.ray_gpus),
        _n(r.pod_gpus),
        f"{_n(r.kubelet_allocatable)}/{_n(r.kubelet_capacity)}",
        nvml,
        str(r.findings),
    )


def render_table(rows: tuple[NodeRow, ...]) -> str:
    """The per-node table; text columns left-aligned, counts right-aligned."""
    cells = [_HEADER, *(_row_cells(r) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(_HEADER))]
    lines = []
    for row in cells:
        parts = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        parts += [cell.rjust(w) for cell, w in zip(row[2:], widths[2:])]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def render_finding(i: int, f: Finding) -> str:
    e = f.evidence
    kubelet = f"{_n(e.kubelet)}/{_n(e.kubelet_capacity)}" if e.kubelet_capacity is not None else _n(e.kubelet)
    lines = [
        f"{i:>2}. {f.severity.value.upper():<8} {f.layer.value:<17} {f.kind.value:<22} {f.subject}",
        f"    {f.message}",
        f"    evidence: ray={_n(e.ray)} pod={_n(e.pod)} kubelet={kubelet} nvml={_n(e.nvml)}",
    ]
    lines += [f"      - {fact}" for fact in e.facts]
    lines.append(f"    fix: {f.remedy}")
    return "\n".join(lines)


def render_stranded(s: StrandedReport) -> str:
    lines = [
        f"Stranded GPUs: {_n(round(s.stranded_gpus, 6))} "
        f"(integer model {_n(s.integer_model_gpus)}, cpu/memory {_n(s.cpu_memory_gpus)}, "
        f"fragments {_n(s.fragment_gpus)}); {_n(s.free_gpus)} of {_n(s.allocatable_gpus)} allocatable GPUs free"
    ]
    if s.smallest_pending_gpus:
        pending = ", ".join(f"{k}={_n(v)}" for k, v in sorted(s.smallest_pending_gpus.items()))
        lines.append(f"  smallest pending request: {pending}")
    for node in s.nodes:
        lines += [f"  {node.node}: {reason}" for reason in node.reasons]
    return "\n".join(lines)


def render_blast(b: BlastRadius) -> str:
    """What sits on one unhealthy GPU or node: Ray nodes, placement groups with their jobs, reservations."""
    where = f" (node {b.node})" if b.node and not b.subject.startswith("node/") else ""
    lines = [f"  {b.subject}{where}: {', '.join(k.value for k in b.kinds)}"]
    if not b.ray_nodes:
        lines.append("    no live Ray node on it")
        return "\n".join(lines)
    lines.append(f"    Ray nodes: {', '.join(n[:12] for n in b.ray_nodes)}" + (f" (pods {', '.join(b.pods)})" if b.pods else ""))
    for pg in b.placement_groups:
        name = f" {pg.name}" if pg.name else ""
        lines.append(f"    placement group {pg.pg_id}{name} ({pg.state}, {pg.bundles_there} bundle(s) here)"
                     + (f", job {pg.job_id}" if pg.job_id else ""))
    if not b.placement_groups:
        lines.append("    no placement group has a bundle here")
    if b.jobs:
        lines.append(f"    Ray jobs: {', '.join(b.jobs)}")
    if b.reservations:
        lines.append(f"    gang reservations: {', '.join(b.reservations)}")
    return "\n".join(lines)


def render_text(report: DoctorReport) -> str:
    """The whole report as ``raygpu doctor`` prints it (ends with a newline)."""
    scope = "/".join(x for x in (report.namespace, report.cluster) if x) or "all clusters"
    out = [f"raygpu doctor: {scope} (snapshot taken at {report.taken_at_s:.0f} s)"]
    if report.unreachable:
        out += [f"cannot read {u}" for u in report.unreachable]
    if report.checks_run:  # none ran: Kubernetes could not be read, there is nothing to show
        out.append("checks: " + " -> ".join(report.checks_run))
        out.append("")
        out.append(render_table(report.rows) if report.rows else "no GPU node found")
        out.append("")
        if report.findings:
            out.append(f"Findings ({len(report.findings)}), lowest layer first:")
            out += [render_finding(i, f) for i, f in enumerate(report.findings, 1)]
        elif report.unreachable:
            out.append("No finding in the checks that could run.")
        else:
            out.append("No finding: Ray, pods, kubelet and NVML agree.")
        if report.blast_radius:
            out.append("")
            out.append(f"Blast radius ({len(report.blast_radius)} unhealthy GPU(s) or node(s)):")
            out += [render_blast(b) for b in report.blast_radius]
        out.append("")
        out.append(render_stranded(report.stranded))
    out.append("")
    out.append(f"exit {report.exit_code}: {_VERDICT[report.exit_code]}")
    return "\n".join(out) + "\n"


def report_dict(report: DoctorReport) -> dict[str, Any]:
    """``model_dump(mode="json")`` plus the derived ``exit_code`` and ``healthy``."""
    return {"exit_code": report.exit_code, "healthy": report.healthy, **report.model_dump(mode="json")}


def render_json(report: DoctorReport, indent: int | None = 2) -> str:
    """The report as JSON (``raygpu doctor --json``); ``DoctorReport.model_validate_json`` reads it back."""
    return json.dumps(report_dict(report), indent=indent, sort_keys=False) + "\n"
