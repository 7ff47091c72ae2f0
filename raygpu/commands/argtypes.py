"""argparse ``type=`` checkers for the numeric options of every command.

Each returns the parsed value or raises ``argparse.ArgumentTypeError`` with
the reason, so a bad value is one clear line and exit 2 before anything is
contacted. Not a command: ``raygpu.cli`` registers only ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

MAX_SECONDS = 366 * 24 * 3600.0  # a year: anything longer is a typo (and keeps float arithmetic exact enough)


def seconds(*, minimum: float = 0.0, inclusive: bool = True, maximum: float = MAX_SECONDS) -> Callable[[str], float]:
    """A duration in seconds: finite, ``>= minimum`` (``> minimum`` when not ``inclusive``), ``<= maximum``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text!r}")
        low_ok = value >= minimum if inclusive else value > minimum
        if not low_ok or value > maximum:
            raise argparse.ArgumentTypeError(
                f"must be {'>=' if inclusive else '>'} {minimum:g} and <= {maximum:g} seconds, got {text!r}")
        return value
    return parse


def add_request_timeout(parser: argparse.ArgumentParser) -> None:
    """``--request-timeout SECONDS``: the deadline of the first contact with Kubernetes (the kubeconfig's exec
    credential plugin, then API discovery), as kubectl's flag of that name; ``args.request_timeout`` (None: the
    adapter's default, ``$RAYGPU_REQUEST_TIMEOUT_S`` else 15 s)."""
    from raygpu.adapters.kube import FIRST_CONTACT_TIMEOUT_S, MAX_FIRST_CONTACT_TIMEOUT_S, REQUEST_TIMEOUT_ENV
    parser.add_argument(
        "--request-timeout", type=seconds(minimum=0.0, inclusive=False, maximum=MAX_FIRST_CONTACT_TIMEOUT_S),
        default=None, metavar="SECONDS",
        help=f"give up on the first contact with Kubernetes (the kubeconfig's exec credential plugin, then API "
             f"discovery) after this long, exit 2 with the reason: finite, > 0, <= {MAX_FIRST_CONTACT_TIMEOUT_S:g} "
             f"(default ${REQUEST_TIMEOUT_ENV}, else {FIRST_CONTACT_TIMEOUT_S:g})")


def port(text: str) -> int:
    """A TCP port 0..65535 (0: disabled, where the option says so)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value
