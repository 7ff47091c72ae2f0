"""The Kubernetes adapter: the only code that talks to the API server.

Promises:

* Every object that leaves this module is parsed into a frozen model
  (``RayClusterView``, ``K8sPodView``, ``K8sNodeView``) or is a plain dict the
  caller asked for by name (gang objects it built itself).
* Client exceptions become typed raygpu errors (see ``raygpu.errors``):
  404 -> ``NotFoundError``, 401/403 -> ``ForbiddenError`` (a 403 names the
  missing permission: verb, resource, namespace), 422 ->
  ``InvalidError`` (all PermanentErrors), 409 and failed JSON-patch ``test``
  ops -> ``ConflictError``, 5xx and connection failures or timeouts ->
  ``TransientError``; any other status -> ``PermanentError``.
* ``patch_raycluster`` only sends JSON patches whose first op tests
  ``metadata.resourceVersion``: it never overwrites a concurrent change.
* Every request has a deadline, API discovery included (``REQUEST_TIMEOUT``
  per attempt unless the caller passes its own, as the watch cache does): a
  server that accepts and never answers gives a ``TransientError``, never a
  thread blocked for good.
* The first contact (loading the kubeconfig, which runs its exec credential
  plugin, then API discovery) ends within one deadline, ``first_contact_timeout_s``
  (default ``FIRST_CONTACT_TIMEOUT_S``, 15 s; ``$RAYGPU_REQUEST_TIMEOUT_S``; the
  CLIs' ``--request-timeout``), else a ``TransientError`` that says which step
  hung. A credential refresh that runs the exec plugin again has the same bound.
* One object that does not parse never hides the others: a bad value takes a
  safe default and is recorded in the view's ``problems`` (and logged); an
  object that cannot be parsed at all is skipped with a warning naming it.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import re
import logging
import threading
from typing import Any, Callable, Iterable, TypeVar

from raygpu.errors import (ConflictError, ForbiddenError, InvalidError, NotFoundError, PermanentError, RayGpuError,
                           TransientError)
from raygpu.adapters.kube_views import node_view, pod_view  # noqa: F401 - parsers, re-exported here
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import K8sNodeView, K8sPodView

log = logging.getLogger("raygpu.kube")
RAYCLUSTER = ("ray.io/v1", "RayCluster")
# Every request has a deadline (connect, read), so a stalled connection becomes a TransientError the
# caller retries instead of a thread blocked for good (the Python client's default is no timeout).
# urllib3 retries a timed-out GET up to 3 times, so a silent server answers a read within 4 deadlines.
REQUEST_TIMEOUT: tuple[float, float] = (5, 30)
# The first contact (kubeconfig load with its exec credential plugin, then API discovery) as a whole, like
# kubectl's --request-timeout: the per-request deadline above, retried, would take minutes on a silent server,
# and the kubernetes client runs an exec plugin with no deadline at all.
FIRST_CONTACT_TIMEOUT_S = 15.0
MAX_FIRST_CONTACT_TIMEOUT_S = 600.0  # (0, 600]: longer is a typo, and a CLI that waits 10 min looks hung
REQUEST_TIMEOUT_ENV = "RAYGPU_REQUEST_TIMEOUT_S"
_O = TypeVar("_O")


def first_contact_timeout_s_of(value: float | None = None) -> float:
    """The first contact's deadline: ``value``, else ``$RAYGPU_REQUEST_TIMEOUT_S``, else ``FIRST_CONTACT_TIMEOUT_S``.

    Raises PermanentError unless it is a finite number of seconds in (0, ``MAX_FIRST_CONTACT_TIMEOUT_S``].
    """
    where = "request timeout"
    if value is None:
        text = os.environ.get(REQUEST_TIMEOUT_ENV, "").strip()
        if not text:
            return FIRST_CONTACT_TIMEOUT_S
        where = f"${REQUEST_TIMEOUT_ENV}"
        try:
            value = float(text)
        except ValueError:
            raise PermanentError(f"{where}={text!r} is not a number of seconds") from None
    try:
        ok = math.isfinite(value) and 0 < value <= MAX_FIRST_CONTACT_TIMEOUT_S
    except TypeError:
        ok = False
    if not ok:
        raise PermanentError(f"{where} must be a finite number of seconds > 0 and <= "
                             f"{MAX_FIRST_CONTACT_TIMEOUT_S:g}, got {value!r}")
    return float(value)


def within(deadline_s: float, fn: Callable[[], _O], doing: list[str]) -> _O:
    """``fn()`` in a daemon thread, its result or its exception; TransientError if it has not returned
    within ``deadline_s``, naming ``doing[-1]`` (what ``fn`` was doing then: it appends as it goes).

    A call that timed out keeps running in its thread (a hung exec plugin included: the kubernetes client
    gives no handle on it) and its result is dropped; the caller has its answer within the deadline.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e
    t = threading.Thread(target=run, name="raygpu-kube-first-contact", daemon=True)
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        raise TransientError(f"no answer within {deadline_s:g} s (--request-timeout, ${REQUEST_TIMEOUT_ENV}) while "
                             f"{doing[-1]}", delay_s=1.0)
    if "error" in box:
        raise box["error"]
    return box["value"]


