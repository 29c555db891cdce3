// Package client is the crawler side of the discovery API: list proxies, lease one, renew
// and release the lease, and report how a target site treated it.
//
// It depends on the standard library only, so a crawler does not pull in Gin, Temporal or
// Kubernetes by importing it. That is why it declares its own copies of the wire types
// instead of using package discovery's; a test marshals the server's types and decodes them
// strictly into these (and the other way round for requests), so the two cannot drift apart
// silently. docs/api.md describes the API itself.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// Results a crawler reports for a target.
const (
	// ResultOK records a success; it changes nothing on the server.
	ResultOK = "ok"
	// ResultRateLimited rests the proxy for the target (5 minutes by default).
	ResultRateLimited = "rate_limited"
	// ResultBanned rests the proxy for the target longer (30 minutes by default) and counts
	// toward replacing a proxy banned on too many targets.
	ResultBanned = "banned"
)

// Error codes of the API (Error.Code): the server's own table (package codes), which also
// gives each one's status.
const (
	CodeInvalid         = codes.Invalid
	CodeInvalidResult   = codes.InvalidResult
	CodeInvalidSelector = codes.InvalidSelector
	CodeUnauthorized    = codes.Unauthorized
	CodeNotFound        = codes.NotFound
	CodeUnknownLease    = codes.UnknownLease
	CodeLeaseExpired    = codes.LeaseExpired
	// CodeProxyGone (410) means the lease ended because its proxy can no longer serve it:
	// Error.Reason says whether it was replaced (a new instance, so another egress IP),
	// turned unhealthy or left the fleet. Acquire a new lease (Held does).
	CodeProxyGone = codes.ProxyGone
	// CodeReportLimit (429) means the lease has reported as many cooldowns as a lease
	// may; report further ones on a new lease.
	CodeReportLimit      = codes.ReportLimit
	CodeNoMatch          = codes.NoMatch
	CodeTooLarge         = codes.TooLarge
	CodeMethodNotAllowed = codes.MethodNotAllowed
	CodeInternal         = codes.Internal
	// CodeIndexLoading (503) means discovery has not loaded its proxy index from Temporal
	// since it started (Temporal may be unreachable): an answer now could only say "no
	// proxies", which would not be true. See IsIndexLoading.
	CodeIndexLoading = codes.IndexLoading
	// CodeReplicasUnavailable (503) means the discovery replica that must answer (the one
	// that owns the lease or the proxy) is restarting or unreachable for a moment. Nothing
	// is lost: retry the same call after Retry-After. See IsReplicasUnavailable.
	CodeReplicasUnavailable = codes.ReplicasUnavailable
	// CodeTooManyRequests (429) means this client is over its requests per second, and
	// CodeLeaseLimit (429) that it holds as many leases as it may (release one). Both
	// come with a Retry-After. See IsThrottled.
	CodeTooManyRequests = codes.TooManyRequests
	CodeLeaseLimit      = codes.LeaseLimit
)

// defaultHTTPClient keeps enough idle connections for a crawler's goroutines: with the
// standard library's default of 2 per host, a crawler leasing from 64 goroutines opens and
// closes a connection for most calls, which costs both sides far more than the calls.
var defaultHTTPClient = func() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return &http.Client{Transport: t}
}()

