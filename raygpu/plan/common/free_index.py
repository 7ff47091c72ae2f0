"""Free Ray capacity bucketed by shape, so that a bundle finds its node without scanning every node.

Nodes with the same labels and the same free resources are interchangeable for
a bundle: a :class:`FreeIndex` keeps one bucket per such shape, and in each
bucket the nodes that stay (``free`` role) by node id and the idle candidates
(``cand`` role) per worker group by the planner's preference. A query checks
each bucket once (fit and label selectors) and reads the best node of each
fitting bucket from the top of a heap, so its cost grows with the number of
distinct shapes, not with the number of nodes. Entries are never removed from
a heap; an entry counts while its node is still in that bucket with that role,
and is dropped when it surfaces after the node moved (its free resources or
its role changed).

Pure helpers, no I/O; shared by the pending-placement-group simulation
(``plan.pending``) and its exact search (``plan.placement``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

EPS = 1e-9
FREE, CAND = "free", "cand"


def fits(demand: Mapping[str, float], have: Mapping[str, float]) -> bool:
    """Every positive demand is covered by ``have`` (missing keys count as 0)."""
    for k, v in demand.items():  # a plain loop, no generator per call: asked per bundle, node and search step
        if v > 0 and not have.get(k, 0.0) + EPS >= v:
            return False
    return True


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Ray label-selector semantics: ``v``, ``!v``, ``in(a,b)``, ``!in(a,b)``."""
    for key, want in selector.items():
        negate = want.startswith("!")
        expr = want[1:] if negate else want
        have = labels.get(key)
        if expr.startswith("in(") and expr.endswith(")"):
            ok = have in {v.strip() for v in expr[3:-1].split(",")}
        else:
            ok = have == expr
        if ok == negate:
            return False
    return True


def matches_all(selectors: list[dict[str, str]], labels: dict[str, str]) -> bool:
    for s in selectors:  # a plain loop, as in ``fits``
        if not matches(s, labels):
            return False
    return True


@dataclass
class _Bucket:
    key: tuple
    labels: dict[str, str]
    free: dict[str, float]
    live: int = 0
    free_heap: list[str] = field(default_factory=list)  # node ids
    cand_heaps: dict[str, list[tuple[tuple, str]]] = field(default_factory=dict)  # group -> (rank, node id)
    takes: dict[int, bool] = field(default_factory=dict)  # demand shape id -> fits and matches (see buckets)
    # id of a demand ``less`` took from a node of this bucket -> [that demand (held: the id stays its own),
    # what it leaves of the free resources, the bucket key of what it leaves, the bucket the node went to];
    # this index's own (a copy starts without: its buckets are other objects)
    after: dict[int, list] = field(default_factory=dict)


