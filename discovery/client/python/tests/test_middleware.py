"""The Scrapy middleware on its own, with discovery's API faked: what it asks for, when,
and what it sends. No reactor runs here: the calls the middleware makes in threads are
queued, and land when a test says so, in the order it chooses. These run without a
proxyfleet (test_scrapy.py crawls through a real one)."""

import base64

import pytest

pytest.importorskip("scrapy")

from scrapy import Request  # noqa: E402
from scrapy.downloadermiddlewares.httpproxy import HttpProxyMiddleware  # noqa: E402
from scrapy.exceptions import IgnoreRequest  # noqa: E402
from scrapy.http import Response  # noqa: E402
from scrapy.settings import Settings  # noqa: E402
from twisted.internet import defer  # noqa: E402

import proxyfleet.scrapy as pfscrapy  # noqa: E402
from conftest import ipv6_request  # noqa: E402
from proxyfleet import Lease, NoProxy  # noqa: E402
from twisted.internet import task  # noqa: E402

TOKEN = "secret-token-0123456789"


class FakeAPI:
    """Discovery's lease API: a new proxy for every lease, as its rotation gives one."""

    def __init__(self):
        self.acquired, self.released, self.reports, self.calls = [], [], [], []
        self.full = 0  # how many of the next acquires find every proxy at capacity

    def acquire(self, selector=None, target="", session="", ttl=None, wait=0.0):
        if self.full:
            self.full -= 1
            self.calls.append(("refused", target, session))
            # As discovery answers when every slot is leased: the first frees up by itself
            # when a lease expires, a whole TTL away.
            raise NoProxy(409, "no_match", "no proxy available: 8 at capacity", 280.0)
        n = len(self.acquired) + 1
        lease = Lease(id=f"lease-{n}", proxy_url=f"http://user:pw@127.0.0.1:{10000 + n}",
                      proxy={"namespace": "t", "name": f"p{n}"}, expires_at="", ttl=ttl or 300,
                      target=target, session=session)
        self.acquired.append(lease)
        self.calls.append(("acquire", target, session))
        return lease

    def release(self, lease_id):
        self.released.append(lease_id)
        self.calls.append(("release", lease_id))

    def report(self, lease_id, result, target=""):
        self.reports.append((lease_id, result, target))
        self.calls.append(("report", lease_id))

    def report_session(self, session, result, target=""):
        self.reports.append((session, result, target))
        self.calls.append(("report_session", session))


class Threads:
    """Stands in for twisted.internet.threads: a call lands when the test lands it."""

    def __init__(self):
        self.queued = []

    def deferToThread(self, f, *args, **kwargs):
        d = defer.Deferred()
        self.queued.append((f, args, kwargs, d))
        return d

    def land(self):
        """Runs every queued call, and those they queue, in order."""
        while self.queued:
            f, args, kwargs, d = self.queued.pop(0)
            try:
                result = f(*args, **kwargs)
            except Exception as e:  # noqa: BLE001: handed on as the thread's failure
                d.errback(e)
            else:
                d.callback(result)


@pytest.fixture
def threads(monkeypatch):
    t = Threads()
    monkeypatch.setattr(pfscrapy, "threads", t)
    return t


def middleware(gateway=False, **settings):
    values = {"PROXYFLEET_URL": "http://127.0.0.1:1", "PROXYFLEET_TOKEN": TOKEN}
    if gateway:
        values["PROXYFLEET_GATEWAY"] = "127.0.0.1:2"
    values.update(settings)
    mw = pfscrapy.ProxyfleetMiddleware(Settings(values))
    mw.api = FakeAPI()
    return mw


def outcome(d):
    """What a Deferred fired with: ("ok", value) or ("failed", exception type)."""
    got = []
    d.addCallbacks(lambda v: got.append(("ok", v)), lambda f: got.append(("failed", f.type)))
    assert got, "the Deferred has not fired"
    return got[0]


def outcome_or_value(x):
    """A middleware's answer, whether it gave it at once or as a fired Deferred."""
    if isinstance(x, defer.Deferred):
        kind, value = outcome(x)
        assert kind == "ok", value
        return value
    return x


