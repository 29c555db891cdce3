"""Crawl through a proxyfleet fleet from Python.

``proxyfleet.client`` speaks discovery's lease API with the standard library alone;
``proxyfleet.scrapy`` is a Scrapy downloader middleware that leases proxies per download
slot, or sends everything through the gateway with sessions.
"""

from .client import (
    Client,
    Lease,
    LeaseGone,
    NoProxy,
    ProxyfleetError,
    Throttled,
    Unavailable,
)

__all__ = ["Client", "Lease", "LeaseGone", "NoProxy", "ProxyfleetError", "Throttled", "Unavailable"]
