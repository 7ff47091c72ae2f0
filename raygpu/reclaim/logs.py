"""Structured logs: one line per record, JSON (``--json-logs``) or ``key=value`` text.

Both carry the date and the zone: JSON's ``ts`` in UTC (``2026-12-06T02:07:45.123+00:00``), text lines in
the machine's local zone with its offset (``2026-12-06T03:07:45.123+01:00 INFO cycle ...``), so lines from
sidecars in different zones, or read the next day, still say when they happened.

Call ``log.info(event, extra={"fields": {...}})``; the event is a short fixed
word (``cycle``, ``decision``, ``patch``...), everything variable goes in fields.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from typing import TextIO


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "event": record.getMessage()}
        out.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, sort_keys=False)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = dt.datetime.fromtimestamp(record.created).astimezone().isoformat(timespec="milliseconds")
        fields = " ".join(f"{k}={_short(v)}" for k, v in (getattr(record, "fields", None) or {}).items())
        line = f"{ts} {record.levelname:<7} {record.getMessage()} {fields}".rstrip()
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _short(v: object) -> str:
    s = json.dumps(v, default=str) if isinstance(v, (list, dict, tuple)) else str(v)
    return json.dumps(s) if " " in s else s


def setup(json_logs: bool, level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Send ``raygpu.*`` logs of ``level`` and above to ``stream`` (default stdout), one line per record;
    replaces whatever handler an earlier call set."""
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(JsonFormatter() if json_logs else TextFormatter())
    root = logging.getLogger("raygpu")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