def gateway_credentials(request):
    """The username and password Scrapy sends to the gateway for request, decoded the way
    the gateway decodes HTTP Basic: the username ends at the first ':'."""
    HttpProxyMiddleware().process_request(request, None)
    raw = base64.b64decode(request.headers[b"Proxy-Authorization"].split()[1]).decode()
    return raw.split(":", 1)


# -- spread by default -------------------------------------------------------------------


def test_leases_each_request_has_its_own_released_with_its_answer(threads):
    mw = middleware()
    reqs = [Request(f"http://127.0.0.1:8000/{i}") for i in range(3)]
    waiting = [mw.process_request(r, None) for r in reqs]
    threads.land()
    assert all(outcome(d) == ("ok", None) for d in waiting)
    assert [c[0] for c in mw.api.calls] == ["acquire"] * 3, "a lease per request, not one for the site"
    assert len({r.meta["proxy"] for r in reqs}) == 3, "each request goes through its own lease's proxy"
    assert mw.api.calls[0][1] == "127.0.0.1", "the lease names the site, so its cooldowns apply"

    assert mw.process_response(reqs[1], Response(reqs[1].url, status=200, request=reqs[1]), None).status == 200
    mw.process_exception(reqs[0], ConnectionError("reset"), None)
    threads.land()
    assert mw.api.released == ["lease-2", "lease-1"], "released as soon as its answer (or failure) is in"
    closed = mw.spider_closed(None)
    threads.land()
    assert mw.api.released == ["lease-2", "lease-1", "lease-3"], "the one still in flight at the close too"
    assert outcome(closed)[0] == "ok"


def test_leases_a_request_finding_the_fleet_full_waits_for_a_slot(threads):
    """Every slot leased (Retry-After: when a lease expires, minutes away): the request
    waits, and tries again at once when one of the crawl's own leases is released, or
    after a short backoff, within PROXYFLEET_WAIT."""
    mw = middleware()
    mw.clock = task.Clock()
    first = Request("http://127.0.0.1:8000/1")
    mw.process_request(first, None)
    threads.land()
    mw.api.full = 1
    second = Request("http://127.0.0.1:8000/2")
    waiting = mw.process_request(second, None)
    threads.land()
    assert [c[0] for c in mw.api.calls] == ["acquire", "refused"]
    assert not waiting.called, "it waits rather than fail"
    mw.process_response(first, Response(first.url, status=200, request=first), None)
    threads.land()  # the release, then the acquire it wakes
    assert [c[0] for c in mw.api.calls] == ["acquire", "refused", "release", "acquire"]
    assert outcome(waiting) == ("ok", None) and second.meta["proxy"].endswith(":10002")

    # With no lease of its own coming free, it tries again after a short pause.
    mw.api.full = 2
    third = Request("http://127.0.0.1:8000/3")
    waiting = mw.process_request(third, None)
    threads.land()
    mw.clock.advance(0.05)
    threads.land()
    assert not waiting.called
    mw.clock.advance(0.1)
    threads.land()
    assert outcome(waiting) == ("ok", None)
    assert [c[0] for c in mw.api.calls][-3:] == ["refused", "refused", "acquire"], "backing off: 0.05 s, then 0.1 s"


def test_leases_a_wait_ends_at_the_close_or_at_proxyfleet_wait(threads):
    mw = middleware(PROXYFLEET_WAIT=1)
    mw.clock = task.Clock()
    mw.api.full = 100
    waiting = mw.process_request(Request("http://127.0.0.1:8000/1"), None)
    threads.land()
    for _ in range(20):
        mw.clock.advance(0.25)
        threads.land()
    assert outcome(waiting) == ("failed", NoProxy), "PROXYFLEET_WAIT passed"
    refused = mw.api.calls.count(("refused", "127.0.0.1", ""))
    assert 3 <= refused <= 12, refused

    waiting = mw.process_request(Request("http://127.0.0.1:8000/2"), None)
    threads.land()
    mw.spider_closed(None)
    threads.land()
    assert outcome(waiting) == ("failed", IgnoreRequest)
    mw.clock.advance(5)
    threads.land()
    assert mw.api.calls.count(("refused", "127.0.0.1", "")) == refused + 1, "no try after the close"