// Client talks to one discovery server. It is safe for concurrent use.
type Client struct {
	base  string
	token string
	hc    *http.Client
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client used to reach discovery (default: one shared by the
// Clients of this package, which keeps up to 64 idle connections per server). It is not
// the client that goes through a leased proxy: see Lease.HTTPClient.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// New returns a client of the server at baseURL (for example http://127.0.0.1:8090).
// token is the bearer token; empty sends none, for a server without authentication.
func New(baseURL, token string, opts ...Option) *Client {
	c := &Client{base: strings.TrimRight(baseURL, "/"), token: token, hc: defaultHTTPClient}
	for _, o := range opts {
		o(c)
	}
	return c
}

// --- wire types ----------------------------------------------------------------------

// Proxy is a proxy as the API shows it. Listings never carry credentials: a proxy that
// takes them is only usable through a Lease (see LeasedProxy).
type Proxy struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// URL is http://IP:Port; in a lease, with the credentials as userinfo.
	URL           string            `json:"url"`
	IP            string            `json:"ip"`
	Port          int32             `json:"port"`
	Attributes    map[string]string `json:"attributes"`
	LatencyMillis int64             `json:"latencyMillis"`
}

// ListedProxy is an entry of a listing.
type ListedProxy struct {
	Proxy
	Healthy      bool   `json:"healthy"`
	Phase        string `json:"phase"`
	ActiveLeases int    `json:"activeLeases"`
	MaxLeases    int    `json:"maxLeases"`
	// Cooldowns are the sites the proxy rests for now, after rate_limited or banned
	// reports, with when each rest ends; "*" is every site.
	Cooldowns map[string]time.Time `json:"cooldowns,omitempty"`
}

// ProxyList is the answer of ListProxies.
type ProxyList struct {
	Proxies []ListedProxy `json:"proxies"`
	Count   int           `json:"count"`
}

// LeasedProxy is the proxy of a lease, with the credentials it takes: Username and
// Password, also in URL as userinfo. Both are empty for a proxy that takes none.
//
// Printing or logging (slog) a LeasedProxy or a Lease shows the password redacted;
// Lease.ProxyURL and the fields have it, for the requests that need it.
type LeasedProxy struct {
	Proxy
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// String shows the proxy with its password redacted.
func (p LeasedProxy) String() string {
	return p.Namespace + "/" + p.Name + " at " + redactURL(p.URL)
}

// GoString shows the proxy with its password redacted, for %#v.
func (p LeasedProxy) GoString() string { return "client.LeasedProxy{" + p.String() + "}" }

// LogValue shows the proxy with its password redacted, for slog (whose JSON handler would
// otherwise marshal it whole).
func (p LeasedProxy) LogValue() slog.Value {
	return slog.GroupValue(slog.String("namespace", p.Namespace), slog.String("name", p.Name),
		slog.String("url", redactURL(p.URL)), slog.String("username", p.Username))
}

// redactURL hides the password of a proxy URL.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(invalid url)"
	}
	return u.Redacted()
}

// Lease is a proxy held by this crawler until ExpiresAt.
type Lease struct {
	ID        string      `json:"leaseID"`
	Proxy     LeasedProxy `json:"proxy"`
	ExpiresAt time.Time   `json:"expiresAt"`
	// TTLSeconds is the TTL the lease was granted or last renewed for.
	TTLSeconds int `json:"ttlSeconds"`
	// Target is the site the lease was acquired for, if any.
	Target string `json:"target,omitempty"`
	// Session is the sticky session the lease was acquired for, if any.
	Session string `json:"session,omitempty"`
}

// String shows the lease with the proxy's password redacted.
func (l Lease) String() string {
	return "lease " + l.ID + " of " + l.Proxy.String() + " until " + l.ExpiresAt.Format(time.RFC3339)
}

// GoString shows the lease with the proxy's password redacted, for %#v.
func (l Lease) GoString() string { return "client.Lease{" + l.String() + "}" }

// LogValue shows the lease with the proxy's password redacted, for slog.
func (l Lease) LogValue() slog.Value {
	return slog.GroupValue(slog.String("id", l.ID), slog.Any("proxy", l.Proxy), slog.Time("expiresAt", l.ExpiresAt),
		slog.Int("ttlSeconds", l.TTLSeconds), slog.String("target", l.Target))
}

// leaseRequest, renewRequest and reportRequest are the request bodies. Zero fields are
// left out: the server treats a missing ttlSeconds as its default TTL.
type leaseRequest struct {
	Selector   map[string]string `json:"selector,omitempty"`
	TTLSeconds int               `json:"ttlSeconds,omitempty"`
	Target     string            `json:"target,omitempty"`
	Session    string            `json:"session,omitempty"`
	// WaitSeconds is AcquireRequest.Wait.
	WaitSeconds int `json:"waitSeconds,omitempty"`
}

type renewRequest struct {
	TTLSeconds int `json:"ttlSeconds,omitempty"`
}

type reportRequest struct {
	Result string `json:"result"`
	Target string `json:"target,omitempty"`
}

// Error is an error answer of the API.
type Error struct {
	// Status is the HTTP status code.
	Status int `json:"-"`
	// Code is the API's error code (the Code constants); empty when the body was not an
	// API error, for example from a load balancer in between.
	Code    string `json:"error"`
	Message string `json:"message"`
	// For CodeNoMatch (409): Considered proxies match the selector, and each of them is
	// counted in exactly one of Unhealthy, AtCapacity (every lease slot taken) or
	// InCooldown (resting for the requested target after a report).
	Considered int `json:"considered"`
	AtCapacity int `json:"atCapacity"`
	InCooldown int `json:"inCooldown"`
	Unhealthy  int `json:"unhealthy"`
	// Reason says why, for CodeProxyGone.
	Reason string `json:"reason"`
	// RetryAfterSeconds is how long to wait before the same request can succeed, when the
	// server knows (the Retry-After header): for CodeNoMatch, when the first matching
	// proxy frees a slot or ends its cooldown; for CodeIndexLoading, a second. Zero when
	// waiting alone would not help.
	RetryAfterSeconds int `json:"retryAfterSeconds"`
}

