"""A Scrapy downloader middleware that crawls through a proxyfleet fleet.

Two modes, chosen by settings:

* **Leases** (``PROXYFLEET_URL`` and ``PROXYFLEET_TOKEN``): by default each request takes
  a lease of its own for its site and releases it when its answer (or failure) comes
  back, so one site's requests spread over every proxy that can take them, as discovery's
  rotation grants them. ``PROXYFLEET_LEASE_PER = "slot"`` (Scrapy's download slot: the
  domain unless a spider sets ``download_slot``) or ``"domain"`` holds one lease per slot
  or domain instead, renewed in the background and released when the spider closes. The
  lease's proxy goes in ``request.meta["proxy"]``, credentials included, which Scrapy's
  HttpProxyMiddleware turns into ``Proxy-Authorization``.
* **Gateway** (``PROXYFLEET_GATEWAY = "host:port"`` as well): every request goes to the
  gateway, which picks a proxy per request (per tunnel for HTTPS); no lease is held here.
  With ``PROXYFLEET_LEASE_PER`` ``"slot"`` or ``"domain"``, each concurrent request of a
  slot has a session of its own in the proxy username, and keeps its proxy.

In both, ``request.meta["proxyfleet_session"] = "name"`` keeps the requests that carry it
on one proxy: a lease held for the session, or the session in the gateway username.

An answer whose status is in ``PROXYFLEET_BAN_STATUSES`` (default 403 and 429) is reported
(429 as rate_limited, others as banned), so the proxy rests for that site, and the request
is sent again, through another proxy, up to ``PROXYFLEET_BAN_RETRIES`` times (default 3).
Ban signals Scrapy does not see as a status (a captcha page, say) can be reported by
setting ``request.meta["proxyfleet_banned"] = True`` in a spider callback and yielding the
request again (with ``dont_filter=True``), or by calling :meth:`ProxyfleetMiddleware.report`.
Through the gateway without a session, an HTTPS ban cannot be reported (nothing tells
which proxy carried the tunnel): the request is sent again under a one-off session, so
that a second ban is reported on it.

Enable it before HttpProxyMiddleware (750)::

    DOWNLOADER_MIDDLEWARES = {"proxyfleet.scrapy.ProxyfleetMiddleware": 740}
"""

from __future__ import annotations

import itertools
import logging
import secrets
import string
import time
import urllib.parse
import weakref
from typing import Dict, Iterable, Optional, Set

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import defer, task, threads

from .client import Client, Lease, LeaseGone, NoProxy, ProxyfleetError, Throttled, Unavailable

log = logging.getLogger(__name__)

# What a spider may set.
META_SESSION = "proxyfleet_session"  # a session name: keep these requests on one proxy
META_BANNED = "proxyfleet_banned"  # the spider judged the answer a ban
META_SKIP = "proxyfleet_skip"  # leave this request alone
# What the middleware notes on a request.
META_KEY = "proxyfleet_key"  # the held lease's key (slot, domain or session)
META_LEASE = "proxyfleet_lease"  # the ID of the lease the request went through
META_OWN = "proxyfleet_own_lease"  # the request's own lease, released with its answer
META_GW_SESSION = "proxyfleet_gateway_session"  # the gateway session it was sent under
META_ONE_OFF = "proxyfleet_one_off_session"  # a session for this attempt alone (see _one_off)
META_RETRIES = "proxyfleet_ban_retries"
META_LANE = "proxyfleet_lane"
META_BASE = "proxyfleet_session_base"

LEASE_PER = ("request", "slot", "domain")


