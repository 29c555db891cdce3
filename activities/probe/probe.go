// Package probe checks a forward proxy the way a crawler uses it: by sending a request
// through it. For an https target that means CONNECT through the proxy and TLS inside the
// tunnel; for http, a proxied GET with an absolute URI.
//
// Every probe dials a new connection and closes it: a kept-alive tunnel would let later
// probes pass through a proxy that no longer accepts connections. The request is written by
// hand, so nothing but what is written here (no trace headers, no cookies) reaches the
// target, and each failure is named precisely.
package probe

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// Kind names why a probe failed.
type Kind string

// Failure kinds, used in status messages and as a metric label (a closed set).
const (
	KindNone        Kind = ""
	KindRefused     Kind = "refused"
	KindTimeout     Kind = "timeout"
	KindDNS         Kind = "dns"
	KindProxyAuth   Kind = "proxy_auth"
	KindBadGateway  Kind = "bad_gateway"
	KindProxyError  Kind = "proxy_error"
	KindTLS         Kind = "tls"
	KindWrongStatus Kind = "wrong_status"
	KindOther       Kind = "other"
)

// Kinds lists every failure kind, for metrics that pre-create their series.
var Kinds = []Kind{KindRefused, KindTimeout, KindDNS, KindProxyAuth, KindBadGateway, KindProxyError, KindTLS, KindWrongStatus, KindOther}

// Request is one probe.
type Request struct {
	// Proxy is the proxy's host:port.
	Proxy string
	// URL is the target, http or https.
	URL string
	// Timeout bounds the whole probe (default 5s).
	Timeout time.Duration
	// ExpectedStatus is the status the target must answer (default 200).
	ExpectedStatus int
	// TLSConfig verifies https targets; nil uses the system roots.
	TLSConfig *tls.Config
	// Credentials are sent as Proxy-Authorization (basic) on the request or the CONNECT;
	// empty sends none.
	Credentials proxyauth.Credentials
}

// Result is the outcome of one probe.
type Result struct {
	OK      bool          `json:"ok"`
	Latency time.Duration `json:"latency"`
	Status  int           `json:"status,omitempty"`
	Kind    Kind          `json:"kind,omitempty"`
	// Message says what failed, in words fit for a status condition.
	Message string `json:"message,omitempty"`
	// TargetFailed says the proxy did its part and the target did not: the proxy answered
	// that it could not reach the target (502, 503 or 504), or opened the tunnel and then
	// the target's TLS or answer failed or came too late, or the target answered another
	// status than expected. A Kind alone cannot say it: a timeout is the proxy's when it
	// never answers and the target's inside an open tunnel. Monitor shards count these
	// failures per target, so a target that is down for every proxy is told from proxies
	// that are down (see activities/targets.go).
	TargetFailed bool `json:"targetFailed,omitempty"`
}

// Prober sends probes; its zero value is ready to use.
type Prober struct {
	// TLSConfig is used when a Request has none (tests trust their local CA through it).
	TLSConfig *tls.Config
}

// Probe sends req.
func (p Prober) Probe(ctx context.Context, req Request) Result {
	if req.TLSConfig == nil {
		req.TLSConfig = p.TLSConfig
	}
	return Probe(ctx, req)
}

// Probe sends one request through the proxy and reports what happened.
func Probe(ctx context.Context, req Request) Result {
	if req.Timeout <= 0 {
		req.Timeout = 5 * time.Second
	}
	if req.ExpectedStatus == 0 {
		req.ExpectedStatus = http.StatusOK
	}
	target, err := url.Parse(req.URL)
	if err != nil || (target.Scheme != "http" && target.Scheme != "https") || target.Host == "" {
		return Result{Kind: KindOther, Message: fmt.Sprintf("bad probe URL %q", req.URL)}
	}
	ctx, cancel := context.WithTimeout(ctx, req.Timeout)
	defer cancel()
	start := time.Now()
	status, kind, beyond, err := roundTrip(ctx, req, target)
	res := Result{Latency: time.Since(start), Status: status}
	switch {
	case err != nil:
		res.Kind, res.Message, res.TargetFailed = kind, err.Error(), beyond
		if ctx.Err() != nil || isTimeout(err) {
			res.Kind = KindTimeout
			res.Message = fmt.Sprintf("no answer through %s within %s", req.Proxy, req.Timeout)
			if beyond {
				res.Message = fmt.Sprintf("the proxy %s opened a tunnel, but %s did not answer through it within %s", req.Proxy, target.Host, req.Timeout)
			}
		}
	case status != req.ExpectedStatus:
		// Through a tunnel the status is the target's own. Through a plain http proxy it
		// may be the proxy's own page: only a gateway error (502, 503, 504: the proxy
		// could not get the target's) is the target's failure; anything else (a 403 for a
		// destination the proxy refuses, an account suspended) is the proxy's.
		res.Kind, res.TargetFailed = KindWrongStatus, target.Scheme == "https" || gatewayError(status)
		res.Message = fmt.Sprintf("target %s answered %d, want %d", target.Host, status, req.ExpectedStatus)
	default:
		res.OK = true
	}
	return res
}