// RetryAfter is RetryAfterSeconds as a duration.
func (e *Error) RetryAfter() time.Duration { return time.Duration(e.RetryAfterSeconds) * time.Second }

func (e *Error) Error() string {
	code := e.Code
	if code == "" {
		code = strconv.Itoa(e.Status)
	}
	return "discovery: " + code + ": " + e.Message
}

// IsNoMatch reports whether err says no proxy could be leased right now (409). The Error's
// counts say why: wait and retry when proxies are at capacity or in cooldown, widen the
// selector when none match.
func IsNoMatch(err error) bool { return hasCode(err, CodeNoMatch) }

// IsLeaseGone reports whether err says the lease is no longer usable: it expired (410),
// its proxy can no longer serve it (410, IsProxyGone) or the server does not know it
// (404). Acquire a new lease.
func IsLeaseGone(err error) bool {
	return hasCode(err, CodeLeaseExpired) || hasCode(err, CodeUnknownLease) || IsProxyGone(err)
}

// IsProxyGone reports whether err says a renewal found the lease's proxy replaced,
// unhealthy or removed, and ended the lease; the Error's Reason says which.
func IsProxyGone(err error) bool { return hasCode(err, CodeProxyGone) }

// IsIndexLoading reports whether err says discovery is still loading its proxy index from
// Temporal (503), as it does for a moment after every restart. It says nothing about the
// fleet or the request: retry the same call after a short wait (the server's Retry-After is
// 1 second) instead of treating it as "no proxies". Leases held before the restart of a
// discovery running alone are gone (they answer unknown_lease); replicas keep them.
func IsIndexLoading(err error) bool { return hasCode(err, CodeIndexLoading) }

// IsReplicasUnavailable reports whether err says the discovery replica that must answer
// is restarting or unreachable for a moment (503): the lease is not lost, retry the same
// call after the Error's RetryAfter.
func IsReplicasUnavailable(err error) bool { return hasCode(err, CodeReplicasUnavailable) }

// IsThrottled reports whether err says this client is over one of its limits: its
// requests per second or the leases it may hold (429). Wait the Error's RetryAfter, or
// release a lease first.
func IsThrottled(err error) bool {
	return hasCode(err, CodeTooManyRequests) || hasCode(err, CodeLeaseLimit)
}

// IsUnauthorized reports whether the token was missing or wrong (401).
func IsUnauthorized(err error) bool { return hasCode(err, CodeUnauthorized) }

func hasCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// --- calls ---------------------------------------------------------------------------

