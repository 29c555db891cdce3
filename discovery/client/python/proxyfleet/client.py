"""A client of discovery's lease API, on the standard library only.

Every error discovery answers is a :class:`ProxyfleetError` carrying its status, its
stable ``code`` and, when discovery gave one, ``retry_after`` in seconds. The answers a
crawler waits out (409 no proxy free, 429 over a limit, 503 discovery starting or a
replica restarting) can be retried for you: pass ``wait`` to :meth:`Client.acquire`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional
from contextlib import contextmanager

__all__ = [
    "Client",
    "HeldLease",
    "Lease",
    "LeaseGone",
    "NoProxy",
    "ProxyfleetError",
    "Throttled",
    "Unavailable",
]

RESULTS = ("ok", "rate_limited", "banned")


class ProxyfleetError(Exception):
    """An error answer of discovery (or no answer at all: status 0)."""

    def __init__(self, status: int, code: str, message: str, retry_after: Optional[float] = None,
                 body: Optional[Dict[str, Any]] = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.body = body or {}


class NoProxy(ProxyfleetError):
    """409 no_match: no proxy can be leased now; ``body`` has the counts of why."""


class LeaseGone(ProxyfleetError):
    """410: the lease expired, or its proxy was replaced, turned unhealthy or left."""


class Throttled(ProxyfleetError):
    """429: the client is over its requests per second or its lease cap."""


class Unavailable(ProxyfleetError):
    """503: discovery is loading its index, or the replica that must answer is restarting."""


_BY_STATUS = {409: NoProxy, 410: LeaseGone, 429: Throttled, 503: Unavailable}


@dataclass
class Lease:
    """A granted (or renewed) lease. ``proxy_url`` carries the credentials as userinfo, so
    it works as any HTTP client's proxy setting; never log it."""

    id: str
    proxy_url: str
    proxy: Dict[str, Any] = field(repr=False)
    expires_at: str
    ttl: int
    target: str = ""
    session: str = ""

    @property
    def proxy_id(self) -> str:
        return f"{self.proxy.get('namespace')}/{self.proxy.get('name')}"

    def __repr__(self) -> str:  # the URL has the proxy's password
        return f"Lease(id={self.id!r}, proxy={self.proxy_id!r}, expires_at={self.expires_at!r})"

    @classmethod
    def _from(cls, body: Dict[str, Any]) -> "Lease":
        return cls(id=body["leaseID"], proxy_url=body["proxy"]["url"], proxy=body["proxy"],
                   expires_at=body.get("expiresAt", ""), ttl=int(body.get("ttlSeconds", 0)),
                   target=body.get("target", ""), session=body.get("session", ""))


