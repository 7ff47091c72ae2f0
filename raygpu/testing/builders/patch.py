"""The one RFC 6902 JSON-patch applier of the tests and benchmarks: what the API server does with raygpu's patches."""

from __future__ import annotations

import copy
from typing import Any


class PatchTestFailed(Exception):
    """A JSON patch ``test`` op did not match: the API server answers 422 and applies nothing."""


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply RFC 6902 ``test``/``add``/``remove``/``replace`` ops to a copy of ``doc``, all or nothing.

    Small and strict like the API server: a missing parent or member is an error.
    """
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            idx = len(node) if last == "-" else int(last)
            if op["op"] == "test":
                if node[idx] != op["value"]:
                    raise PatchTestFailed(f"{op['path']}: {node[idx]!r} != {op['value']!r}")
            elif op["op"] == "add":
                node.insert(idx, copy.deepcopy(op["value"]))
            elif op["op"] == "remove":
                del node[idx]
            else:
                node[idx] = copy.deepcopy(op["value"])
        else:
            if op["op"] == "test":
                if last not in node or node[last] != op["value"]:  # a test of a missing member fails too
                    raise PatchTestFailed(f"{op['path']}: {node.get(last)!r} != {op['value']!r}")
            elif op["op"] == "add":
                node[last] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del node[last]
            else:
                if last not in node:
                    raise KeyError(op["path"])  # replace needs the member to exist
                node[last] = copy.deepcopy(op["value"])
    return out