class FreeIndex:
    """Nodes by shape (labels, free resources) and role; see the module docstring.

    ``add``/``move`` place a node (``less``: on its free resources less a demand, ``set_role``: on them as they
    are); ``best_free`` and ``best_cands`` answer "which node of this role takes this demand", honouring an
    exclusion set (small: the nodes of one placement group), and ``pick`` asks both of every bucket at once. A heap entry is
    current while its node is in that bucket with that role; a node that comes back to a bucket may
    have two current entries there, which changes no answer (the same node, the same rank). Per node the
    index keeps no object of its own but its candidate rank entry: a node points at its bucket object (which
    is how an entry is judged current: no key hashed), free heaps hold the node ids themselves (at 20,000
    Ray nodes a cycle builds it twice).
    """

    def __init__(self) -> None:
        self._buckets: dict[tuple, _Bucket] = {}
        self._where: dict[str, _Bucket] = {}  # node id -> the bucket it is in (a live one: it holds the node)
        self.labels: dict[str, dict[str, str]] = {}
        self._label_key: dict[str, tuple] = {}  # node id -> its labels sorted, computed once
        self.free: dict[str, dict[str, float]] = {}
        self.role: dict[str, str] = {}
        self.group: dict[str, str] = {}
        self.rank: dict[str, tuple] = {}
        # (demand items, selectors' items) -> a small id, for the buckets' memo of what their shape takes:
        # facts about a shape, so shared with every copy (as the buckets' memos are)
        self._shape_ids: dict[tuple, int] = {}
        # (free key, demand items) -> (free less demand, its key): nodes of one bucket have equal free
        # resources, so what a demand leaves of them is worked out once (a fact, shared with every copy)
        self._less: dict[tuple, tuple[dict[str, float], tuple]] = {}

    @classmethod
    def build(cls, rows: Iterable[tuple[str, dict[str, str], dict[str, float], str, str, tuple, tuple[tuple, tuple]]]
              ) -> "FreeIndex":
        """An index of ``rows`` (node id, labels, free, role, group, rank, (labels sorted, free sorted)), in
        node id order, each node new: what ``add`` of each row in turn gives (the same nodes, buckets and
        heap entries), in one loop, each heap made at once."""
        out = cls()
        buckets, where, labels_of, label_key_of = out._buckets, out._where, out.labels, out._label_key
        group_of, rank_of, free_of, role_of = out.group, out.rank, out.free, out.role
        for nid, labels, free, role, group, rank, (label_key, free_key) in rows:
            labels_of[nid], label_key_of[nid], group_of[nid], rank_of[nid] = labels, label_key, group, rank
            free_of[nid], role_of[nid] = free, role
            key = (label_key, free_key)
            bucket = buckets.get(key)
            if bucket is None:
                bucket = buckets[key] = _Bucket(key, labels, free)
            bucket.live += 1
            where[nid] = bucket
            if role == FREE:
                bucket.free_heap.append(nid)
            else:
                bucket.cand_heaps.setdefault(group, []).append((rank, nid))
        for bucket in buckets.values():
            heapq.heapify(bucket.free_heap)  # already one when the rows come in node id order
            for heap in bucket.cand_heaps.values():
                heapq.heapify(heap)
        return out

    def add(self, node_id: str, labels: dict[str, str], free: dict[str, float], role: str,
            group: str = "", rank: tuple = (), keys: tuple[tuple, tuple] | None = None) -> None:
        """Place a new node. ``labels`` and ``free`` are kept, not copied: nothing here changes them.
        ``keys``: their items sorted (``shape_key``), when the caller has them already."""
        self.labels[node_id] = labels
        self._label_key[node_id] = keys[0] if keys is not None else tuple(sorted(labels.items()))
        self.group[node_id] = group
        self.rank[node_id] = rank
        self.move(node_id, free, role, keys[1] if keys is not None else None)

    def move(self, node_id: str, free: dict[str, float], role: str, free_key: tuple | None = None) -> None:
        """Give ``node_id`` new free resources and role (its old heap entries go stale); ``free_key``: the
        items of ``free`` sorted, when the caller has them."""
        key = (self._label_key[node_id], free_key if free_key is not None else tuple(sorted(free.items())))
        self._move(node_id, free, role, key, None)

    def _move(self, node_id: str, free: dict[str, float], role: str, key: tuple, hint: _Bucket | None) -> _Bucket:
        """``move`` to the bucket of ``key``; ``hint``: a bucket of that key some node went to before, used
        when it is still live (a live bucket is the one of its key: it is deleted when its last node leaves).
        Returns the node's bucket."""
        old = self._where.get(node_id)
        if old is not None:
            old.live -= 1
            if old.live == 0:
                del self._buckets[old.key]
        self.free[node_id] = free
        self.role[node_id] = role
        if hint is not None and hint.live:
            bucket = hint
        else:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(key, self.labels[node_id], free)
        bucket.live += 1
        self._where[node_id] = bucket
        if role == FREE:
            heapq.heappush(bucket.free_heap, node_id)
        else:
            heapq.heappush(bucket.cand_heaps.setdefault(self.group[node_id], []), (self.rank[node_id], node_id))
        return bucket

    def free_key(self, node_id: str) -> tuple:
        """The items of the node's free resources sorted, as its bucket keys them (``move``'s ``free_key``)."""
        return self._where[node_id].key[1]

    def copy(self) -> "FreeIndex":
        """An independent copy (cheaper than adding every node again: nothing is re-sorted)."""
        out = FreeIndex()
        out._buckets = {k: _Bucket(b.key, b.labels, b.free, b.live, list(b.free_heap),
                                   {g: list(h) for g, h in b.cand_heaps.items()}, b.takes)
                        for k, b in self._buckets.items()}
        copy_of = {id(b): out._buckets[k] for k, b in self._buckets.items()}  # each bucket -> its copy
        out._where = dict(zip(self._where, map(copy_of.__getitem__, map(id, self._where.values()))))
        out._shape_ids, out._less = self._shape_ids, self._less
        out._label_key = dict(self._label_key)
        out.labels, out.free, out.role = dict(self.labels), dict(self.free), dict(self.role)
        out.group, out.rank = dict(self.group), dict(self.rank)
        return out

    def buckets(self, demand: dict[str, float], selectors: list[dict[str, str]], shape: tuple | None = None):
        """The live buckets whose shape takes ``demand`` and matches every selector.

        A bucket's shape never changes, so each bucket judges each demand shape once (``_Bucket.takes``):
        a query costs one look per bucket, not a fit and a selector match. ``shape``: ``demand_shape(demand,
        selectors)`` when the caller has it."""
        key = demand_shape(demand, selectors) if shape is None else shape
        sid = self._shape_ids.get(key)
        if sid is None:
            sid = self._shape_ids[key] = len(self._shape_ids)
        out = []
        for b in self._buckets.values():
            ok = b.takes.get(sid)
            if ok is None:
                ok = b.takes[sid] = fits(demand, b.free) and matches_all(selectors, b.labels)
            if ok and b.live:
                out.append(b)
        return out

    def set_role(self, node_id: str, role: str) -> None:
        """``move`` to ``role`` on the node's free resources as they are."""
        self.move(node_id, self.free[node_id], role, self._where[node_id].key[1])

    def set_roles(self, node_ids: Iterable[str], role: str) -> None:
        """``set_role`` of each node, all at once: every node stays in its bucket (its free resources, and so
        its bucket's key, do not change) with a new entry in the heap of ``role``, and each heap that got
        entries is made a heap once (the same current entries as one ``set_role`` after another: the same
        answers)."""
        where, roles, group_of, rank_of = self._where, self.role, self.group, self.rank
        touched: dict[int, list] = {}  # id -> each heap that got entries
        for node_id in node_ids:
            roles[node_id] = role
            bucket = where[node_id]
            if role == FREE:
                heap = bucket.free_heap
                heap.append(node_id)
            else:
                heap = bucket.cand_heaps.setdefault(group_of[node_id], [])
                heap.append((rank_of[node_id], node_id))
            touched[id(heap)] = heap
        for heap in touched.values():
            heapq.heapify(heap)

    def less(self, node_id: str, demand: dict[str, float], role: str | None = None) -> None:
        """``move`` the node to its free resources less ``demand`` (per resource of either, a missing one
        counting 0), to ``role`` (None: its own). What is left is worked out once per (free resources,
        demand): free maps are never changed in place, so the nodes of one bucket share it."""
        old = self._where[node_id]
        step = old.after.get(id(demand))
        if step is None or step[0] is not demand:  # first time from this bucket: the shared fact, then kept here
            free_key = old.key[1]
            key = (free_key, tuple(demand.items()))
            got = self._less.get(key)
            if got is None:
                free = self.free[node_id]
                left = {k: free.get(k, 0.0) - demand.get(k, 0.0) for k in set(free) | set(demand)}
                got = self._less[key] = (left, tuple(sorted(left.items())))
            step = old.after[id(demand)] = [demand, got[0], (self._label_key[node_id], got[1]), None]
        step[3] = self._move(node_id, step[1], self.role[node_id] if role is None else role, step[2], step[3])

    def pick(self, demand: dict[str, float], selectors: list[dict[str, str]], skip: set[str] | frozenset[str],
             spare: dict[str, int], shape: tuple | None = None) -> tuple[str | None, bool]:
        """(node, is a candidate) for a bundle of ``demand`` and ``selectors``, not in ``skip``: of the buckets
        that take it, the node of role ``free`` with the fewest free GPUs, then the lowest id; else the
        candidate of the least (its group's ``spare`` <= 0, rank); (None, False) when none takes it.

        ``best_free`` and ``best_cands`` over ``buckets``, in one pass (``plan.pending``'s simulation asks once
        per bundle); candidates are not looked at once a node of role ``free`` is found."""
        best_free = best_cand = None
        group_of, where, role = self.group, self._where, self.role
        for b in self.buckets(demand, selectors, shape):
            # the usual heap top is current and not skipped: read here, the heap's walk only when it is not
            heap = b.free_heap
            if not heap:
                nid = None
            elif where.get(nid := heap[0]) is not b or role[nid] != FREE or nid in skip:
                nid = self._top_free(b, skip)
            if nid is not None:
                key = (b.free.get("GPU", 0.0), nid)
                if best_free is None or key < best_free:
                    best_free = key
            elif best_free is None:
                for g, heap in b.cand_heaps.items():
                    if not heap:
                        continue
                    top = heap[0]
                    node = top[1]
                    if where.get(node) is not b or role[node] != CAND or group_of[node] != g or node in skip:
                        top = self._top_cand(b, heap, g, skip)
                    if top is not None:
                        key = (spare[group_of[top[1]]] <= 0, top[0])
                        if best_cand is None or key < best_cand[0]:
                            best_cand = (key, top[1])
        if best_free is not None:
            return best_free[1], False
        if best_cand is not None:
            return best_cand[1], True
        return None, False

    def _current(self, bucket: _Bucket, node: str, role: str) -> bool:
        return self._where.get(node) is bucket and self.role[node] == role

    def best_free(self, bucket: _Bucket, skip: set[str] | frozenset[str]) -> str | None:
        """The lowest node id of the bucket's free role not in ``skip``."""
        return self._top_free(bucket, skip)

    def best_cands(self, bucket: _Bucket, skip: set[str] | frozenset[str]) -> list[tuple[tuple, str]]:
        """Per group, the most preferred candidate of the bucket not in ``skip``: [(rank, node id)]."""
        out = []
        for group, heap in bucket.cand_heaps.items():
            top = self._top_cand(bucket, heap, group, skip)
            if top:
                out.append(top)
        return out

    def cands(self, bucket: _Bucket) -> list[str]:
        """Every candidate of the bucket (one pass over its heaps)."""
        return sorted({e[1] for g, heap in bucket.cand_heaps.items() for e in heap
                       if self._current(bucket, e[1], CAND) and self.group[e[1]] == g})

    def _top_free(self, bucket: _Bucket, skip: set[str] | frozenset[str]) -> str | None:
        """The first current entry of the bucket's free heap not in ``skip`` (stale entries are dropped)."""
        heap, where, role = bucket.free_heap, self._where, self.role
        held = []
        found = None
        while heap:
            node = heap[0]
            if where.get(node) is not bucket or role[node] != FREE:
                heapq.heappop(heap)  # stale: the node moved since
            elif node in skip:
                held.append(heapq.heappop(heap))
            else:
                found = node
                break
        for entry in held:
            heapq.heappush(heap, entry)
        return found

    def _top_cand(self, bucket: _Bucket, heap: list[tuple[tuple, str]], group: str,
                  skip: set[str] | frozenset[str]) -> tuple[tuple, str] | None:
        """The first current entry (rank, node id) of the bucket's candidate heap of ``group`` not in ``skip``
        (stale entries are dropped)."""
        where, role, group_of = self._where, self.role, self.group
        held = []
        found = None
        while heap:
            entry = heap[0]
            node = entry[1]
            if where.get(node) is not bucket or role[node] != CAND or group_of[node] != group:
                heapq.heappop(heap)  # stale: the node moved since
            elif node in skip:
                held.append(heapq.heappop(heap))
            else:
                found = entry
                break
        for entry in held:
            heapq.heappush(heap, entry)
        return found


def demand_shape(demand: dict[str, float], selectors: list[dict[str, str]]) -> tuple:
    """A bundle's demand and label selectors as one hashable key (their items as they come)."""
    return tuple(demand.items()), tuple(map(tuple, map(dict.items, selectors)))