def test_leases_a_ban_is_reported_before_the_lease_is_released_and_the_request_sent_again(threads):
    mw = middleware()
    req = Request("http://127.0.0.1:8000/x")
    mw.process_request(req, None)
    threads.land()
    out = mw.process_response(req, Response(req.url, status=403, request=req), None)
    threads.land()
    assert mw.api.calls[1:] == [("report", "lease-1"), ("release", "lease-1")], (
        "the proxy rests for the site before its slot is free for the retry")
    kind, retry = outcome(out)
    assert kind == "ok" and isinstance(retry, Request) and "proxy" not in retry.meta


def test_leases_a_request_the_spider_marks_banned_reports_the_proxy_that_carried_it(threads):
    """A ban Scrapy sees no status for (a captcha page): the spider sets
    meta["proxyfleet_banned"] and yields the request again. The report names the proxy of
    the answer it judged, not the one its new attempt gets."""
    mw = middleware()
    req = Request("http://127.0.0.1:8000/x", dont_filter=True)
    mw.process_request(req, None)
    threads.land()
    assert mw.process_response(req, Response(req.url, status=200, request=req), None).status == 200
    threads.land()
    req.meta["proxyfleet_banned"] = True  # the spider's judgement, and the request again
    again = mw.process_request(req, None)
    threads.land()
    assert outcome(again) == ("ok", None)
    assert mw.api.reports == [("lease-1", "banned", "127.0.0.1")]
    assert req.meta["proxy"].endswith(":10002"), "the new attempt has a lease of its own"
    assert "proxyfleet_banned" not in req.meta, "reported once"


def test_gateway_sends_no_session_so_the_gateway_picks_per_request():
    mw = middleware(gateway=True, PROXYFLEET_SELECTOR={"region": "eu"})
    users = set()
    for i in range(4):
        req = Request(f"https://shop.example/{i}")
        assert mw.process_request(req, None) is None
        user, password = gateway_credentials(req)
        users.add(user)
        assert password == TOKEN
        assert req.headers[b"Connection"] == b"close", "a tunnel per request: each is a new pick"
    assert users == {"default;region=eu"}


def test_gateway_a_tunnel_ban_is_sent_again_under_a_session_of_its_own(threads):
    """Without a session nothing names the proxy of a tunnel: the retry goes under a
    one-off session, so that a second ban names its proxy, and that proxy rests. A retry
    after a ban that was reported needs none."""
    mw = middleware(gateway=True)
    req = Request("https://shop.example/x")
    mw.process_request(req, None)
    assert gateway_credentials(req)[0] == "default"
    retry = outcome_or_value(mw.process_response(req, Response(req.url, status=403, request=req), None))
    assert mw.api.reports == [] and threads.queued == [], "nothing to report the first ban on"
    mw.process_request(retry, None)
    first_retry = gateway_credentials(retry)[0]
    assert first_retry.startswith("default;session=once-"), first_retry

    again = mw.process_response(retry, Response(retry.url, status=403, request=retry), None)
    threads.land()
    session = first_retry.split("=", 1)[1]
    assert mw.api.reports == [(session, "banned", "shop.example")], "the second ban is reported on its session"
    again = outcome_or_value(again)
    mw.process_request(again, None)
    assert gateway_credentials(again)[0] == "default", (
        "the proxy that banned it rests for the site: the gateway's rotation passes over it")

    # Plain HTTP: the gateway saw the 403 and reported it; the retry needs no session.
    plain = Request("http://shop.example/y")
    mw.process_request(plain, None)
    retry = outcome_or_value(mw.process_response(plain, Response(plain.url, status=403, request=plain), None))
    mw.process_request(retry, None)
    assert gateway_credentials(retry)[0] == "default"