// gatewayError reports a status a proxy answers when it could not get the target's answer.
func gatewayError(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

// roundTrip sends the probe. beyond says a failure happened past the proxy (see
// Result.TargetFailed); a failure before the proxy answered is the proxy's, even a timeout
// waiting for an http answer: a hung proxy and a hung target look the same from here.
func roundTrip(ctx context.Context, req Request, target *url.URL) (status int, kind Kind, beyond bool, err error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", req.Proxy)
	if err != nil {
		return 0, dialKind(err), false, fmt.Errorf("connect to proxy %s: %w", req.Proxy, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// Closing the connection is how a cancelled probe unblocks a pending read.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	br := bufio.NewReader(conn)
	if target.Scheme == "http" {
		get, _ := http.NewRequest(http.MethodGet, target.String(), nil)
		get.Header.Set("User-Agent", "proxyfleet-probe")
		authorize(get.Header, req.Credentials)
		get.Close = true
		if err := get.WriteProxy(conn); err != nil {
			return 0, KindOther, false, fmt.Errorf("send request to proxy: %w", err)
		}
		resp, err := http.ReadResponse(br, get)
		if err != nil {
			return 0, KindProxyError, false, fmt.Errorf("read answer from proxy: %w", err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusProxyAuthRequired:
			return resp.StatusCode, KindProxyAuth, false, authError(req.Credentials)
		case http.StatusBadGateway, http.StatusGatewayTimeout:
			return resp.StatusCode, KindBadGateway, true, fmt.Errorf("proxy could not reach %s (%d)", target.Host, resp.StatusCode)
		}
		return resp.StatusCode, KindNone, false, nil
	}

	host := target.Host
	if target.Port() == "" {
		host = net.JoinHostPort(target.Hostname(), "443")
	}
	connect := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: host}, Host: host, Header: http.Header{}}
	authorize(connect.Header, req.Credentials)
	if err := connect.Write(conn); err != nil {
		return 0, KindOther, false, fmt.Errorf("send CONNECT to proxy: %w", err)
	}
	resp, err := http.ReadResponse(br, connect)
	if err != nil {
		return 0, KindProxyError, false, fmt.Errorf("read CONNECT answer from proxy: %w", err)
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusProxyAuthRequired:
		return 0, KindProxyAuth, false, authError(req.Credentials)
	case resp.StatusCode == http.StatusForbidden:
		// The proxy's own policy, not the target's state: kept on the proxy's side.
		return 0, KindProxyError, false, fmt.Errorf("proxy refused CONNECT to %s (403): the destination or its port is not allowed (a Managed proxy's spec.egress)", host)
	case resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusGatewayTimeout || resp.StatusCode == http.StatusServiceUnavailable:
		return 0, KindBadGateway, true, fmt.Errorf("proxy could not open a tunnel to %s (%d)", host, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return 0, KindProxyError, false, fmt.Errorf("proxy refused CONNECT to %s (%d)", host, resp.StatusCode)
	}
	if br.Buffered() > 0 {
		return 0, KindProxyError, false, errors.New("proxy sent data before the tunnel opened")
	}
	// From here the tunnel is open: the proxy did its part, and whatever fails is the
	// target's (or the path from the proxy to it).

	cfg := &tls.Config{}
	if req.TLSConfig != nil {
		cfg = req.TLSConfig.Clone()
	}
	cfg.ServerName = target.Hostname()
	tconn := tls.Client(conn, cfg)
	if err := tconn.HandshakeContext(ctx); err != nil {
		return 0, KindTLS, true, fmt.Errorf("TLS with %s through the proxy: %w", target.Hostname(), err)
	}
	get, _ := http.NewRequest(http.MethodGet, target.String(), nil)
	get.Header.Set("User-Agent", "proxyfleet-probe")
	get.Close = true
	if err := get.Write(tconn); err != nil {
		return 0, KindOther, true, fmt.Errorf("send request through the tunnel: %w", err)
	}
	tresp, err := http.ReadResponse(bufio.NewReader(tconn), get)
	if err != nil {
		return 0, KindOther, true, fmt.Errorf("read answer through the tunnel: %w", err)
	}
	tresp.Body.Close()
	return tresp.StatusCode, KindNone, false, nil
}

// authorize adds the proxy credentials, if any.
func authorize(h http.Header, c proxyauth.Credentials) {
	if !c.Empty() {
		h.Set("Proxy-Authorization", c.Header())
	}
}

// authError says whether the proxy wanted credentials or refused the ones sent. Neither
// message carries the credentials.
func authError(c proxyauth.Credentials) error {
	if c.Empty() {
		return errors.New("proxy asks for authentication (407) and none is configured")
	}
	return fmt.Errorf("proxy refused the credentials of user %q (407)", c.Username)
}

func dialKind(err error) Kind {
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr):
		return KindDNS
	case errors.Is(err, syscall.ECONNREFUSED):
		return KindRefused
	case isTimeout(err):
		return KindTimeout
	default:
		return KindOther
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