class ProxyfleetMiddleware:
    def __init__(self, settings, stats=None):
        self.url = settings.get("PROXYFLEET_URL", "")
        self.token = settings.get("PROXYFLEET_TOKEN", "")
        self.gateway = settings.get("PROXYFLEET_GATEWAY", "")
        if not self.token or not (self.url or self.gateway):
            raise NotConfigured("set PROXYFLEET_TOKEN and PROXYFLEET_URL (leases) or PROXYFLEET_GATEWAY")
        self.client_name = settings.get("PROXYFLEET_CLIENT", "default")
        self.selector: Dict[str, str] = dict(settings.getdict("PROXYFLEET_SELECTOR"))
        self.per = settings.get("PROXYFLEET_LEASE_PER", "request")
        if self.per not in LEASE_PER:
            raise NotConfigured("PROXYFLEET_LEASE_PER must be request, slot or domain")
        self.ttl = settings.getint("PROXYFLEET_TTL", 300)
        self.wait = settings.getfloat("PROXYFLEET_WAIT", 60.0)
        self.ban_statuses = set(settings.getlist("PROXYFLEET_BAN_STATUSES", [403, 429]))
        self.ban_statuses = {int(s) for s in self.ban_statuses}
        self.ban_retries = settings.getint("PROXYFLEET_BAN_RETRIES", 3)
        self.keepalive = settings.getbool("PROXYFLEET_GATEWAY_KEEPALIVE", False)
        self.stats = stats
        self.api = Client(self.url, self.token) if self.url else None
        # Everything below is touched on the reactor thread only.
        #
        # Once the spider has closed no lease is taken, and one that lands after it is
        # released at once: nothing would release it later.
        self.closed = False
        # Held leases by key (slot, domain or "session:<name>"), and their acquires in
        # flight, so that a key's concurrent requests share one acquire.
        self.leases: Dict[str, Lease] = {}
        self.pending: Dict[str, defer.Deferred] = {}
        # Per-request leases by ID, while their requests are out, and what releases each
        # if its request is dropped unanswered: a middleware that answers with a new
        # request before this one's process_response or process_exception runs skips it.
        self.own: Dict[str, Lease] = {}
        self._orphans: Dict[str, weakref.finalize] = {}
        # Acquires whose call to discovery has not come back, and releases on their way:
        # the close waits for them, so that none is cut off when the reactor stops.
        self._landing: Set[defer.Deferred] = set()
        self._releasing: Set[defer.Deferred] = set()
        # Acquires waiting to try again, oldest first, by token: (the delayed call, the
        # try, its result, whether a release of ours should wake it).
        self._waiting: Dict[int, tuple] = {}
        self._tokens = itertools.count()
        self.clock = None  # the reactor; tests set a task.Clock
        # Gateway sessions move to a new name after a ban: Scrapy pools tunnels by proxy
        # URL, credentials included, so a new name is a new tunnel, not one kept open
        # through the proxy the site banned.
        self.generations: Dict[str, int] = {}
        # The lanes of each key in use: a gateway session carries one request at a time,
        # so that a report on the session names the proxy that request went through (a
        # session with more requests in flight than its proxy has slots spills onto
        # another proxy).
        self.lanes: Dict[str, set] = {}
        # One-off gateway sessions are named from these: unique to this crawl, so that two
        # crawlers of one client never share one.
        self._one_off_prefix = "once-" + secrets.token_hex(4)
        self._one_offs = itertools.count(1)
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
        """Releases every lease; fires when they are released, and those still being
        granted too (they are released as they land)."""
        self.closed = True
        if self._renewer and self._renewer.running:
            self._renewer.stop()
        waiting, self._waiting = list(self._waiting.values()), {}
        for call, _, result, _ in waiting:
            call.cancel()
            result.errback(IgnoreRequest("proxyfleet: the spider closed while this request waited for a lease"))
        held = list(self.leases.values()) + list(self.own.values())
        self.leases, self.own = {}, {}
        for fin in self._orphans.values():
            fin.detach()
        self._orphans.clear()
        if held:
            self._release(held)
        landed = defer.DeferredList(list(self._landing), consumeErrors=True)
        # Only once every acquire has landed are all the releases known.
        landed.addBoth(lambda _: defer.DeferredList(list(self._releasing), consumeErrors=True))
        landed.addBoth(lambda _: None)
        return landed

    def _release(self, leases: Iterable[Lease]) -> defer.Deferred:
        leases = list(leases)
        d = threads.deferToThread(self._release_all, leases)
        self._releasing.add(d)

        def done(result):
            self._releasing.discard(d)
            for _ in leases:
                self._wake_one()
            return result

        d.addBoth(done)
        d.addErrback(lambda f: log.warning("proxyfleet: releases failed: %s", f.value))
        return d

    def _release_all(self, leases):
        for lease in leases:
            for attempt in range(3):
                try:
                    self.api.release(lease.id)
                    break
                except (Throttled, Unavailable) as e:
                    # A per-request lease that is not released holds a slot for its whole
                    # TTL: worth a short wait (in this worker thread) when discovery says so.
                    if e.retry_after is None or e.retry_after > 5 or attempt == 2:
                        log.warning("proxyfleet: lease %s not released (it expires on its own): %s", lease.id, e)
                        break
                    time.sleep(e.retry_after)
                except ProxyfleetError as e:
                    log.warning("proxyfleet: lease %s not released (it expires on its own): %s", lease.id, e)
                    break

    def _renew_all(self):
        leases = dict(self.leases)
        # A request can be out longer than a lease lasts (DOWNLOAD_TIMEOUT over
        # PROXYFLEET_TTL, or a long wait in its download slot's queue).
        leases.update({("own", lease_id): lease for lease_id, lease in self.own.items()})
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
            if isinstance(key, tuple):
                # A request's own lease stays listed until its answer releases it, gone
                # or not: releasing an ended lease is no error.
                if lease is not None and key[1] in self.own:
                    self.own[key[1]] = lease
                continue
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
        if request.meta.get(META_SKIP):
            return None
        request.meta.pop(META_OWN, None)  # a copy of an earlier attempt's: released with its answer
        if request.meta.get(META_BANNED):
            # The spider judged the answer of this request's last attempt a ban and sent
            # it again: report the proxy of that attempt, which the request's notes still
            # name, before the new attempt takes one (and so takes another). The flag is
            # about that attempt, not this one's answer.
            unattributed = self._unattributed(request)
            reported = self.report(request, "banned")
            request.meta.pop(META_BANNED, None)
            for k in (META_LEASE, META_KEY, META_GW_SESSION):
                request.meta.pop(k, None)
            if unattributed:
                self._one_off(request)
            if reported is not None:
                return reported.addBoth(lambda _: self._route(request))
        return self._route(request)

    def _route(self, request):
        if self.gateway:
            self._through_gateway(request)
            return None
        if self.closed:
            raise IgnoreRequest("proxyfleet: the spider has closed; no lease is taken after that")
        host = urlparse_cached(request).hostname or ""
        session = request.meta.get(META_SESSION) or ""
        if session:
            key = "session:" + session
        elif self.per == "request":
            return self._own_lease(request, host)
        else:
            key = self._key(request)
        lease = self.leases.get(key)
        if lease is not None:
            self._use(request, key, lease)
            return None
        d = self.pending.get(key)
        if d is None:
            d = self._acquire(host, session)
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

    def _acquire(self, target: str, session: str) -> defer.Deferred:
        """A lease for target (and session), waiting up to PROXYFLEET_WAIT for one while
        discovery says to try again. The waits are on the reactor, not in a thread:
        threads waiting for a slot would hold up the releases that free one."""
        clock = self._clock()
        deadline = clock.seconds() + self.wait
        result = defer.Deferred()
        backoff = [_FIRST_BACKOFF]

        def attempt():
            if self.closed:
                result.errback(IgnoreRequest("proxyfleet: the spider has closed; no lease is taken after that"))
                return
            call = threads.deferToThread(self.api.acquire, self.selector, target, session, self.ttl, 0)
            self._landing.add(call)
            call.addBoth(landed, call)

        def landed(outcome, call):
            self._landing.discard(call)
            if isinstance(outcome, Lease):
                if self.closed:
                    self._release([outcome])
                    result.errback(IgnoreRequest("proxyfleet: the spider closed while this request waited for a lease"))
                else:
                    if self.stats:
                        self.stats.inc_value("proxyfleet/leases")
                    result.callback(outcome)
                return None
            err = outcome.value
            pause = getattr(err, "retry_after", None)
            left = deadline - clock.seconds()
            if not isinstance(err, (NoProxy, Throttled, Unavailable)) or pause is None or self.closed or left <= 0:
                result.errback(outcome)
                return None
            if isinstance(err, NoProxy):
                # A 409's Retry-After is when a slot frees up by itself, a lease expiring:
                # up to a whole TTL away. Released leases free theirs far sooner, not
                # least this crawl's own per-request ones: try again after a short
                # backoff, and at once when one of this crawl's leases is released.
                pause = min(pause, backoff[0], left)
                backoff[0] = min(2 * backoff[0], _MAX_BACKOFF)
            elif pause > left:
                result.errback(outcome)  # asked sooner, discovery would refuse again
                return None
            self._wait(pause, attempt, result, wake=isinstance(err, NoProxy))
            return None

        attempt()
        return result

    def _clock(self):
        if self.clock is None:
            from twisted.internet import reactor

            self.clock = reactor
        return self.clock

    def _wait(self, pause, attempt, result, wake):
        token = next(self._tokens)

        def again():
            self._waiting.pop(token, None)
            attempt()

        self._waiting[token] = (self._clock().callLater(pause, again), again, result, wake)

    def _wake_one(self):
        """A lease of this crawl's was released: its slot is free now. The acquire that
        has waited longest for one tries again at once."""
        for token, (call, again, _, wake) in list(self._waiting.items()):
            if wake:
                call.cancel()
                again()
                return

    def _acquired(self, result, key):
        self.pending.pop(key, None)
        if isinstance(result, Lease):
            self.leases[key] = result
            return result
        err = result.value if hasattr(result, "value") else result
        if not isinstance(err, IgnoreRequest):
            log.warning("proxyfleet: no lease for %s: %s", key, err)
        return err

    def _use(self, request, key, lease: Lease):
        request.meta[META_KEY] = key
        request.meta[META_LEASE] = lease.id
        request.meta["proxy"] = lease.proxy_url

    def _own_lease(self, request, host):
        """A lease for this request alone: discovery's rotation gives the next request of
        the site another proxy, while one is free that is not resting for the site."""
        d = self._acquire(host, "")

        def use(lease):
            self.own[lease.id] = lease
            fin = weakref.finalize(request, self._orphaned, lease.id)
            fin.atexit = False  # at exit the reactor is gone: the lease expires on its own
            self._orphans[lease.id] = fin
            request.meta.pop(META_KEY, None)
            request.meta[META_OWN] = lease.id
            request.meta[META_LEASE] = lease.id
            request.meta["proxy"] = lease.proxy_url
            return None

        d.addCallback(use)
        return d

    def _orphaned(self, lease_id):
        # Called when the garbage collector frees the request, which can be in any thread.
        from twisted.internet import reactor

        reactor.callFromThread(self._release_orphan, lease_id)

    def _release_orphan(self, lease_id):
        self._orphans.pop(lease_id, None)
        lease = self.own.pop(lease_id, None)
        if lease is not None:
            self._release([lease])

    def _finish_own(self, request) -> Optional[Lease]:
        """The request's own lease, no longer listed as out; the caller releases it."""
        lease_id = request.meta.pop(META_OWN, None)
        if lease_id is None:
            return None
        fin = self._orphans.pop(lease_id, None)
        if fin is not None:
            fin.detach()
        return self.own.pop(lease_id, None)

    def _through_gateway(self, request):
        named = request.meta.get(META_SESSION)
        one_off = request.meta.pop(META_ONE_OFF, None)
        base = None
        if named:
            session = _session_name(named, 128)
        elif one_off:
            session = one_off
        elif self.per == "request":
            # No session: the gateway picks the proxy of each request (of each tunnel, for
            # HTTPS) by its rotation.
            session = None
        else:
            key = self._key(request)
            busy = self.lanes.setdefault(key, set())
            lane = 0
            while lane in busy:
                lane += 1
            busy.add(lane)
            request.meta[META_LANE] = lane
            base = f"{_session_name(key)}-{lane}"
            session = self._session_of(base)
        request.meta.pop(META_BASE, None)
        request.meta.pop(META_GW_SESSION, None)
        user = self.client_name
        if session:
            request.meta[META_GW_SESSION] = session
            user += f";session={session}"
            if base:
                request.meta[META_BASE] = base
        for k, v in sorted(self.selector.items()):
            user += f";{k}={v}"
        request.meta["proxy"] = "http://{}:{}@{}".format(
            urllib.parse.quote(user, safe=";="), urllib.parse.quote(self.token, safe=""), self.gateway)
        if not self.keepalive and urlparse_cached(request).scheme == "https":
            # A tunnel holds its proxy and a slot of it for as long as it is open, and
            # Scrapy keeps tunnels open for minutes: one tunnel per request rotates as
            # the gateway's plain requests do and frees the slot at once.
            request.headers[b"Connection"] = b"close"

    def _free_lane(self, request):
        lane = request.meta.pop(META_LANE, None)
        if lane is not None:
            self.lanes.get(self._key(request), set()).discard(lane)

    def process_exception(self, request, exception, spider):
        if request.meta.get(META_SKIP):
            return None
        self._free_lane(request)
        own = self._finish_own(request)
        if own is not None:
            self._release([own])
        return None

    def process_response(self, request, response, spider):
        if request.meta.get(META_SKIP):
            return response  # not through the fleet: nothing to report or send again
        self._free_lane(request)
        own = self._finish_own(request)
        banned = request.meta.get(META_BANNED) or response.status in self.ban_statuses
        if not banned:
            if own is not None:
                self._release([own])
            return response
        result = "rate_limited" if response.status == 429 else "banned"
        unattributed = self._unattributed(request)
        reported = self.report(request, result)
        if own is not None:
            # Released once discovery has the report: until then the lease keeps its slot,
            # so no other request of the site gets the proxy before it rests.
            if reported is None:
                self._release([own])
            else:
                reported.addBoth(lambda r: (self._release([own]), r)[1])
        base = request.meta.get(META_BASE)
        if self.gateway and base and request.meta.get(META_GW_SESSION) == self._session_of(base):
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
        for k in (META_BANNED, "proxy", META_GW_SESSION, META_LEASE, META_KEY, META_OWN):
            retry.meta.pop(k, None)
        retry.headers.pop(b"Proxy-Authorization", None)
        if unattributed:
            self._one_off(retry)
        if reported is None:
            return retry
        # Sent again once discovery has the report, so that it goes to another proxy.
        return reported.addBoth(lambda _: retry)

    def report(self, request, result: str):
        """Report how the request's site treated its proxy; for ``banned`` and
        ``rate_limited`` the proxy rests for the site, and the request's next attempt
        (or its slot's next request) takes another. Returns a Deferred that fires once
        discovery has the report, or None when there is nothing to send."""
        host = urlparse_cached(request).hostname or ""
        if self.stats:
            self.stats.inc_value(f"proxyfleet/reports/{result}")
        if self.gateway:
            if urlparse_cached(request).scheme == "http" and request.meta.get(META_BANNED) is None:
                return None  # the gateway saw the status itself and reported it
            session = request.meta.get(META_GW_SESSION)
            if not session:
                # The gateway chose the tunnel's proxy and nothing tells the crawler which.
                if self.stats:
                    self.stats.inc_value("proxyfleet/reports/unattributed")
                log.debug("proxyfleet: %s of %s not reported: no session names its proxy", result, request.url)
                return None
            if not self.url:
                return None
            call, args = self._api_for_gateway().report_session, (session, result, host)
        else:
            lease_id = request.meta.get(META_LEASE)
            if not lease_id:
                return None
            key = request.meta.get(META_KEY)
            current = self.leases.get(key) if key else None
            if current is not None and current.id == lease_id and result != "ok":
                # The proxy rests for this site now: the key's next request leases
                # another, and this one is released.
                del self.leases[key]
                self._release([current])
            call, args = self.api.report, (lease_id, result, host)
        d = threads.deferToThread(call, *args)
        d.addErrback(lambda f: log.warning("proxyfleet: report not recorded: %s", f.value))
        return d

    def _unattributed(self, request) -> bool:
        """Whether a ban of this request through the gateway can be reported by no one: it
        had no session, and the gateway did not see the answer (a tunnel's, or a page
        the spider judged)."""
        if not self.gateway or request.meta.get(META_GW_SESSION):
            return False
        return urlparse_cached(request).scheme != "http" or bool(request.meta.get(META_BANNED))

    def _one_off(self, request):
        """Sends the request's next attempt under a session of its own. The gateway's
        rotation favours the proxy with the fewest requests out, which is the one whose
        ban answers came back fastest: sent again without a session, a request the site
        banned went back to the same proxy, and no report could say so. A new session
        lands on the fleet by its name instead, and if it is banned again the report on
        the session names the proxy, which then rests for the site."""
        request.meta[META_ONE_OFF] = f"{self._one_off_prefix}-{next(self._one_offs)}"

    def _session_of(self, base: str) -> str:
        gen = self.generations.get(base, 0)
        return base + (f"~{gen}" if gen else "")

    def _api_for_gateway(self) -> Client:
        if self.api is None:
            self.api = Client(self.url, self.token)
        return self.api


# The waits between tries of an acquire that found every proxy busy: short, since slots
# free up as requests end, and capped so that a crawl waiting for the fleet asks discovery
# at most about once a second per waiting request.
_FIRST_BACKOFF, _MAX_BACKOFF = 0.05, 1.0

# The characters of a session name in the gateway username. Discovery takes ':' in session
# names too, but not here: HTTP Basic credentials end the username at the first ':', so one
# from an IPv6 host ("::1") cut the username short and the gateway answered 407. '~' is
# left out as well: it starts a lane's generation (see _session_of).
_SESSION_CHARS = frozenset(string.ascii_letters + string.digits + "._-")


def _session_name(key: str, limit: int = 100) -> str:
    """A session name from a slot key or a spider's session: at most limit characters (a
    lane and a generation are added to slot keys' names, up to discovery's 128)."""
    out = "".join(c if c in _SESSION_CHARS else "-" for c in key)[:limit]
    return out or "default"