def test_gateway_sticky_per_slot_and_named_sessions():
    mw = middleware(gateway=True, PROXYFLEET_LEASE_PER="slot")
    a, b = Request("http://shop.example/a"), Request("http://shop.example/b")
    mw.process_request(a, None)
    mw.process_request(b, None)
    assert gateway_credentials(a)[0] == "default;session=shop.example-0"
    assert gateway_credentials(b)[0] == "default;session=shop.example-1", "one request in flight per session"
    mw.process_response(a, Response(a.url, status=200, request=a), None)
    c = Request("http://shop.example/c")
    mw.process_request(c, None)
    assert gateway_credentials(c)[0] == "default;session=shop.example-0"

    mw = middleware(gateway=True)  # spread by default, a session when a request names one
    named = Request("http://shop.example/basket", meta={"proxyfleet_session": "basket-7"})
    mw.process_request(named, None)
    assert gateway_credentials(named)[0] == "default;session=basket-7"


def test_leases_named_session_holds_one_lease(threads):
    mw = middleware()
    reqs = [Request(f"http://shop.example/{i}", meta={"proxyfleet_session": "basket-7"}) for i in range(3)]
    waiting = [mw.process_request(r, None) for r in reqs]
    threads.land()
    assert all(outcome(d) == ("ok", None) for d in waiting)
    assert mw.api.calls == [("acquire", "shop.example", "basket-7")], "one lease for the session, shared"
    for r in reqs:
        mw.process_response(r, Response(r.url, status=200, request=r), None)
    threads.land()
    assert mw.api.released == [], "held for the session until the spider closes"
    mw.spider_closed(None)
    threads.land()
    assert mw.api.released == ["lease-1"]


# -- IPv6 sites through the gateway ------------------------------------------------------


@pytest.mark.parametrize("url,meta", [
    ("http://[::1]:8080/page", {}),
    ("https://[::1]/page", {}),
    ("http://[2001:db8::7]/page", {}),
    ("http://127.0.0.1:8080/page", {"download_slot": "[::1]:8080"}),
    ("http://127.0.0.1:8080/page", {"proxyfleet_session": "cart:7"}),
])
@pytest.mark.parametrize("per", ["slot", "domain"])
def test_gateway_username_of_an_ipv6_site_has_no_colon(url, meta, per):
    """HTTP Basic ends the username at the first ':'; one from an IPv6 host in a session
    name cut the username there, and the gateway answered 407."""
    mw = middleware(gateway=True, PROXYFLEET_LEASE_PER=per)
    req = ipv6_request(url, meta=dict(meta))
    assert mw.process_request(req, None) is None
    user, password = gateway_credentials(req)
    assert password == TOKEN
    assert user.startswith("default;session=") and len(user) > len("default;session="), user
    assert ":" not in user


# -- the spider's close ------------------------------------------------------------------


@pytest.mark.parametrize("per", [None, "slot"])
def test_a_lease_that_lands_after_the_close_is_released(threads, per):
    mw = middleware(**({"PROXYFLEET_LEASE_PER": per} if per else {}))
    waiting = mw.process_request(Request("http://127.0.0.1:8000/a"), None)
    assert len(threads.queued) == 1, "the acquire is on its way"
    closed = mw.spider_closed(None)
    threads.land()  # discovery grants it only now
    assert [lease.id for lease in mw.api.acquired] == ["lease-1"]
    assert mw.api.released == ["lease-1"], "a lease granted after the close is released at once"
    assert outcome(waiting) == ("failed", IgnoreRequest), "and nothing goes out through it"
    assert closed is not None and outcome(closed)[0] == "ok", "the close waits for it"


@pytest.mark.parametrize("per", [None, "slot"])
def test_no_lease_is_taken_after_the_close(threads, per):
    mw = middleware(**({"PROXYFLEET_LEASE_PER": per} if per else {}))
    mw.spider_closed(None)
    with pytest.raises(IgnoreRequest):
        mw.process_request(Request("http://127.0.0.1:8000/late"), None)
    threads.land()
    assert mw.api.acquired == []
