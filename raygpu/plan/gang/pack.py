"""First fit of Ray bundles onto identical pods, for ``plan.gang``'s PACK: the lowest-index pod with room.

:class:`FewPods` scans the open pods (cheaper up to ``SMALL`` bundles); :class:`FirstFit` finds the same pod
in O(log n) steps with a max tree per resource. Both open a new pod when none has room, and hold exactly the
floats a plain list of pods would. Pure.
"""

from __future__ import annotations

import math

_EPS = 1e-9

SMALL = 16  # up to this many bundles a plain scan of the pods is cheaper than building the tree


class FewPods:
    """First fit by a plain scan of the open pods: the same pods, the same floats as :class:`FirstFit`."""

    def __init__(self, cap: dict[str, float]) -> None:
        self.cap = cap
        self.left: list[dict[str, float]] = []

    def place(self, amounts: dict[str, float]) -> int:
        for i, left in enumerate(self.left):
            if not any(v > left[r] + _EPS for r, v in amounts.items()):
                break
        else:
            self.left.append(dict(self.cap))
            i = len(self.left) - 1
        left = self.left[i]
        for r, v in amounts.items():
            left[r] -= v
        return i


class FirstFit:
    """First fit over ``count`` pods of capacity ``cap``: the lowest-index pod with room, in O(log n) steps.

    Every pod starts empty, so "no used pod fits: open the next" is the same as
    "the first pod that fits", and the pods used stay a prefix. A max tree per
    resource skips every range of pods in which no pod has enough of one
    resource; the leaves hold exactly the floats a plain list of pods would.
    Pods only fill up, so a bundle equal to one placed on pod ``k`` fits no pod
    before ``k``: the search for it starts at ``k`` (many equal bundles, or room
    split between pods that each lack one resource, cost one pass, not one each).
    """

    def __init__(self, cap: dict[str, float], count: int) -> None:
        self.size = 1 << max(count - 1, 0).bit_length()
        self.tree = {r: [0.0] * self.size + [v] * count + [-math.inf] * (self.size - count) for r, v in cap.items()}
        for t in self.tree.values():
            for i in range(self.size - 1, 0, -1):
                t[i] = max(t[2 * i], t[2 * i + 1])
        self.last: dict[tuple[tuple[str, float], ...], int] = {}  # bundle -> the pod the last equal one went to

    def _from(self, lo: int) -> list[int]:
        """Tree nodes covering pods ``lo..`` as a stack: the leftmost on top."""
        left, right, l, r = [], [], lo + self.size, 2 * self.size
        while l < r:
            if l & 1:
                left.append(l)
                l += 1
            if r & 1:
                r -= 1
                right.append(r)
            l, r = l // 2, r // 2
        return right + left[::-1]

    def place(self, amounts: dict[str, float]) -> int:
        """Put ``amounts`` on the first pod with room (every amount within what is left) and return its index."""
        key = tuple(sorted(amounts.items()))
        need = [(self.tree[r], v) for r, v in amounts.items()]
        stack = self._from(self.last.get(key, 0))
        while stack:
            node = stack.pop()
            if any(v > t[node] + _EPS for t, v in need):
                continue  # no pod under this node has enough of one resource
            if node < self.size:
                stack += (2 * node + 1, 2 * node)  # left first
                continue
            for t, v in need:
                t[node] -= v
                i = node // 2
                while i and t[i] != max(t[2 * i], t[2 * i + 1]):
                    t[i] = max(t[2 * i], t[2 * i + 1])
                    i //= 2
            self.last[key] = node - self.size
            return node - self.size
        raise AssertionError("every bundle fits an empty pod")  # checked by plan_gang before packing
