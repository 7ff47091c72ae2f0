"""The ``raygpu`` command line.

    raygpu --version                          the installed version (package metadata)
    raygpu [--log-level LEVEL] COMMAND ...   debug | info | warning | error (before or after COMMAND)
    raygpu testbed up|down|status [--json]   the local testbed (real control plane + Ray)
    raygpu demo                               the gang-deadlock demo on the testbed
    raygpu plan ...                           dry-run a gang reservation (no side effects)
    raygpu doctor [--cluster C] [--json]      reconcile Ray / kubelet / NVML views
    raygpu sidecar                            the idle-node reclaimer loop

--log-level: raygpu's own log records (loggers raygpu.*) of LEVEL and above go
to stderr, one dated line each (the sidecar: to stdout, default info).
Without it a command prints only its output and warnings.

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
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
LOG_LEVEL_HELP = "log records of raygpu.* at LEVEL and above: " + " | ".join(LOG_LEVELS)


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree: each ``raygpu.commands.<name>`` module adds its sub-command with ``register(subparsers)``."""
    ap = argparse.ArgumentParser(prog="raygpu", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=version_line(),
                    help="print raygpu's version (from the installed package's metadata) and exit")
    ap.add_argument("--log-level", type=log_level, default=None, metavar="LEVEL", help=LOG_LEVEL_HELP)
    sub = ap.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"raygpu.commands.{name}").register(sub)
    _log_level_everywhere(sub)
    return ap


def log_level(text: str) -> int:
    """``--log-level``'s value: a level name, any case, as a ``logging`` level; argparse says why not (exit 2)."""
    try:
        return LOG_LEVELS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}") from None


def _log_level_everywhere(sub: argparse._SubParsersAction) -> None:
    """``--log-level`` after the sub-command too (``raygpu plan --log-level debug ...``), at every depth; given
    there, it overrides the top-level one (SUPPRESS: left out, it leaves the top-level value alone)."""
    for parser in sub.choices.values():
        parser.add_argument("--log-level", type=log_level, default=argparse.SUPPRESS, metavar="LEVEL",
                            help=LOG_LEVEL_HELP)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _log_level_everywhere(action)


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
    if args.log_level is not None:  # the sidecar sets its own handler (stdout, JSON or text) at this level
        from raygpu.reclaim import logs
        logs.setup(json_logs=False, level=args.log_level, stream=sys.stderr)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