class Client:
    """Discovery's lease API at ``url`` (such as ``http://127.0.0.1:8090``) with a client's
    bearer token."""

    def __init__(self, url: str, token: str, timeout: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep, max_wait: int = 60):
        self.url = url.rstrip("/")
        self._token = token
        self.timeout = timeout
        self._sleep = sleep
        # The longest wait discovery takes in one acquire (its --max-acquire-wait).
        self.max_wait = max_wait

    def __repr__(self) -> str:  # never the token
        return f"Client({self.url!r})"

    # -- the API --------------------------------------------------------------------------

    def list_proxies(self, selector: Optional[Dict[str, str]] = None,
                     healthy: Optional[bool] = None) -> List[Dict[str, Any]]:
        """The proxies matching ``selector`` (and of that health), without credentials."""
        query = {f"attr.{k}": v for k, v in (selector or {}).items()}
        if healthy is not None:
            query["healthy"] = "true" if healthy else "false"
        path = "/v1/proxies" + ("?" + urllib.parse.urlencode(query) if query else "")
        return self._call("GET", path)["proxies"]

    def acquire(self, selector: Optional[Dict[str, str]] = None, target: str = "", session: str = "",
                ttl: Optional[int] = None, wait: float = 0.0) -> Lease:
        """Lease a proxy. With ``wait`` > 0, discovery itself waits for a proxy when none
        can take the lease now (``waitSeconds``, whole seconds, at most ``max_wait`` per
        request), and the request's timeout is the client's plus that wait; answers that
        still say to retry (409 with a Retry-After, 429, 503) are retried after the time
        they give, until ``wait`` seconds have passed; then the last error is raised."""
        body: Dict[str, Any] = {}
        if selector:
            body["selector"] = selector
        if target:
            body["target"] = target
        if session:
            body["session"] = session
        if ttl:
            body["ttlSeconds"] = int(ttl)
        deadline = time.monotonic() + wait
        while True:
            # Whole seconds, never past the caller's wait (but for the time it took to get
            # here) nor discovery's maximum.
            server_wait = max(0, min(int(deadline - time.monotonic() + 0.05), int(self.max_wait)))
            if server_wait:
                body["waitSeconds"] = server_wait
            else:
                body.pop("waitSeconds", None)
            try:
                return Lease._from(self._call("POST", "/v1/leases", body, timeout=self.timeout + server_wait))
            except (NoProxy, Throttled, Unavailable) as e:
                pause = e.retry_after
                if pause is None or time.monotonic() + pause > deadline:
                    raise
                self._sleep(pause)

    def renew(self, lease_id: str, ttl: Optional[int] = None) -> Lease:
        """Extend a lease on the same proxy; :class:`LeaseGone` when it cannot be."""
        body = {"ttlSeconds": int(ttl)} if ttl else {}
        return Lease._from(self._call("POST", f"/v1/leases/{_q(lease_id)}/renew", body))

    def release(self, lease_id: str) -> None:
        """End a lease (releasing one already ended is not an error)."""
        self._call("DELETE", f"/v1/leases/{_q(lease_id)}")

    def report(self, lease_id: str, result: str, target: str = "") -> None:
        """Say how ``target`` (default: the lease's) treated the lease's proxy: ``ok``,
        ``rate_limited`` or ``banned``. The last two rest the proxy for the site."""
        self._call("POST", f"/v1/leases/{_q(lease_id)}/report", _report(result, target))

    def report_session(self, session: str, result: str, target: str = "") -> None:
        """Report on the proxy a session is on (its latest lease): how a crawler of the
        gateway reports a ban it saw inside a tunnel."""
        self._call("POST", f"/v1/sessions/{_q(session)}/report", _report(result, target))

    @contextmanager
    def held(self, selector: Optional[Dict[str, str]] = None, target: str = "", session: str = "",
             ttl: int = 300, wait: float = 30.0) -> Iterator["HeldLease"]:
        """A lease renewed in the background (every third of its TTL) for the ``with``
        block, and released at its end. If its proxy goes away, the next renewal leases
        another for the same target and session, and ``lease`` changes."""
        held = HeldLease(self, selector, target, session, ttl, wait)
        try:
            yield held
        finally:
            held.close()

    # -- plumbing -------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
              timeout: Optional[float] = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + self._token)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        # Discovery is reached directly, never through the process's own proxy settings.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(req, timeout=self.timeout if timeout is None else timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise _error(e.code, e.read(), e.headers.get("Retry-After")) from None
        except (urllib.error.URLError, OSError) as e:
            raise ProxyfleetError(0, "unreachable", f"discovery at {self.url} did not answer: {e}") from None
        return json.loads(raw) if raw else None


class HeldLease:
    """See :meth:`Client.held`."""

    def __init__(self, client: Client, selector, target, session, ttl, wait):
        self._client, self._want = client, dict(selector=selector, target=target, session=session, ttl=ttl)
        self._wait = wait
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.lease = client.acquire(wait=wait, **self._want)
        self._thread = threading.Thread(target=self._renew, name="proxyfleet-renew", daemon=True)
        self._thread.start()

    @property
    def proxy_url(self) -> str:
        with self._lock:
            return self.lease.proxy_url

    def report(self, result: str, target: str = "") -> None:
        with self._lock:
            lease_id = self.lease.id
        self._client.report(lease_id, result, target)

    def _renew(self) -> None:
        while not self._stop.wait(max(1.0, self.lease.ttl / 3)):
            with self._lock:
                lease_id = self.lease.id
            try:
                renewed = self._client.renew(lease_id, self._want["ttl"])
            except LeaseGone:
                try:
                    renewed = self._client.acquire(wait=self._wait, **self._want)
                except ProxyfleetError:
                    continue
            except ProxyfleetError:
                continue  # 503: the owner is restarting; the lease has two thirds left
            with self._lock:
                self.lease = renewed

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        try:
            self._client.release(self.lease.id)
        except ProxyfleetError:
            pass  # it frees up when it expires


def _q(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _report(result: str, target: str) -> Dict[str, str]:
    if result not in RESULTS:
        raise ValueError(f"result must be one of {', '.join(RESULTS)}, not {result!r}")
    body = {"result": result}
    if target:
        body["target"] = target
    return body


def _error(status: int, raw: bytes, retry_after: Optional[str]) -> ProxyfleetError:
    try:
        body = json.loads(raw)
        code, message = body.get("error", "unknown"), body.get("message", "")
    except ValueError:
        body, code, message = {}, "unknown", raw.decode("utf-8", "replace")[:200]
    pause: Optional[float] = None
    if retry_after:
        try:
            pause = float(retry_after)
        except ValueError:
            pause = None
    cls = _BY_STATUS.get(status, ProxyfleetError)
    return cls(status, code, message, pause, body)
