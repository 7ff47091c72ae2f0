"""The ``raygpu`` command line.

    raygpu --version                          the installed version (package metadata)
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

import raygpu

COMMANDS = ("testbed", "demo", "plan", "doctor", "sidecar")  # modules of raygpu.commands, in --help order


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree: each ``raygpu.commands.<name>`` module adds its sub-command with ``register(subparsers)``."""
    ap = argparse.ArgumentParser(prog="raygpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=version_line(),
                    help="print raygpu's version (from the installed package's metadata) and exit")
    sub = ap.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"raygpu.commands.{name}").register(sub)
    return ap


def version_line() -> str:
    """``raygpu <version>``; from a source tree with no installed metadata, ``raygpu 0+unknown`` and why."""
    if raygpu.__version__ == raygpu.VERSION_UNKNOWN:
        return (f"raygpu {raygpu.VERSION_UNKNOWN} (no installed package metadata: this is a source tree; "
                f"pip install it to have a version)")
    return f"raygpu {raygpu.__version__}"


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (exit 2 on bad usage, before anything is contacted) and run the command."""
    # urllib3 logs each retry of a request as a warning; the command reports the final failure in one line
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
