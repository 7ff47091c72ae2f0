"""The ``raygpu`` command line.

    raygpu testbed up|down|status [--json]   the local testbed (real control plane + Ray)
    raygpu demo                               the gang-deadlock demo on the testbed
    raygpu plan ...                           dry-run a gang reservation (no side effects)
    raygpu doctor [--cluster C] [--json]      reconcile Ray / kubelet / NVML views
    raygpu sidecar                            the idle-node reclaimer loop

Exit codes: 0 success, 1 findings or a failed operation, 2 cannot reach the
cluster (no kubeconfig, unreachable, credential refused) / bad usage; each
with one line that says why, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys


COMMANDS = ("testbed", "demo", "plan", "doctor", "sidecar")  # modules of raygpu.commands, in --help order


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree: each ``raygpu.commands.<name>`` module adds its sub-command with ``register(subparsers)``."""
    ap = argparse.ArgumentParser(prog="raygpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"raygpu.commands.{name}").register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (exit 2 on bad usage, before anything is contacted) and run the command."""
    # urllib3 logs each retry of a request as a warning; the command reports the final failure in one line
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
