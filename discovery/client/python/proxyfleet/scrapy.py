"""A Scrapy downloader middleware that crawls through a proxyfleet fleet.

Two modes, chosen by settings:

* **Leases** (``PROXYFLEET_URL`` and ``PROXYFLEET_TOKEN``): one lease per download slot
  (``PROXYFLEET_LEASE_PER = "slot"``, the default; Scrapy's slot is the domain unless a
  spider sets ``download_slot``) or per domain. Each request gets the lease's proxy in
  ``request.meta["proxy"]``, credentials included, which Scrapy's HttpProxyMiddleware
  turns into ``Proxy-Authorization``. Leases are renewed in the background and released
  when the spider closes.
* **Gateway** (``PROXYFLEET_GATEWAY = "host:port"`` as well): every request goes to the
  gateway, with a session per slot in the proxy username; no lease is held here.

In both, an answer whose status is in ``PROXYFLEET_BAN_STATUSES`` (default 403 and 429)
is reported (429 as rate_limited, others as banned), so the proxy rests for that site,
and the request is sent again, through another proxy, up to ``PROXYFLEET_BAN_RETRIES``
times (default 3). Ban signals Scrapy does not see as a status (a captcha page, say) can
be reported by setting ``request.meta["proxyfleet_banned"] = True`` in a spider
callback's response handling and yielding the request again, or by calling
:meth:`ProxyfleetMiddleware.report`.

Enable it before HttpProxyMiddleware (750)::

    DOWNLOADER_MIDDLEWARES = {"proxyfleet.scrapy.ProxyfleetMiddleware": 740}
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Dict, Optional

from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import defer, task, threads

from .client import Client, Lease, LeaseGone, ProxyfleetError

log = logging.getLogger(__name__)

META_KEY = "proxyfleet_key"
META_LEASE = "proxyfleet_lease"
META_SESSION = "proxyfleet_session"
META_RETRIES = "proxyfleet_ban_retries"
META_LANE = "proxyfleet_lane"
META_BASE = "proxyfleet_session_base"


class ProxyfleetMiddleware:
    def __init__(self, settings, stats=None):
        self.url = settings.get("PROXYFLEET_URL", "")
        self.token = settings.get("PROXYFLEET_TOKEN", "")
        self.gateway = settings.get("PROXYFLEET_GATEWAY", "")
        if not self.token or not (self.url or self.gateway):
            raise NotConfigured("set PROXYFLEET_TOKEN and PROXYFLEET_URL (leases) or PROXYFLEET_GATEWAY")
        self.client_name = settings.get("PROXYFLEET_CLIENT", "default")
        self.selector: Dict[str, str] = dict(settings.getdict("PROXYFLEET_SELECTOR"))
        self.per = settings.get("PROXYFLEET_LEASE_PER", "slot")
        if self.per not in ("slot", "domain"):
            raise NotConfigured("PROXYFLEET_LEASE_PER must be slot or domain")
        self.ttl = settings.getint("PROXYFLEET_TTL", 300)
        self.wait = settings.getfloat("PROXYFLEET_WAIT", 60.0)
        self.ban_statuses = set(settings.getlist("PROXYFLEET_BAN_STATUSES", [403, 429]))
        self.ban_statuses = {int(s) for s in self.ban_statuses}
        self.ban_retries = settings.getint("PROXYFLEET_BAN_RETRIES", 3)
        self.keepalive = settings.getbool("PROXYFLEET_GATEWAY_KEEPALIVE", False)
        self.stats = stats
        self.api = Client(self.url, self.token) if self.url else None
        # Leases by key, and the acquires in flight, so that a slot's concurrent requests
        # share one acquire. Touched on the reactor thread only.
        self.leases: Dict[str, Lease] = {}
        self.pending: Dict[str, defer.Deferred] = {}
        # Gateway sessions move to a new name after a ban: Scrapy pools tunnels by proxy
        # URL, credentials included, so a new name is a new tunnel, not one kept open
        # through the proxy the site banned.
        self.generations: Dict[str, int] = {}
        # The lanes of each key in use: a gateway session carries one request at a time,
        # so that a report on the session names the proxy that request went through (a
        # session with more requests in flight than its proxy has slots spills onto
        # another proxy).
        self.lanes: Dict[str, set] = {}
        self._renewer: Optional[task.LoopingCall] = None

    @classmethod
    def from_crawler(cls, crawler):
        mw = cls(crawler.settings, crawler.stats)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    # -- the spider's lifetime ------------------------------------------------------------

    def spider_opened(self, spider):
        if not self.gateway:
            self._renewer = task.LoopingCall(self._renew_all)
            self._renewer.start(max(1, self.ttl // 3), now=False)

    def spider_closed(self, spider):
        if self._renewer and self._renewer.running:
            self._renewer.stop()
        leases, self.leases = list(self.leases.values()), {}
        if not leases:
            return None
        return threads.deferToThread(self._release_all, leases)

    def _release_all(self, leases):
        for lease in leases:
            try:
                self.api.release(lease.id)
            except ProxyfleetError as e:
                log.warning("proxyfleet: lease %s not released (it expires on its own): %s", lease.id, e)

    def _renew_all(self):
        leases = dict(self.leases)
        if not leases:
            return None
        d = threads.deferToThread(self._renew, leases)
        d.addCallback(self._renewed)
        d.addErrback(lambda f: log.warning("proxyfleet: renewals failed: %s", f.value))
        return d

    def _renew(self, leases):
        out = {}
        for key, lease in leases.items():
            try:
                out[key] = self.api.renew(lease.id, self.ttl)
            except LeaseGone:
                out[key] = None  # its proxy went away: the key's next request leases anew
            except ProxyfleetError:
                pass  # a replica restarting: try again next round
        return out

    def _renewed(self, renewed):
        for key, lease in renewed.items():
            current = self.leases.get(key)
            if current is None:
                continue
            if lease is None:
                self.leases.pop(key, None)
            elif lease.id == current.id:
                self.leases[key] = lease

    # -- requests -------------------------------------------------------------------------

    def _key(self, request) -> str:
        host = urlparse_cached(request).hostname or ""
        if self.per == "slot":
            return request.meta.get("download_slot") or host
        return host

    def process_request(self, request, spider):
        if request.meta.get("proxyfleet_skip"):
            return None
        key = self._key(request)
        host = urlparse_cached(request).hostname or ""
        if self.gateway:
            busy = self.lanes.setdefault(key, set())
            lane = 0
            while lane in busy:
                lane += 1
            busy.add(lane)
            request.meta[META_LANE] = lane
            base = f"{_session_name(key)}-{lane}"
            session = self._session_of(base)
            request.meta[META_SESSION], request.meta[META_BASE] = session, base
            user = f"{self.client_name};session={session}"
            for k, v in sorted(self.selector.items()):
                user += f";{k}={v}"
            request.meta["proxy"] = "http://{}:{}@{}".format(
                urllib.parse.quote(user, safe=";="), urllib.parse.quote(self.token, safe=""), self.gateway)
            if not self.keepalive and urlparse_cached(request).scheme == "https":
                # A tunnel holds its proxy and a slot of it for as long as it is open, and
                # Scrapy keeps tunnels open for minutes: one tunnel per request rotates as
                # the gateway's plain requests do and frees the slot at once.
                request.headers[b"Connection"] = b"close"
            return None
        lease = self.leases.get(key)
        if lease is not None:
            self._use(request, key, lease)
            return None
        d = self.pending.get(key)
        if d is None:
            d = threads.deferToThread(self.api.acquire, self.selector, host, "", self.ttl, self.wait)
            d.addBoth(self._acquired, key)
            self.pending[key] = d
        waiter = defer.Deferred()

        def done(result):
            if isinstance(result, Exception):
                waiter.errback(result)
            else:
                self._use(request, key, result)
                waiter.callback(None)
            return result

        d.addBoth(done)
        return waiter

    def _acquired(self, result, key):
        self.pending.pop(key, None)
        if isinstance(result, Lease):
            self.leases[key] = result
            if self.stats:
                self.stats.inc_value("proxyfleet/leases")
            return result
        err = result.value if hasattr(result, "value") else result
        log.warning("proxyfleet: no lease for %s: %s", key, err)
        return err

    def _use(self, request, key, lease: Lease):
        request.meta[META_KEY] = key
        request.meta[META_LEASE] = lease.id
        request.meta["proxy"] = lease.proxy_url

    def _free_lane(self, request):
        lane = request.meta.pop(META_LANE, None)
        if lane is not None:
            self.lanes.get(self._key(request), set()).discard(lane)

    def process_exception(self, request, exception, spider):
        self._free_lane(request)
        return None

    def process_response(self, request, response, spider):
        self._free_lane(request)
        banned = request.meta.get("proxyfleet_banned") or response.status in self.ban_statuses
        if not banned:
            return response
        result = "rate_limited" if response.status == 429 else "banned"
        reported = self.report(request, result)
        base = request.meta.get(META_BASE)
        if self.gateway and base and request.meta.get(META_SESSION) == self._session_of(base):
            # This lane's next session has a new name: a new tunnel, never one Scrapy kept
            # open through the proxy the site banned.
            self.generations[base] = self.generations.get(base, 0) + 1
        retries = request.meta.get(META_RETRIES, 0)
        if retries >= self.ban_retries:
            return response
        if self.stats:
            self.stats.inc_value("proxyfleet/ban_retries")
        retry = request.replace(dont_filter=True)
        retry.meta[META_RETRIES] = retries + 1
        retry.meta.pop("proxyfleet_banned", None)
        retry.meta.pop("proxy", None)
        retry.meta.pop(META_SESSION, None)
        retry.headers.pop(b"Proxy-Authorization", None)
        if reported is None:
            return retry
        # Sent again once discovery has the report, so that it goes to another proxy.
        return reported.addBoth(lambda _: retry)

    def report(self, request, result: str):
        """Report how the request's site treated its proxy; for ``banned`` and
        ``rate_limited`` the proxy rests for the site, and the slot moves to another."""
        host = urlparse_cached(request).hostname or ""
        if self.stats:
            self.stats.inc_value(f"proxyfleet/reports/{result}")
        if self.gateway:
            if urlparse_cached(request).scheme == "http" and request.meta.get("proxyfleet_banned") is None:
                return None  # the gateway saw the status itself and reported it
            session = request.meta.get(META_SESSION)
            if not session or not self.url:
                return None
            call, args = self._api_for_gateway().report_session, (session, result, host)
        else:
            lease_id = request.meta.get(META_LEASE)
            if not lease_id:
                return None
            key = request.meta.get(META_KEY)
            current = self.leases.get(key)
            if current is not None and current.id == lease_id and result != "ok":
                # The proxy rests for this site now: the slot's next request leases
                # another, and this one is released.
                del self.leases[key]
                threads.deferToThread(self._release_all, [current])
            call, args = self.api.report, (lease_id, result, host)
        d = threads.deferToThread(call, *args)
        d.addErrback(lambda f: log.warning("proxyfleet: report not recorded: %s", f.value))
        return d

    def _session_of(self, base: str) -> str:
        gen = self.generations.get(base, 0)
        return base + (f"~{gen}" if gen else "")

    def _api_for_gateway(self) -> Client:
        if self.api is None:
            self.api = Client(self.url, self.token)
        return self.api


def _session_name(key: str) -> str:
    """A session name from a slot key: the characters a session takes, at most 128."""
    out = "".join(c if c.isalnum() or c in ".:-" else "-" for c in key)[:100]
    return out or "default"
