"""Exit 1 (listing them) if any testbed process is still running: a component
binary from the build cache, or a Ray process the bridge started."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from raygpu.testing.bridge import MARKER_ENV
from raygpu.testing.components import cache_dir


def leftovers() -> list[str]:
    bin_dir = str(cache_dir() / "bin")
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            exe = os.readlink(p / "exe")
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if exe.startswith(bin_dir) or any(e.startswith(MARKER_ENV.encode() + b"=") for e in env):
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            found.append(f"pid {p.name}: {cmd}")
    return found


if __name__ == "__main__":
    left = leftovers()
    for line in left:
        print(f"left running: {line}", file=sys.stderr)
    print(f"testbed leftovers: {len(left)} processes")
    sys.exit(1 if left else 0)