def with_default_timeout(api_client: Any, timeout: tuple[float, float]) -> Any:
    """Give every request of ``api_client`` that names no ``_request_timeout`` this (connect, read) one.

    The kubernetes client's default is no timeout at all, and DynamicClient's discovery
    (``/version``, ``/apis``...) never passes one. Requests that pass their own (the watch
    cache's long reads) keep it. Idempotent: a second call only changes the timeout.
    """
    rest = api_client.rest_client
    first = getattr(rest, "_raygpu_timeout", None) is None
    rest._raygpu_timeout = timeout
    if first:
        inner = rest.request

        def request(*args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
            return inner(*args, _request_timeout=_request_timeout or rest._raygpu_timeout, **kwargs)
        rest.request = request
    return api_client


def parse_each(items: Iterable[dict[str, Any]], parse: Callable[[dict[str, Any]], _O], what: str) -> list[_O]:
    """``parse`` every item; one that raises is skipped with a warning naming it, never all of them."""
    out = []
    for item in items:
        try:
            out.append(parse(item))
        except Exception as e:  # noqa: BLE001 - one bad object must not hide the others
            md = item.get("metadata") or {} if isinstance(item, dict) else {}
            log.warning("skipping %s %s/%s: cannot parse it: %s: %s", what, md.get("namespace", ""),
                        md.get("name", "?"), type(e).__name__, e)
    return out


# How the API server words a failed JSON-patch ``test`` op (evanphx/json-patch): "testing value /x failed",
# "test operation does not apply". Only that wording makes a 422/500 a conflict: a 500 whose message merely
# mentions a test and a failure (a namespace named test-...-fails) is a server error whose write may have landed.
_JSON_PATCH_TEST_FAILED = re.compile(r"testing value \S+ failed|test operation does not apply", re.IGNORECASE)


def _convert(exc: Exception, what: str, need: tuple[str, str, str | None] | None = None) -> Exception:
    """``exc`` as a raygpu error whose message starts with ``what``. ``need`` (verb, resource, namespace; None:
    cluster-scoped) is the permission the request needed: a 403 names it (``ForbiddenError.verb`` ...)."""
    from kubernetes.client import ApiException
    if isinstance(exc, ApiException):
        body = exc.body.decode() if isinstance(exc.body, bytes) else (exc.body or "")
        try:
            msg = json.loads(body).get("message", body)
        except ValueError:
            msg = body or exc.reason
        if exc.status == 409 or (exc.status in (422, 500) and _JSON_PATCH_TEST_FAILED.search(msg)):
            return ConflictError(f"{what}: conflict: {msg}")
        if exc.status == 404:
            return NotFoundError(f"{what}: not found: {msg}")
        if exc.status == 403 and need is not None:
            verb, resource, namespace = need
            where = f"in namespace {namespace}" if namespace else "cluster-wide"
            return ForbiddenError(f"{what}: forbidden (403): missing permission: {verb} {resource} {where} (grant it "
                                  f"in this identity's Role; raygpu's: deploy/driver, deploy/sidecar, "
                                  f"docs/permissions.md): {msg}", verb=verb, resource=resource, namespace=namespace)
        if exc.status in (401, 403):
            return ForbiddenError(f"{what}: forbidden ({exc.status}): {msg}")
        if exc.status and exc.status >= 500:
            return TransientError(f"{what}: server error {exc.status}: {msg}", delay_s=1.0)
        if exc.status == 429:  # throttled (API priority and fairness): try again after Retry-After
            return TransientError(f"{what}: throttled (429): {msg}", delay_s=_retry_after_s(exc))
        if exc.status == 422:
            return InvalidError(f"{what}: {exc.status}: {msg}")
        return PermanentError(f"{what}: {exc.status}: {msg}")
    if isinstance(exc, (ConnectionError, OSError)) or type(exc).__module__.startswith("urllib3"):
        reason = getattr(exc, "reason", None)  # MaxRetryError: say what the last try hit, not the URL
        return TransientError(f"{what}: cannot reach the API server: "
                              f"{reason if isinstance(reason, Exception) else exc}", delay_s=1.0)
    return exc


def _retry_after_s(exc: Exception, default_s: float = 1.0) -> float:
    """The Retry-After header of a 429 in seconds (bounded to 1-60 s), else ``default_s``."""
    try:
        value = float((getattr(exc, "headers", None) or {}).get("Retry-After", default_s))
    except (TypeError, ValueError):
        return default_s
    return min(max(value, 1.0), 60.0) if value == value else default_s


class KubeAdapter:
    """A typed, error-converting view of one Kubernetes API server."""

    def __init__(self, kubeconfig: str | None = None, api_client: Any = None,
                 request_timeout: tuple[float, float] | None = None,
                 first_contact_timeout_s: float | None = None) -> None:
        """Connect to the API server of ``kubeconfig`` (else $KUBECONFIG / ~/.kube/config, else in-cluster).

        ``request_timeout`` (connect, read) in seconds, default ``REQUEST_TIMEOUT``, bounds every
        request that passes none, discovery included. ``first_contact_timeout_s`` (default
        ``$RAYGPU_REQUEST_TIMEOUT_S``, else 15 s; finite, in (0, 600]) bounds the whole construction:
        loading the kubeconfig (its exec credential plugin runs here) and API discovery; the same bound
        applies to each later run of the exec plugin (credential refresh). Raises PermanentError for a
        bad timeout (before any contact) or when there is no configuration to load, TransientError when
        the plugin or the server does not answer in time, ForbiddenError when it refuses the credential.
        """
        deadline_s = first_contact_timeout_s_of(first_contact_timeout_s)
        where = kubeconfig or "$KUBECONFIG / ~/.kube/config"
        doing = [f"loading kubeconfig {where} (its exec credential plugin, if it has one, did not return)"]
        self.api, self.dyn = within(deadline_s, lambda: self._connect(kubeconfig, api_client, request_timeout,
                                                                      deadline_s, doing), doing)
        self.timeout = self.api.rest_client._raygpu_timeout
        self._t = {"_request_timeout": self.timeout}
        from kubernetes import client
        self.core = client.CoreV1Api(self.api)

    @staticmethod
    def _connect(kubeconfig: str | None, api_client: Any, request_timeout: tuple[float, float] | None,
                 deadline_s: float, doing: list[str]) -> tuple[Any, Any]:
        """Load the configuration and run API discovery: (ApiClient, DynamicClient). ``doing`` gets each step."""
        from kubernetes import client, config
        from kubernetes.dynamic import DynamicClient
        if api_client is None:
            try:
                api_client = config.new_client_from_config(config_file=kubeconfig)
            except Exception as e:  # noqa: BLE001 - no kubeconfig: try in-cluster
                if kubeconfig:
                    raise PermanentError(f"cannot load kubeconfig {kubeconfig}: {e}") from None
                try:
                    config.load_incluster_config()
                except Exception as e2:  # noqa: BLE001 - neither: one clear line, not two tracebacks
                    raise PermanentError(f"no Kubernetes configuration: no kubeconfig ({e}) and not in a pod "
                                         f"({e2}); pass --kubeconfig or set KUBECONFIG") from None
                api_client = client.ApiClient()
        with_default_timeout(api_client, tuple(request_timeout or REQUEST_TIMEOUT))
        cfg = api_client.configuration
        hook = getattr(cfg, "refresh_api_key_hook", None)
        if hook is not None:  # an expired exec/OIDC token is refreshed before a request: the same bound
            def refresh(c: Any, hook: Any = hook) -> None:
                within(deadline_s, lambda: hook(c), ["refreshing the kubeconfig's credential (its exec "
                                                     "credential plugin did not return)"])
            cfg.refresh_api_key_hook = refresh
        doing.append(f"API discovery at {cfg.host} (the server did not answer)")
        try:
            return api_client, DynamicClient(api_client)  # reads /version and the API groups: discovery
        except Exception as e:  # noqa: BLE001
            err = _convert(e, f"API discovery at {cfg.host}")
            raise (err if isinstance(err, RayGpuError) else
                   PermanentError(f"API discovery at {cfg.host}: {type(e).__name__}: {e}")) from e

    def _res(self, api_version: str, kind: str):
        return self.dyn.resources.get(api_version=api_version, kind=kind)

    def _need(self, verb: str, api_version: str, kind: str, namespace: str | None) -> tuple[str, str, str | None]:
        """The permission a request needs, in RBAC's words: (verb, ``<plural>[.<group>]``, namespace)."""
        try:
            res = self._res(api_version, kind)
            resource = f"{res.name}.{res.group}" if res.group else res.name
        except Exception:  # noqa: BLE001 - discovery failed: the kind still says what was asked
            resource = f"{kind} ({api_version})"
        return verb, resource, namespace

    def api_group_kinds(self, group: str) -> dict[str, frozenset[str]]:
        """What the server serves of API ``group`` now: version -> kinds (``/apis/<group>``, then each version).

        Fresh discovery (not the client's cache), each request with the adapter's deadline. A group or
        version the server does not serve is absent (``{}`` for an unknown group). Raises TransientError
        (unreachable, 5xx) or ForbiddenError; discovery is open to every authenticated identity by default.
        """
        def get(path: str) -> dict[str, Any] | None:
            try:
                resp = self.dyn.request("GET", path, serialize=False, _request_timeout=self.timeout)
            except Exception as e:  # noqa: BLE001
                err = _convert(e, f"API discovery {path}")
                if isinstance(err, NotFoundError):
                    return None
                raise err from e
            return json.loads(resp.data)
        listing = get(f"/apis/{group}") or {}
        out: dict[str, frozenset[str]] = {}
        for v in listing.get("versions") or []:
            resources = get(f"/apis/{v['groupVersion']}")
            if resources is not None:
                out[v["version"]] = frozenset(r["kind"] for r in resources.get("resources") or []
                                              if "/" not in r.get("name", ""))  # subresources are not kinds
        return out

    # ------------------------------------------------------------ RayCluster
    def raw_raycluster(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self._res(*RAYCLUSTER).get(name=name, namespace=namespace, **self._t).to_dict()
        except Exception as e:  # noqa: BLE001
            err = _convert(e, f"RayCluster {namespace}/{name}", self._need("get", *RAYCLUSTER, namespace))
            if isinstance(err, NotFoundError):
                raise NotFoundError(f"unknown cluster: RayCluster {namespace}/{name} does not exist") from e
            raise err from e

    def get_raycluster(self, namespace: str, name: str) -> RayClusterView:
        return RayClusterView.from_k8s(self.raw_raycluster(namespace, name))

    def patch_raycluster(self, namespace: str, name: str, patch: list[dict[str, Any]]) -> RayClusterView:
        """Apply a JSON patch that starts with a resourceVersion test. Raises ConflictError if it changed."""
        if not patch or patch[0].get("op") != "test" or patch[0].get("path") != "/metadata/resourceVersion":
            raise PermanentError("refusing a RayCluster patch that does not first test metadata.resourceVersion")
        try:
            obj = self._res(*RAYCLUSTER).patch(name=name, namespace=namespace, body=patch,
                                               content_type="application/json-patch+json", **self._t)
        except Exception as e:  # noqa: BLE001
            err = _convert(e, f"patch RayCluster {namespace}/{name}", self._need("patch", *RAYCLUSTER, namespace))
            # For a custom resource the API server answers a failed ``test`` op
            # with a bare 422 ("the server rejected our request due to an error
            # in our request"). If the object moved, that is a conflict.
            if isinstance(err, InvalidError):
                now_rv = self.raw_raycluster(namespace, name).get("metadata", {}).get("resourceVersion")
                if now_rv != patch[0]["value"]:
                    raise ConflictError(f"patch RayCluster {namespace}/{name}: resourceVersion moved from "
                                        f"{patch[0]['value']} to {now_rv}") from e
            raise err from e
        return RayClusterView.from_k8s(obj.to_dict())

    # --------------------------------------------------------------- objects
    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        md = obj["metadata"]
        try:
            return self._res(obj["apiVersion"], obj["kind"]).create(body=obj, namespace=md.get("namespace"), **self._t).to_dict()
        except Exception as e:  # noqa: BLE001
            raise _convert(e, f"create {obj['kind']} {md.get('namespace')}/{md['name']}",
                           self._need("create", obj["apiVersion"], obj["kind"], md.get("namespace"))) from e

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self._res(api_version, kind).get(name=name, namespace=namespace, **self._t).to_dict()
        except Exception as e:  # noqa: BLE001
            err = _convert(e, f"get {kind} {namespace}/{name}", self._need("get", api_version, kind, namespace))
            if isinstance(err, NotFoundError):
                return None
            raise err from e

    def list(self, api_version: str, kind: str, namespace: str | None = None,
             label_selector: str = "", field_selector: str = "") -> list[dict[str, Any]]:
        """Objects of ``kind`` (all namespaces when ``namespace`` is None) matching both selectors."""
        kw = {"field_selector": field_selector} if field_selector else {}
        try:
            return self._res(api_version, kind).get(namespace=namespace, label_selector=label_selector,
                                                    **kw, **self._t).to_dict()["items"]
        except Exception as e:  # noqa: BLE001
            raise _convert(e, f"list {kind} in {namespace}", self._need("list", api_version, kind, namespace)) from e

    def merge_patch(self, api_version: str, kind: str, name: str, namespace: str | None,
                    body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._res(api_version, kind).patch(name=name, namespace=namespace, body=body,
                                                      content_type="application/merge-patch+json", **self._t).to_dict()
        except Exception as e:  # noqa: BLE001
            raise _convert(e, f"patch {kind} {namespace}/{name}",
                           self._need("patch", api_version, kind, namespace)) from e

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None, *,
               uid: str | None = None) -> bool:
        """Delete (foreground-free, background propagation). False if it was already gone.

        With ``uid``, only the object of that uid: a same-named other object raises
        ConflictError (the API server's precondition check, 409) and stays.
        """
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self._res(api_version, kind).delete(name=name, namespace=namespace, body=body, **self._t)
            return True
        except Exception as e:  # noqa: BLE001
            err = _convert(e, f"delete {kind} {namespace}/{name}", self._need("delete", api_version, kind, namespace))
            if isinstance(err, NotFoundError):
                return False
            raise err from e

    # ------------------------------------------------------------ pods/nodes
    def ray_pods(self, namespace: str | None, cluster: str | None = None) -> list[K8sPodView]:
        sel = "ray.io/is-ray-node=yes" + (f",ray.io/cluster={cluster}" if cluster else "")
        try:
            if namespace:
                resp = self.core.list_namespaced_pod(namespace, label_selector=sel, _preload_content=False, **self._t)
            else:
                resp = self.core.list_pod_for_all_namespaces(label_selector=sel, _preload_content=False, **self._t)
        except Exception as e:  # noqa: BLE001
            raise _convert(e, f"list Ray pods in {namespace}", ("list", "pods", namespace)) from e
        return parse_each(json.loads(resp.data)["items"], pod_view, "Pod")

    def nodes(self) -> list[K8sNodeView]:
        try:
            resp = self.core.list_node(_preload_content=False, **self._t)
        except Exception as e:  # noqa: BLE001
            raise _convert(e, "list nodes", ("list", "nodes", None)) from e
        return parse_each(json.loads(resp.data)["items"], node_view, "Node")

    def event(self, involved: dict[str, Any], reason: str, message: str, type_: str = "Normal",
              component: str = "raygpu") -> None:
        """Record a core/v1 Event on ``involved`` (apiVersion, kind, name, namespace, uid)."""
        now = dt.datetime.now(dt.timezone.utc)
        ns = involved["namespace"]
        body = {"metadata": {"generateName": f"{involved['name']}.", "namespace": ns},
                "involvedObject": involved, "reason": reason, "message": message[:1000], "type": type_,
                "source": {"component": component}, "firstTimestamp": now.isoformat(),
                "lastTimestamp": now.isoformat(), "count": 1, "reportingComponent": component}
        try:
            self.core.create_namespaced_event(ns, body, **self._t)
        except Exception as e:  # noqa: BLE001
            raise _convert(e, f"event {reason} on {involved['kind']} {ns}/{involved['name']}",
                           ("create", "events", ns)) from e