// ListProxies lists the proxies whose attributes include every pair of selector (nil for
// all), and, if healthy is not nil, only the healthy or the unhealthy ones. Until discovery
// has loaded its index the error satisfies IsIndexLoading.
func (c *Client) ListProxies(ctx context.Context, selector map[string]string, healthy *bool) (*ProxyList, error) {
	q := url.Values{}
	for k, v := range selector {
		q.Set("attr."+k, v)
	}
	if healthy != nil {
		q.Set("healthy", strconv.FormatBool(*healthy))
	}
	path := "/v1/proxies"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out ProxyList
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Demand is what crawlers ask of the proxies a selector describes (GET /v1/demand): a
// pool's autoscaler sizes the pool by it.
type Demand struct {
	Selector      map[string]string `json:"selector"`
	Proxies       int               `json:"proxies"`
	Healthy       int               `json:"healthy"`
	Capacity      int               `json:"capacity"`
	Held          int               `json:"held"`
	LeasedProxies int               `json:"leasedProxies"`
	Waiting       int               `json:"waiting"`
	Refused       int               `json:"refused"`
	// Demand is Held + Waiting + Refused.
	Demand   int  `json:"demand"`
	Replicas int  `json:"replicas"`
	Partial  bool `json:"partial,omitempty"`
}

// Demand asks the demand on the proxies with every attribute of selector. Asking also
// tells discovery those proxies may grow: for ten minutes, gateway requests for them wait
// for one when none is there yet.
func (c *Client) Demand(ctx context.Context, selector map[string]string) (*Demand, error) {
	q := url.Values{}
	for k, v := range selector {
		q.Set("attr."+k, v)
	}
	path := "/v1/demand"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out Demand
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AcquireRequest asks for a lease.
type AcquireRequest struct {
	// Selector is the attribute pairs the proxy must have (nil for any proxy).
	Selector map[string]string
	// TTL is how long the lease lasts unless renewed; zero takes the server's default (5m).
	// It is sent in whole seconds, rounded up; more than the server's maximum (1h by
	// default) is an error, not a silent clamp.
	TTL time.Duration
	// Target is the host the crawler will visit. Proxies resting for it after a report are
	// skipped, and reports on the lease default to it.
	Target string
	// Session, if set, keeps the crawler on one proxy: every lease for the same session
	// gets the same proxy while it is healthy, has a free slot and is not resting for the
	// target, on any discovery replica. 1-128 letters, digits, '.', '_', '~', ':' or '-'.
	Session string
	// Wait, when no proxy can take the lease now, is how long discovery waits for one
	// (a lease released or expired, a proxy added to the fleet) before it answers the 409:
	// zero answers at once. It is sent in whole seconds, rounded up; more than the
	// server's maximum (--max-acquire-wait, 1m by default) is an error. The request's
	// context still bounds the whole call: give it longer than Wait. An http.Client of
	// WithHTTPClient with a Timeout gets Wait added to it for this call.
	Wait time.Duration
}

// Acquire leases a proxy for req: without a session, the least leased and, among those,
// the one leased longest ago, so that successive leases walk the fleet. When none is
// available the error satisfies IsNoMatch (its RetryAfter says when one frees up); until
// discovery has loaded its index, it satisfies IsIndexLoading instead (retry shortly).
// With req.Wait, discovery waits that long for a proxy before the IsNoMatch answer; a
// crawler that gives up meanwhile (ctx ends) holds nothing.
func (c *Client) Acquire(ctx context.Context, req AcquireRequest) (*Lease, error) {
	body := leaseRequest{Selector: req.Selector, TTLSeconds: seconds(req.TTL), Target: req.Target, Session: req.Session,
		WaitSeconds: seconds(req.Wait)}
	hc := c.hc
	if body.WaitSeconds > 0 && hc.Timeout > 0 {
		// The server answers only once the wait is over: the client's bound is for the
		// exchange, on top of it.
		longer := *hc
		longer.Timeout += time.Duration(body.WaitSeconds) * time.Second
		hc = &longer
	}
	var out Lease
	if err := c.doWith(ctx, hc, http.MethodPost, "/v1/leases", body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Renew extends a lease to ttl from now (zero: the server's default), on the same proxy
// at the same address. The answer carries the credentials the proxy takes now, which
// differ from the granted ones if an External proxy's Secret was rotated: use the renewed
// Lease's ProxyURL. If the proxy was replaced, turned unhealthy or left the fleet, the
// lease has ended and the error satisfies IsProxyGone; an expired lease satisfies
// IsLeaseGone. Held does all of this for you.
func (c *Client) Renew(ctx context.Context, leaseID string, ttl time.Duration) (*Lease, error) {
	var out Lease
	if err := c.do(ctx, http.MethodPost, leasePath(leaseID, "/renew"), renewRequest{TTLSeconds: seconds(ttl)}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Release ends a lease. Releasing an unknown or already released lease is not an error, so
// retrying a Release is safe. A released lease still takes reports for the server's
// cooldown window (30 minutes by default), so a ban noticed only at the end of the work can
// be reported after releasing.
func (c *Client) Release(ctx context.Context, leaseID string) error {
	return c.do(ctx, http.MethodDelete, leasePath(leaseID, ""), nil, nil)
}

// Report tells discovery how target treated the leased proxy: ResultOK, ResultRateLimited
// or ResultBanned. An empty target means the lease's target, or every target if the lease
// has none. A lease that expired recently still takes reports.
func (c *Client) Report(ctx context.Context, leaseID, result, target string) error {
	return c.do(ctx, http.MethodPost, leasePath(leaseID, "/report"), reportRequest{Result: result, Target: target}, nil)
}

func leasePath(id, suffix string) string { return "/v1/leases/" + url.PathEscape(id) + suffix }

// seconds converts a TTL to the API's whole seconds, rounding away from zero so a positive
// TTL under a second does not become zero (which means the default TTL) and a negative one
// still reaches the server as the error it is.
func seconds(d time.Duration) int {
	s := int(d / time.Second)
	switch rem := d % time.Second; {
	case rem > 0:
		s++
	case rem < 0:
		s--
	}
	return s
}

// maxErrorBody bounds how much of an error answer is read.
const maxErrorBody = 64 << 10

// do sends in (if not nil) as JSON and decodes a 2xx answer into out (if not nil); other
// answers become an *Error.
func (c *Client) do(ctx context.Context, method, path string, in any, out any) error {
	return c.doWith(ctx, c.hc, method, path, in, out)
}

// doWith is do through hc.
func (c *Client) doWith(ctx context.Context, hc *http.Client, method, path string, in any, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("discovery: encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		// A URL that does not parse is quoted whole by its error, userinfo and all.
		if ue, ok := errors.AsType[*url.Error](err); ok {
			return fmt.Errorf("discovery: %s %s: %v", method, redactURL(ue.URL), ue.Err)
		}
		return fmt.Errorf("discovery: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("discovery: %s %s: %w", method, path, err)
	}
	defer func() {
		// Drain what is left so the connection to discovery can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(resp)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("discovery: decode %s %s: %w", method, path, err)
	}
	return nil
}

func decodeError(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &Error{}
	if err := json.Unmarshal(raw, e); err != nil || e.Code == "" {
		// Not an API error (a proxy or load balancer in between, or a redirect): keep what
		// helps to find out.
		msg := strings.TrimSpace(string(raw))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		e = &Error{Message: strings.TrimSpace(http.StatusText(resp.StatusCode) + " " + msg)}
	}
	e.Status = resp.StatusCode
	if e.RetryAfterSeconds == 0 {
		// Only the delay form: discovery never sends a date.
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n > 0 {
			e.RetryAfterSeconds = n
		}
	}
	return e
}

// --- using a lease -------------------------------------------------------------------

// ProxyURL is the leased proxy's address as a URL for http.ProxyURL or
// http.Transport.Proxy, with the proxy's credentials as its userinfo (net/http sends them
// as Proxy-Authorization, for plain http and for CONNECT), or nil if the lease has no
// address. Its String has the password in clear: log the Lease, or the URL's Redacted().
func (l *Lease) ProxyURL() *url.URL {
	var u *url.URL
	if l.Proxy.URL != "" {
		if p, err := url.Parse(l.Proxy.URL); err == nil && p.Host != "" {
			u = p
		}
	}
	if u == nil {
		if l.Proxy.IP == "" || l.Proxy.Port == 0 {
			return nil
		}
		u = &url.URL{Scheme: "http", Host: net.JoinHostPort(l.Proxy.IP, strconv.Itoa(int(l.Proxy.Port)))}
	}
	// The separate fields win over the URL's userinfo: they need no unescaping, and a
	// lease decoded without the URL still authenticates.
	switch {
	case l.Proxy.Password != "":
		u.User = url.UserPassword(l.Proxy.Username, l.Proxy.Password)
	case l.Proxy.Username != "":
		u.User = url.User(l.Proxy.Username)
	}
	return u
}

// HTTPClient returns an HTTP client that sends every request through the leased proxy:
// plain http as absolute-form requests to the proxy, https through a CONNECT tunnel, both
// with the proxy's credentials (if it takes any) in Proxy-Authorization.
//
// Each call builds a new transport (http.DefaultTransport's settings, keep-alives on) with
// its own connection pool, so no connection is shared between leases. Call it once per
// lease and reuse the client. It sends to the address the lease had when it was built: a
// renewal keeps the proxy, but if the proxy was replaced meanwhile the renewed Lease's
// Proxy.URL differs (a replacement also has new credentials); then build a new client from
// the renewed Lease and close the old one's idle connections. Keep-alive means a target may see several requests on one
// connection (one CONNECT tunnel for https), which suits a sticky session. It also means
// idle connections to the proxy outlive the lease for up to 90 seconds (IdleConnTimeout):
// when you release the lease, stop using the client and call its CloseIdleConnections, so
// you hold none of the proxy's connections once another crawler may lease it. The client
// has no Timeout; use request contexts.
func (l *Lease) HTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	u := l.ProxyURL()
	t.Proxy = func(*http.Request) (*url.URL, error) {
		if u == nil {
			return nil, errors.New("discovery: the lease has no proxy address")
		}
		return u, nil
	}
	return &http.Client{Transport: t}
}
