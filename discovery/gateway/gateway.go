// Package gateway is discovery's forward proxy: the whole fleet behind one HTTP_PROXY
// address (plain HTTP and CONNECT), for crawlers that cannot speak the lease API. It
// leases through the same operations as the API's handlers (the leaseOps it is given), so
// its crawlers count against maxLeases, client caps, cooldowns and sessions as the API's
// do; what is its own is the proxying: dialling fleet proxies, tunnels, retries, waiting
// for a slot and renewing the leases of long requests.
package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Config configures the gateway: one forward proxy address (HTTP and CONNECT) for
// the whole fleet, for crawlers that cannot speak the lease API.
type Config struct {
	// ReportStatuses are the statuses of plain HTTP answers that count as reports on the
	// proxy for the target: 429 as rate_limited, any other as banned (default 403, 429).
	// Inside a CONNECT tunnel the gateway sees no status; crawlers report by session.
	ReportStatuses []int
	// Attempts bounds the fleet proxies one request or tunnel tries when a proxy refuses
	// before anything was sent (default 3).
	Attempts int
	// LeaseTTL is the TTL of the lease each request or tunnel holds, renewed while it
	// lasts (default 1m): a gateway that dies frees its slots within it.
	LeaseTTL time.Duration
	// ConnectTimeout bounds connecting to a fleet proxy and, for a tunnel, its answer to
	// CONNECT (default 10s).
	ConnectTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for a plain answer's headers, and any silence
	// of the site in its body after them (default 1m).
	ResponseHeaderTimeout time.Duration
	// Wait is how long a request or tunnel waits for a proxy to free a slot when every
	// one that could take it is at capacity or resting (default 10s; negative: not at
	// all). A crawler's tool seldom honours Retry-After on a proxy's 503, and slots free
	// up as other requests end, so a short wait here turns a refusal into a delay.
	Wait time.Duration
	// HalfClosedTimeout bounds how long a tunnel (or a switched plain connection) stays
	// open, and keeps its lease, once one side has ended while the other sends nothing
	// (default 30s). A crawler that hangs up must not leave its slot to a site that never
	// finishes, nor a site that is done to a crawler that never closes.
	HalfClosedTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultAttempts       = 3
	DefaultLeaseTTL       = time.Minute
	DefaultConnectTimeout = 10 * time.Second
	DefaultHeaderTimeout  = time.Minute
	DefaultWait           = 10 * time.Second
	DefaultHalfClosed     = 30 * time.Second
)

// DefaultReportStatuses are the plain HTTP statuses the gateway reports by default.
var DefaultReportStatuses = []int{http.StatusForbidden, http.StatusTooManyRequests}

// Validate checks the configuration a user gave.
func (c Config) Validate() error {
	for _, s := range c.ReportStatuses {
		if s < 100 || s > 599 {
			return fmt.Errorf("gateway report status %d is not an HTTP status", s)
		}
		if s < 400 {
			return fmt.Errorf("gateway report status %d is not an error: only 4xx and 5xx answers can be reports", s)
		}
	}
	if c.Attempts < 0 || c.Attempts > 10 {
		return fmt.Errorf("gateway attempts %d: use 1 to 10", c.Attempts)
	}
	return nil
}

// orDefault sets a zero or negative duration to def.
func orDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

func (c *Config) defaults() {
	if c.ReportStatuses == nil {
		c.ReportStatuses = DefaultReportStatuses
	}
	if c.Attempts <= 0 {
		c.Attempts = DefaultAttempts
	}
	orDefault(&c.LeaseTTL, DefaultLeaseTTL)
	orDefault(&c.ConnectTimeout, DefaultConnectTimeout)
	orDefault(&c.ResponseHeaderTimeout, DefaultHeaderTimeout)
	if c.Wait == 0 {
		c.Wait = DefaultWait
	}
	orDefault(&c.HalfClosedTimeout, DefaultHalfClosed)
}

// Headers of the gateway's answers to the crawler.
const (
	// ErrorHeader names, on an answer the gateway made itself, the error code of
	// its JSON body: a crawler tells the gateway's 502 from a site's without parsing it.
	ErrorHeader = "Proxyfleet-Error"
	// ProxyHeader names the fleet proxy (namespace/name) that carried a request,
	// on plain answers and on a tunnel's 200.
	ProxyHeader = "Proxyfleet-Proxy"
)

// Kinds of a fleet proxy's failure, the label of proxyfleet_gateway_upstream_failures_total.
const (
	failUnreachable = "unreachable" // the connection was refused or could not be made
	failTimeout     = "timeout"     // no connection or answer in time
	failReset       = "reset"       // the connection broke before an answer
	failAuth        = "auth"        // the proxy refused its credentials (407)
	failRefused     = "refused"     // the proxy answered CONNECT with another error status
	failSwitched    = "switched"    // the site switched protocols when it was not asked to
)

// upstreamFailure is one fleet proxy's failure for one attempt.
type upstreamFailure struct {
	proxy, kind, detail string
	// retry is whether another proxy may do better: false for a refusal of the request
	// itself (every proxy applies the same rules), or a request that was already sent.
	retry bool
}

func (f upstreamFailure) String() string { return f.proxy + ": " + f.detail }

// Gateway is the fleet as one forward proxy. Each plain request and each tunnel holds a
// lease of the store the API grants from, for as long as it lasts, so the gateway's
// crawlers count against maxLeases, client caps, cooldowns and sessions exactly as the
// API's do; in a replica set, each lease is granted by its proxy's owner.
type Gateway struct {
	// ops are the lease operations, the API's own; metrics are the server's.
	ops     leaseOps
	metrics *metrics
	cfg     Config
	log     *slog.Logger
	tracer  trace.Tracer
	// report maps a plain answer's status to the report it makes.
	report map[int]string
	// transport carries plain requests to the fleet proxy in the request's context;
	// its connections are pooled per proxy and credentials.
	transport *http.Transport
	forward   *httputil.ReverseProxy

	mu sync.Mutex
	// held are the leases of requests and tunnels in progress, renewed every LeaseTTL/3:
	// lease ID → the crawler's Authorization, for the lease's owner when it is another
	// replica.
	held map[string]string
	// renewHook, when set (by tests), stands in for renewing a held lease.
	renewHook func(ctx context.Context, auth, id string) error
	// tunnels are the open tunnels, and switched are the plain connections that switched
	// protocols: both are closed when the gateway stops.
	tunnels  map[*tunnel]struct{}
	switched map[*leaseConn]struct{}
	closed   bool

	// waiters are the requests and tunnels waiting for a slot, woken as the gateway's
	// leases end; waitPoll is how often each also looks by itself, for slots freed
	// elsewhere (the API's crawlers, another replica, an expiry).
	waiters  discovery.WaitQueue
	waitPoll time.Duration
	// waitChecks counts the grants tried again while waiting: what waiting costs the store.
	waitChecks atomic.Int64
	// freed counts the gateway's leases that ended, for a waiter to tell whether one ended
	// while it was not yet waiting.
	freed atomic.Uint64
}

// defaultWaitPoll is how often a waiting request looks for a slot by itself. Slots the
// gateway frees wake the waiters at once; this only bounds how late one notices a slot
// freed by another door, at two scans of the fleet a second per waiter.
const defaultWaitPoll = 500 * time.Millisecond

// leaseOps are the lease operations the gateway needs: those the API's handlers call, each
// answered by this replica or the lease's (or proxy's) owner. *discovery.Server is the
// product's; the gateway's unit tests stand a mock in.
type leaseOps interface {
	Grant(ctx context.Context, w discovery.Want, except func(string) bool) (*discovery.LeaseResponse, error)
	RenewLease(ctx context.Context, auth, id string, d time.Duration) (*discovery.LeaseResponse, error)
	ReleaseLease(ctx context.Context, auth, id string) error
	ReportLease(ctx context.Context, auth, id, result, target string) error
	// ClientOf is the client whose token this is (nil if none); open says the server has
	// no clients, and takes anyone.
	ClientOf(token string) (cl *discovery.Client, open bool)
	Throttle(cl *discovery.Client) *discovery.APIError
	// Loaded says the index has been read from Temporal; Freed counts the changes to it
	// that can free a slot (Store.Freed).
	Loaded() bool
	Freed() uint64
}

var _ leaseOps = (*discovery.Server)(nil)

// New builds the gateway over ops, the lease operations of the API's server. Its metrics
// go to reg when it is not nil.
func New(cfg Config, ops leaseOps, log *slog.Logger, reg prometheus.Registerer) *Gateway {
	if log == nil {
		log = slog.Default()
	}
	return newGateway(cfg, ops, newMetrics(reg), log)
}

// newGateway builds a gateway over ops.
func newGateway(cfg Config, ops leaseOps, m *metrics, log *slog.Logger) *Gateway {
	cfg.defaults()
	g := &Gateway{ops: ops, metrics: m, cfg: cfg, log: log.With("component", "gateway"), tracer: otel.Tracer("proxyfleet-gateway"),
		report: map[int]string{}, held: map[string]string{}, tunnels: map[*tunnel]struct{}{},
		switched: map[*leaseConn]struct{}{}, waitPoll: defaultWaitPoll}
	for _, st := range cfg.ReportStatuses {
		g.report[st] = contract.ReportBanned
		if st == http.StatusTooManyRequests {
			g.report[st] = contract.ReportRateLimited
		}
	}
	g.transport = &http.Transport{
		Proxy:       fleetProxyOf,
		DialContext: (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		// The crawler's own Accept-Encoding goes through untouched, and its answer too.
		DisableCompression:    true,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       time.Minute,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
	}
	g.forward = &httputil.ReverseProxy{
		// Rewrite, unlike Director, adds no X-Forwarded-* header and drops the crawler's:
		// nothing identifying the crawler reaches the site.
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = pr.In.URL
			pr.Out.Host = pr.In.Host
			for _, h := range []string{"Via", "Forwarded", "Proxy-Authorization", "Proxy-Connection"} {
				pr.Out.Header.Del(h)
			}
			// Every X-Forwarded-* (Host, Proto, Port, Server, Prefix, ...), not only the
			// ones the reverse proxy knows: each tells the site a proxy is in the way, or
			// where the crawler runs.
			for h := range pr.Out.Header {
				if strings.HasPrefix(http.CanonicalHeaderKey(h), "X-Forwarded-") {
					delete(pr.Out.Header, h) // the key as it is, canonical or not
				}
			}
		},
		Transport:  gatewayRoundTripper{g},
		BufferPool: copyBuffers{},
		// The default flushes streamed answers (no length, or event streams) at once and
		// buffers the rest: flushing every write cost a syscall per chunk for nothing.
		ErrorHandler: g.forwardFailed,
		ErrorLog:     slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
	return g
}

type fleetProxyKey struct{}

// fleetProxyOf is the transport's Proxy: the fleet proxy, with its credentials, that the
// request's attempt leased. The transport sends them as Proxy-Authorization.
func fleetProxyOf(r *http.Request) (*url.URL, error) {
	u, _ := r.Context().Value(fleetProxyKey{}).(*url.URL)
	if u == nil {
		return nil, errors.New("no fleet proxy leased for this request")
	}
	return u, nil
}

// exchange is one crawler request as the gateway handles it.
type exchange struct {
	client *discovery.Client
	user   gatewayUser
	// auth is the crawler's credentials as an API Authorization ("" without auth).
	auth     string
	target   string
	span     trace.Span
	tried    []string
	failures []upstreamFailure
	// result is a forwarded request's outcome when it is not ok.
	result string
	// body is the answer handed to the reverse proxy, whose Close ends the lease.
	body io.Closer
}

func (x *exchange) want(ttl time.Duration) discovery.Want {
	w := discovery.Want{Selector: x.user.selector, Target: x.target, Session: x.user.session, TTL: ttl}
	if x.client != nil {
		w.Client, w.MaxLeases = x.client.Name(), x.client.MaxLeases()
	}
	return w
}

func (x *exchange) skip(id string) bool { return slices.Contains(x.tried, id) }

func (x *exchange) clientName() string {
	if x.client == nil {
		return ""
	}
	return x.client.Name()
}

type exchangeKey struct{}

// ServeHTTP serves the gateway: CONNECT opens a tunnel, an absolute http:// URI is
// forwarded; anything else is refused.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	kind := "http"
	if r.Method == http.MethodConnect {
		kind = "connect"
	}
	ctx, span := g.tracer.Start(r.Context(), "gateway "+r.Method, trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	x := &exchange{span: span}
	record := func(outcome string) {
		span.SetAttributes(attribute.String("proxyfleet.gateway.outcome", outcome),
			attribute.String("proxyfleet.client", x.clientName()), attribute.Int("proxyfleet.gateway.attempts", len(x.tried)))
		if outcome != "ok" {
			span.SetStatus(otelcodes.Error, outcome)
		}
		g.metrics.requests.WithLabelValues(x.clientName(), kind, outcome).Inc()
	}
	defer func() {
		if p := recover(); p != nil {
			// The reverse proxy gives up on an answer it cannot finish (the site or the
			// fleet proxy broke it off, or the crawler left) by panicking with
			// http.ErrAbortHandler, for the server to cut the crawler's connection: the
			// answer is counted, and the panic goes on its way.
			outcome := "aborted"
			if r.Context().Err() != nil {
				outcome = "canceled"
			}
			record(outcome)
			panic(p)
		}
	}()
	record(g.serve(w, r.WithContext(ctx), x, kind))
}

// serve handles one request and returns its outcome, a label of
// proxyfleet_gateway_requests_total.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, x *exchange, kind string) string {
	if ae := g.authenticate(r, x); ae != nil {
		return g.fail(w, ae)
	}
	if !g.ops.Loaded() {
		return g.fail(w, discovery.ErrIndexLoading())
	}
	var hostport string
	switch {
	case kind == "connect":
		hostport = r.Host
		if _, port, err := net.SplitHostPort(hostport); err != nil || port == "" {
			return g.fail(w, discovery.Errorf(codes.Invalid, "CONNECT needs host:port, got %q", hostport))
		}
	case r.URL.IsAbs() && r.URL.Scheme == "http" && r.URL.Host != "":
		hostport = r.URL.Host
	case r.URL.IsAbs():
		return g.fail(w, discovery.Errorf(codes.Invalid, "the gateway forwards http:// URLs; tunnel %s:// with CONNECT (an HTTPS proxy setting does that)", r.URL.Scheme))
	default:
		return g.fail(w, discovery.Errorf(codes.Invalid, "this is a forward proxy: send CONNECT or an absolute http:// URI, with this address as the proxy"))
	}
	target, err := discovery.NormalizeTarget(hostport)
	if err != nil {
		return g.fail(w, err)
	}
	x.target = target
	x.span.SetAttributes(attribute.String("server.address", target))
	if kind == "connect" {
		return g.tunnel(w, r, x)
	}
	defer func() {
		if x.body != nil {
			// The answer is over, whichever way the reverse proxy left it (some of its
			// refusals leave the answer open, and an answer it aborts unwinds from here):
			// its lease ends now. Closing twice is harmless.
			_ = x.body.Close()
		}
	}()
	g.forward.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x)))
	if x.result == "" {
		return "ok"
	}
	return x.result
}

// authenticate finds the client whose token is the password of the request's proxy
// credentials, reads the options of its username and holds it to its rate limit.
func (g *Gateway) authenticate(r *http.Request, x *exchange) *discovery.APIError {
	user, password, ok := proxyCredentials(r.Header)
	cl, open := g.ops.ClientOf(password)
	if open {
		u, err := parseGatewayUser(user, "")
		if err != nil {
			return discovery.Errorf(codes.Invalid, "%v", err)
		}
		x.user = u
		return nil
	}
	if !ok || cl == nil {
		return discovery.Errorf(codes.ProxyAuthRequired, "the gateway takes a client's name and token as proxy credentials: http://<client>:<token>@<gateway>")
	}
	u, err := parseGatewayUser(user, cl.Name())
	if u.client != cl.Name() {
		// The token is another client's: as wrong as a wrong token.
		return discovery.Errorf(codes.ProxyAuthRequired, "the proxy username must start with the name of the client whose token is the password")
	}
	if err != nil {
		return discovery.Errorf(codes.Invalid, "%v", err)
	}
	x.client, x.user, x.auth = cl, u, "Bearer "+password
	return g.ops.Throttle(cl)
}

// proxyCredentials reads Basic credentials from Proxy-Authorization (the scheme in any
// case, as RFC 9110 has it).
func proxyCredentials(h http.Header) (user, password string, ok bool) {
	scheme, enc, _ := strings.Cut(h.Get("Proxy-Authorization"), " ")
	if !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", "", false
	}
	return strings.Cut(string(raw), ":")
}

// fail answers with err as JSON, its code also in ErrorHeader, and returns the
// outcome.
func (g *Gateway) fail(w http.ResponseWriter, err error) string {
	ae, known := discovery.ErrorOf(err)
	if !known {
		g.log.Error("internal error", "error", err)
	}
	h := w.Header()
	h.Set(ErrorHeader, ae.Code)
	h.Set("Content-Type", "application/json; charset=utf-8")
	if ae.RetryAfterSeconds > 0 {
		h.Set("Retry-After", strconv.Itoa(ae.RetryAfterSeconds))
	}
	if ae.Code == codes.ProxyAuthRequired {
		h.Set("Proxy-Authenticate", `Basic realm="proxyfleet"`)
	}
	m := codes.Of(ae.Code)
	w.WriteHeader(m.GatewayStatus)
	_ = json.NewEncoder(w).Encode(ae)
	return m.Outcome
}

// failNoLease answers a request for which no (further) lease was granted: with what the
// proxies tried did, if any was, since that is why the request failed.
func (g *Gateway) failNoLease(w http.ResponseWriter, x *exchange, err error) string {
	if len(x.failures) > 0 {
		return g.fail(w, x.upstreamError())
	}
	return g.fail(w, err)
}

// upstreamError says what every fleet proxy tried did.
func (x *exchange) upstreamError() *discovery.APIError {
	parts := make([]string, len(x.failures))
	for i, f := range x.failures {
		parts[i] = f.String()
	}
	e := discovery.Errorf(codes.UpstreamFailed, "no fleet proxy carried the request (%d tried): %s", len(parts), strings.Join(parts, "; "))
	e.Reason = x.failures[len(x.failures)-1].kind
	return e
}

// failed records an attempt's failure.
func (g *Gateway) failed(x *exchange, f upstreamFailure) {
	x.failures = append(x.failures, f)
	g.metrics.upstreamFailures.WithLabelValues(f.kind).Inc()
	if f.retry && len(x.tried) < g.cfg.Attempts {
		g.metrics.retries.Inc()
	}
	x.span.AddEvent("upstream failure", trace.WithAttributes(attribute.String("proxyfleet.proxy", f.proxy),
		attribute.String("proxyfleet.gateway.failure", f.kind)))
	g.log.Info("fleet proxy failed", "proxy", f.proxy, "kind", f.kind, "detail", f.detail, "client", x.clientName())
}

// leaseFor grants the next attempt's lease, on a proxy not tried yet, waiting for a slot
// when none is free (see waitForSlot).
func (g *Gateway) leaseFor(ctx context.Context, x *exchange) (*discovery.LeaseResponse, error) {
	freed, storeFreed := g.freed.Load(), g.ops.Freed()
	l, err := g.ops.Grant(ctx, x.want(g.cfg.LeaseTTL), x.skip)
	if err != nil {
		if l, err = g.waitForSlot(ctx, x, err, freed, storeFreed); err != nil {
			return nil, err
		}
	}
	x.tried = append(x.tried, l.Proxy.Namespace+"/"+l.Proxy.Name)
	g.hold(l.LeaseID, x.auth)
	return l, nil
}

// waitForSlot waits up to Wait for a lease the store refused with refusal, while every
// proxy that could take it is full or resting (or the client holds its cap): slots free
// up as requests and tunnels end. It tries again when one of the gateway's own leases
// ends (one waiter at a time, see discovery.WaitQueue) and, for slots freed elsewhere, every
// waitPoll if the store's count of freeing changes moved (Store.Freed), or when the
// refusal said one frees up by itself. It returns the last refusal if none came free, or
// the crawler left. freed and storeFreed are g.freed and the store's count as they were
// before the grant that was refused.
func (g *Gateway) waitForSlot(ctx context.Context, x *exchange, refusal error, freed, storeFreed uint64) (*discovery.LeaseResponse, error) {
	if g.cfg.Wait < 0 || !worthWaiting(refusal) {
		return nil, refusal
	}
	g.metrics.waits.Inc()
	deadline := time.NewTimer(g.cfg.Wait)
	defer deadline.Stop()
	poll := time.NewTimer(g.pollAfter(refusal))
	defer poll.Stop()
	w := g.waiters.Join()
	defer g.waiters.Leave(w)
	// A lease that ended between the refusal and join woke nobody: look again at once.
	again := g.freed.Load() != freed
	// The store's count of freeing changes at the last look: a tick of poll that finds it
	// unmoved, and no time the refusal named come, looks at nothing.
	seen, due := storeFreed, time.Time{}
	for {
		woken := false
		if !again {
			select {
			case <-ctx.Done():
				return nil, refusal
			case <-deadline.C:
				return nil, refusal
			case <-w.Turn():
				g.waiters.Took(w)
				woken = true
			case <-poll.C:
				if g.ops.Freed() == seen && (due.IsZero() || time.Now().Before(due)) {
					poll.Reset(g.pollAfter(refusal))
					continue
				}
			}
		}
		again = false
		seen = g.ops.Freed()
		g.waitChecks.Add(1)
		l, err := g.ops.Grant(ctx, x.want(g.cfg.LeaseTTL), x.skip)
		if err == nil {
			return l, nil
		}
		if !worthWaiting(err) {
			return nil, err
		}
		refusal = err
		if woken {
			g.waiters.Pass(w)
		}
		due = time.Time{}
		if nm := noMatchOf(refusal); nm != nil && nm.RetryAfter > 0 {
			due = time.Now().Add(nm.RetryAfter) // a lease or cooldown ends by then, unswept
		}
		poll.Reset(g.pollAfter(refusal)) // no stale tick survives a Reset since Go 1.23
	}
}

// pollAfter is how long a waiter waits before it looks by itself: waitPoll, or less when
// the store knows a slot frees up sooner (a lease or a cooldown ends).
func (g *Gateway) pollAfter(refusal error) time.Duration {
	d := g.waitPoll
	if nm := noMatchOf(refusal); nm != nil && nm.RetryAfter > 0 {
		d = min(d, max(nm.RetryAfter, 5*time.Millisecond))
	}
	return d
}

// noMatchOf is the discovery.NoMatch a refusal carries: the store's own, or the one another replica
// answered with.
func noMatchOf(err error) *discovery.NoMatch {
	if nm, ok := errors.AsType[*discovery.NoMatch](err); ok {
		return nm
	}
	if ae, ok := errors.AsType[*discovery.APIError](err); ok && ae.Code == codes.NoMatch {
		return ae.NoMatch
	}
	return nil
}

// worthWaiting says whether a refused grant may succeed soon by itself: some matching
// proxy is full or resting (not when every one is unhealthy or none matches), or the
// client is at its cap. The refusal may come from this replica's store or, in a replica
// set, as the answer of the proxy's owner.
func worthWaiting(err error) bool {
	if nm := noMatchOf(err); nm != nil {
		return nm.AtCapacity > 0 || nm.InCooldown > 0
	}
	if _, limited := errors.AsType[*discovery.LeaseLimit](err); limited {
		return true
	}
	ae, ok := errors.AsType[*discovery.APIError](err)
	return ok && ae.Code == codes.LeaseLimit
}

// --- tunnels -------------------------------------------------------------------------

// tunnel opens a CONNECT tunnel through a fleet proxy, trying another when one fails
// before the tunnel is open, and splices it to the crawler.
func (g *Gateway) tunnel(w http.ResponseWriter, r *http.Request, x *exchange) string {
	start := time.Now()
	var (
		up    net.Conn
		early []byte
		l     *discovery.LeaseResponse
	)
	for up == nil && len(x.tried) < g.cfg.Attempts {
		var err error
		l, err = g.leaseFor(r.Context(), x)
		switch {
		case r.Context().Err() != nil:
			// The crawler left (while it waited for a slot, or for a proxy): nobody reads
			// an answer, and no proxy failed.
			if err == nil {
				g.release(x.auth, l.LeaseID)
			}
			return "canceled"
		case err != nil:
			return g.failNoLease(w, x, err)
		}
		var f *upstreamFailure
		if up, early, f = g.dialTunnel(r.Context(), l, r.Host); f != nil {
			g.release(x.auth, l.LeaseID)
			if r.Context().Err() != nil {
				return "canceled"
			}
			g.failed(x, *f)
			if !f.retry {
				break
			}
		}
	}
	if up == nil {
		return g.fail(w, x.upstreamError())
	}
	proxyID := l.Proxy.ID()
	cc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		g.release(x.auth, l.LeaseID)
		return g.fail(w, discovery.Errorf(codes.Invalid, "tunnels need HTTP/1.1 to the gateway"))
	}
	// The server's read and write deadlines must not cut a tunnel short.
	_ = cc.SetDeadline(time.Time{})
	t := &tunnel{client: cc, up: up, lease: l.LeaseID, auth: x.auth}
	if !g.track(t) {
		t.close()
		g.release(x.auth, l.LeaseID)
		return "unavailable"
	}
	head := "HTTP/1.1 200 Connection established\r\n" + ProxyHeader + ": " + proxyID + "\r\n\r\n"
	_, err = io.WriteString(cc, head)
	if err == nil && len(early) > 0 {
		_, err = cc.Write(early)
	}
	if err != nil {
		t.close() // the crawler is gone: the splices below end at once and clean up
	}
	// What the crawler sent after its CONNECT head (a TLS hello, often) is buffered.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := up.Write(b); err != nil {
			t.close()
		}
	}
	x.span.SetAttributes(attribute.String("proxyfleet.proxy", proxyID))
	g.metrics.connectSeconds.Observe(time.Since(start).Seconds())
	g.metrics.tunnels.Inc()
	t.left.Store(2)
	if tc, ok := up.(*net.TCPConn); ok {
		t.keep = time.AfterFunc(time.Duration(upstreamKeepAliveAfter.Load()), func() { _ = tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true}) })
	}
	go g.splice(t, t.up, t.client, tunnelBytes{g.metrics.bytes.WithLabelValues("upstream"), &t.moved})
	go g.splice(t, t.client, t.up, tunnelBytes{g.metrics.bytes.WithLabelValues("downstream"), &t.moved})
	return "ok"
}

// dialTunnel connects to the leased proxy and asks it for a tunnel to hostport, all
// within ConnectTimeout. It returns the connection, any bytes the proxy sent after its
// 200, or what went wrong.
func (g *Gateway) dialTunnel(ctx context.Context, l *discovery.LeaseResponse, hostport string) (net.Conn, []byte, *upstreamFailure) {
	id := l.Proxy.ID()
	deadline := time.Now().Add(g.cfg.ConnectTimeout)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// No keepalive yet: a tunnel that lasts gets it (upstreamKeepAliveAfter).
	c, err := (&net.Dialer{KeepAlive: -1}).DialContext(dctx, "tcp", net.JoinHostPort(l.Proxy.IP, strconv.Itoa(int(l.Proxy.Port))))
	if err != nil {
		return nil, nil, dialFailure(id, err, true)
	}
	_ = c.SetDeadline(deadline)
	var b strings.Builder
	b.WriteString("CONNECT " + hostport + " HTTP/1.1\r\nHost: " + hostport + "\r\n")
	if l.Proxy.Username != "" {
		b.WriteString("Proxy-Authorization: Basic " +
			base64.StdEncoding.EncodeToString([]byte(l.Proxy.Username+":"+l.Proxy.Password)) + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		c.Close()
		return nil, nil, ioFailure(id, err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		c.Close()
		return nil, nil, ioFailure(id, err)
	}
	if resp.StatusCode/100 != 2 {
		c.Close()
		f := &upstreamFailure{proxy: id, kind: failRefused, detail: "answered " + resp.Status + " to CONNECT", retry: true}
		switch resp.StatusCode {
		case http.StatusProxyAuthRequired:
			f.kind, f.detail = failAuth, "refused its credentials (407)"
		case http.StatusBadRequest, http.StatusForbidden, http.StatusMethodNotAllowed:
			// The proxy refuses the request itself (a port or destination its rules do
			// not allow): another proxy of the fleet applies the same rules.
			f.retry = false
		}
		return nil, nil, f
	}
	_ = c.SetDeadline(time.Time{})
	var early []byte
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		early = slices.Clone(b)
	}
	return c, early, nil
}

// dialFailure classifies a failed connection to a fleet proxy. Its detail names no
// address or credentials, only what happened.
func dialFailure(id string, err error, retry bool) *upstreamFailure {
	f := &upstreamFailure{proxy: id, kind: failUnreachable, detail: "could not connect", retry: retry}
	var ne net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()):
		f.kind, f.detail = failTimeout, "timed out connecting"
	case errors.Is(err, syscall.ECONNREFUSED):
		f.detail = "connection refused"
	}
	return f
}

// ioFailure classifies a connection to a fleet proxy that broke or stalled before its
// answer.
func ioFailure(id string, err error) *upstreamFailure {
	f := &upstreamFailure{proxy: id, kind: failReset, detail: "closed the connection before answering", retry: true}
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		f.kind, f.detail = failTimeout, "timed out before answering"
	}
	return f
}

// tunnel is an open tunnel: the crawler's connection and the fleet proxy's.
type tunnel struct {
	client, up  net.Conn
	lease, auth string
	// left counts the directions still copying; the last one to end cleans up.
	left atomic.Int32
	// moved counts the bytes carried either way, for closeWhenIdle, and idle is its timer.
	moved atomic.Int64
	idle  atomic.Pointer[time.Timer]
	// keep turns keepalive on for the fleet proxy's connection once the tunnel has lasted
	// upstreamKeepAliveAfter (see Gateway.tunnel).
	keep *time.Timer
}

// upstreamKeepAliveAfter is how long a tunnel lasts before its fleet proxy's connection
// gets TCP keepalive, which notices a fleet proxy gone without a word (a VM lost) and frees
// the slot. Set at the dial, it would cost four system calls for every tunnel, most of
// which carry one fetch and end within this. Atomic because tests change it while tunnels
// of an earlier test may still be closing.
var upstreamKeepAliveAfter atomic.Int64

func init() { upstreamKeepAliveAfter.Store(int64(15 * time.Second)) }

func (t *tunnel) close() {
	t.client.Close()
	t.up.Close()
}

// tunnelBytes counts a tunnel's bytes into the gateway's counter and the tunnel's own.
type tunnelBytes struct {
	prometheus.Counter
	moved *atomic.Int64
}

func (b tunnelBytes) Add(v float64) {
	b.Counter.Add(v)
	b.moved.Add(int64(v))
}

// splice copies one direction of a tunnel. A direction that ends cleanly half-closes the
// other side, so each peer sees the other's end of stream, and leaves the other direction
// HalfClosedTimeout of silence to finish (closeWhenIdle); one that fails closes both.
func (g *Gateway) splice(t *tunnel, dst, src net.Conn, bytes prometheus.Counter) {
	clean := copyCounting(dst, src, bytes) == nil
	if clean {
		closeWrite(dst)
	} else {
		t.close()
	}
	if t.left.Add(-1) == 0 {
		stopIdle(&t.idle)
		if t.keep != nil {
			t.keep.Stop()
		}
		t.close()
		g.untrack(t)
		g.metrics.tunnels.Dec()
		g.release(t.auth, t.lease)
		return
	}
	if clean {
		g.closeWhenIdle(&t.idle, &t.moved, func() bool { return t.left.Load() == 0 }, t.close)
	}
}

// closeWhenIdle ends a connection one side of which has ended: through closeFn, once moved
// (its bytes) has stood still for HalfClosedTimeout, unless over says it ended by itself.
// A crawler that hung up half-closes its tunnel as one that waits for the rest of an answer
// does, and a site that keeps a connection open while sending nothing would otherwise keep
// its slot taken for as long as it likes; the same goes for a crawler that never closes a
// tunnel the site has left. The pending timer is kept in timer, for stopIdle when the
// connection ends: at thousands of tunnels a second, timers left to run out would pile up.
func (g *Gateway) closeWhenIdle(timer *atomic.Pointer[time.Timer], moved *atomic.Int64, over func() bool, closeFn func()) {
	var arm func(last int64)
	arm = func(last int64) {
		timer.Store(time.AfterFunc(g.cfg.HalfClosedTimeout, func() {
			switch n := moved.Load(); {
			case over():
			case n != last:
				arm(n)
			default:
				closeFn()
			}
		}))
	}
	arm(moved.Load())
}

// stopIdle stops the timer of closeWhenIdle, if one was started.
func stopIdle(timer *atomic.Pointer[time.Timer]) {
	if t := timer.Load(); t != nil {
		t.Stop()
	}
}

// copyChunks copies src to dst until src ends, counting bytes as they pass. It copies
// in chunks of 1 MiB so that the counter moves during a long transfer; between two TCP
// connections each chunk is spliced by the kernel, never copied through user space. It is
// the portable copy; Linux's (copyCounting) also holds no pipe while a tunnel is idle.
func copyChunks(dst, src net.Conn, bytes prometheus.Counter) error {
	lr := &io.LimitedReader{R: src}
	for {
		lr.N = 1 << 20
		n, err := io.Copy(dst, lr)
		bytes.Add(float64(n))
		if err != nil || lr.N > 0 {
			return err
		}
	}
}

// closeWrite half-closes a connection: the peer reads its end, and may still answer.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	c.Close()
}

func (g *Gateway) track(t *tunnel) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.tunnels[t] = struct{}{}
	return true
}

func (g *Gateway) untrack(t *tunnel) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.tunnels, t)
}

// trackSwitched records a connection that switched protocols, to be closed when the
// gateway stops; once it has stopped (a switch answered after Serve returned), it says
// no: nothing would close the connection, nor renew its lease.
func (g *Gateway) trackSwitched(c *leaseConn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.switched[c] = struct{}{}
	return true
}

func (g *Gateway) untrackSwitched(c *leaseConn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.switched, c)
}

// --- plain requests ------------------------------------------------------------------

// gatewayRoundTripper carries a plain request through a leased fleet proxy, trying
// another when one fails before the request could have reached the site.
type gatewayRoundTripper struct{ g *Gateway }

// noLease is a round trip that found no (further) proxy to lease.
type noLease struct{ err error }

func (e noLease) Error() string { return e.err.Error() }

var errUpstream = errors.New("every fleet proxy tried failed")

func (rt gatewayRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	g := rt.g
	x, _ := req.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		return nil, errors.New("gateway: a request without its exchange")
	}
	// A request can go to another proxy if none of it was sent, which the transport can
	// tell only for a failed connection, or if sending it twice is harmless; either way
	// its body is gone once sent.
	resendable := req.Body == nil || req.Body == http.NoBody
	idempotent := resendable && (req.Method == http.MethodGet || req.Method == http.MethodHead ||
		req.Method == http.MethodOptions || req.Method == http.MethodTrace)
	for len(x.tried) < g.cfg.Attempts {
		l, err := g.leaseFor(req.Context(), x)
		if err != nil {
			return nil, noLease{err}
		}
		id := l.Proxy.ID()
		pu, err := url.Parse(l.Proxy.URL)
		if err != nil {
			g.release(x.auth, l.LeaseID)
			return nil, err
		}
		resp, err := g.transport.RoundTrip(req.WithContext(context.WithValue(req.Context(), fleetProxyKey{}, pu)))
		var f *upstreamFailure
		switch {
		case err != nil && req.Context().Err() != nil:
			g.release(x.auth, l.LeaseID)
			return nil, req.Context().Err()
		case err != nil:
			if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Op == "proxyconnect" {
				f = dialFailure(id, err, resendable)
			} else {
				f = ioFailure(id, err)
				f.retry = idempotent
			}
		case resp.StatusCode == http.StatusProxyAuthRequired && resp.Header.Get("Proxy-Authenticate") != "":
			// The fleet proxy refused its credentials, before anything reached the site: any
			// request without a body can go to another proxy. (A site's 407 carries no
			// challenge by the time it gets here, see proxysOwn, and is the site's answer:
			// sending the request again would repeat whatever it did there.)
			resp.Body.Close()
			f = &upstreamFailure{proxy: id, kind: failAuth, detail: "refused its credentials (407)", retry: resendable}
		case resp.StatusCode/100 == 4 && proxysOwn(resp):
			// The fleet proxy refused the request itself (a destination or port its rules
			// deny): another proxy of the fleet applies the same rules, and the site never
			// saw the request, so it is neither tried again nor a report on the proxy.
			resp.Body.Close()
			f = &upstreamFailure{proxy: id, kind: failRefused, detail: "refused the request itself (" + resp.Status + ")"}
		}
		if f != nil {
			g.failed(x, *f)
			g.release(x.auth, l.LeaseID)
			if !f.retry {
				break
			}
			continue
		}
		if result, ok := g.report[resp.StatusCode]; ok && !proxysOwn(resp) {
			// Only the site's own refusals are reports: the fleet proxy's (a 5xx it gives
			// when it cannot reach the site) say nothing of how the site treats it.
			g.reportStatus(req.Context(), x, l, result)
		}
		x.span.SetAttributes(attribute.String("proxyfleet.proxy", id), attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode == http.StatusSwitchingProtocols {
			if err := switchAsked(req.Header, resp.Header); err != nil {
				// The reverse proxy refuses such an answer without closing it, which would
				// hold the lease (and the connection) for as long as the gateway runs: a
				// site could pin every slot of the fleet with one URL.
				resp.Body.Close()
				g.release(x.auth, l.LeaseID)
				g.failed(x, upstreamFailure{proxy: id, kind: failSwitched, detail: err.Error()})
				return nil, err
			}
		}
		resp.Header.Set(ProxyHeader, id)
		done := func() { g.release(x.auth, l.LeaseID) }
		if rwc, ok := resp.Body.(io.ReadWriteCloser); ok && resp.StatusCode == http.StatusSwitchingProtocols {
			lc := &leaseConn{ReadWriteCloser: rwc, g: g}
			lc.done = func() {
				g.untrackSwitched(lc)
				done()
			}
			if !g.trackSwitched(lc) {
				rwc.Close()
				g.release(x.auth, l.LeaseID)
				return nil, discovery.Errorf(codes.ReplicasUnavailable, "the gateway stopped while the site answered")
			}
			resp.Body = lc
		} else {
			resp.Body = &leaseBody{ReadCloser: resp.Body, done: done, silence: g.cfg.ResponseHeaderTimeout}
		}
		x.body = resp.Body
		return resp, nil
	}
	return nil, errUpstream
}

// proxysOwn says whether a plain answer is the fleet proxy's own rather than the site's,
// from what only a fleet proxy's own answers carry:
//
//   - a 407 with a challenge (Proxy-Authenticate). A proxy must send one with its 407
//     (RFC 9110, 11.7.1), and the fleet's proxies remove a site's before passing its
//     answer on (the local proxy as a hop-by-hop header, Squid unless a cache_peer passes
//     logins through), so a site cannot make its 407 look like the proxy's and have a
//     request sent again.
//   - an X-Squid-Error header: Squid names the error page it made itself there (its
//     denials, ERR_ACCESS_DENIED for a destination its rules deny, and its failures to
//     reach the site). A site behind a Squid of its own can send one too; its refusal then
//     goes unreported, which costs less than resting a proxy the site never refused.
//
// The realm of a challenge is no marker: a site can name any realm, and a fleet proxy's
// is configuration.
func proxysOwn(resp *http.Response) bool {
	if resp.StatusCode == http.StatusProxyAuthRequired {
		return resp.Header.Get("Proxy-Authenticate") != ""
	}
	return resp.Header.Get("X-Squid-Error") != ""
}

// switchAsked reports why a 101 answer may not be passed on: the crawler did not ask to
// switch protocols, or asked for another one than the site switched to (what the reverse
// proxy checks too, but without ending the answer).
func switchAsked(req, resp http.Header) error {
	asked, got := upgradeOf(req), upgradeOf(resp)
	switch {
	case asked == "":
		return fmt.Errorf("the site switched protocols (to %q) though the request did not ask to", got)
	case !strings.EqualFold(asked, got):
		return fmt.Errorf("the site switched protocols to %q when %q was asked", got, asked)
	}
	return nil
}

// upgradeOf is the protocol a header asks or answers to switch to: its Upgrade, if its
// Connection names it; "" otherwise. Non-printable values count as none.
func upgradeOf(h http.Header) string {
	named := false
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			named = named || strings.EqualFold(strings.TrimSpace(tok), "upgrade")
		}
	}
	if !named {
		return ""
	}
	up := h.Get("Upgrade")
	for _, c := range up {
		if c < ' ' || c > '~' {
			return ""
		}
	}
	return up
}

// reportStatus reports the proxy for the request's target on a status that says the
// site refused it.
func (g *Gateway) reportStatus(ctx context.Context, x *exchange, l *discovery.LeaseResponse, result string) {
	g.metrics.reports.WithLabelValues(result).Inc()
	if err := g.ops.ReportLease(ctx, x.auth, l.LeaseID, result, ""); err != nil {
		g.log.Warn("report from an answer's status not recorded", "proxy", l.Proxy.Namespace+"/"+l.Proxy.Name,
			"result", result, "error", err)
	}
}

// copyBuffers lends the reverse proxy its 32 KiB copy buffers: allocated per answer,
// they were most of the gateway's garbage.
type copyBuffers struct{}

var responseBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *responseBuffers.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { responseBuffers.Put(&b) }

// leaseBody releases a plain request's lease once its answer has been read or dropped.
//
// A read that waits longer than silence for the site's next bytes ends the answer (a
// site that stalls mid-answer would otherwise keep the lease for as long as it likes, the
// crawler's hang-up unseen when it has sent anything after its request): only time spent
// waiting on the site counts, not a crawler's slow reading.
type leaseBody struct {
	io.ReadCloser
	once    sync.Once
	done    func()
	silence time.Duration
	timer   *time.Timer
}

func (b *leaseBody) Read(p []byte) (int, error) {
	if b.silence <= 0 {
		return b.ReadCloser.Read(p)
	}
	if b.timer == nil {
		b.timer = time.AfterFunc(b.silence, func() { _ = b.Close() })
	} else {
		b.timer.Reset(b.silence)
	}
	n, err := b.ReadCloser.Read(p)
	b.timer.Stop()
	return n, err
}

func (b *leaseBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}

// leaseConn is leaseBody for an upgraded connection (a WebSocket over plain HTTP), which
// the reverse proxy needs to write to as well. The reverse proxy ends it as soon as the
// crawler's side ends (it has no CloseWrite); once the site's side has ended, the crawler
// has HalfClosedTimeout of silence to finish or close.
type leaseConn struct {
	io.ReadWriteCloser
	g      *Gateway
	once   sync.Once
	done   func()
	closed atomic.Bool
	ended  atomic.Bool
	// moved counts the bytes the crawler sent, for closeWhenIdle, and idle is its timer.
	moved atomic.Int64
	idle  atomic.Pointer[time.Timer]
}

func (b *leaseConn) Read(p []byte) (int, error) {
	n, err := b.ReadWriteCloser.Read(p)
	if err == io.EOF && !b.ended.Swap(true) {
		b.g.closeWhenIdle(&b.idle, &b.moved, b.closed.Load, func() { _ = b.Close() })
	}
	return n, err
}

func (b *leaseConn) Write(p []byte) (int, error) {
	n, err := b.ReadWriteCloser.Write(p)
	b.moved.Add(int64(n))
	return n, err
}

func (b *leaseConn) Close() error {
	b.closed.Store(true)
	stopIdle(&b.idle)
	err := b.ReadWriteCloser.Close()
	b.once.Do(b.done)
	return err
}

// forwardFailed answers a plain request that no fleet proxy carried.
func (g *Gateway) forwardFailed(w http.ResponseWriter, r *http.Request, err error) {
	x, _ := r.Context().Value(exchangeKey{}).(*exchange)
	if x == nil {
		g.fail(w, err)
		return
	}
	if r.Context().Err() != nil {
		// The crawler went away (while its request waited for a slot, say): nobody
		// reads an answer.
		x.result = "canceled"
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	if nl, ok := errors.AsType[noLease](err); ok {
		x.result = g.failNoLease(w, x, nl.err)
		return
	}
	if len(x.failures) > 0 {
		x.result = g.fail(w, x.upstreamError())
		return
	}
	x.result = g.fail(w, err)
}

// --- leases held ---------------------------------------------------------------------

func (g *Gateway) hold(id, auth string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.held[id]; !ok {
		g.metrics.leasesHeld.Inc()
	}
	g.held[id] = auth
}

// unhold stops renewing lease id, and says whether it was held.
func (g *Gateway) unhold(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.held[id]; !ok {
		return false
	}
	delete(g.held, id)
	g.metrics.leasesHeld.Dec()
	return true
}

// release ends a lease the gateway held, and wakes a request waiting for a slot.
func (g *Gateway) release(auth, id string) {
	g.unhold(id)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := g.ops.ReleaseLease(ctx, auth, id); err != nil {
		g.log.Debug("lease not released; it frees up when it expires", "lease", id, "error", err)
	}
	g.freed.Add(1)
	g.waiters.Wake()
}

// renewHeld renews every lease held, so that a request or tunnel keeps its slot for as
// long as it lasts and not a moment longer than LeaseTTL after the gateway died. A lease
// that cannot be renewed any more (its proxy is gone) is dropped: the request or tunnel
// on it carries on, uncounted, while it works.
func (g *Gateway) renewHeld(ctx context.Context) {
	t := time.NewTicker(g.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.renewPass(ctx)
		}
	}
}

// renewConcurrency bounds the renewals of one pass in flight at once. A renewal may wait
// for a peer's copy or for the lease's owner (up to seconds when one is slow): one at a
// time, the leases at the end of a long pass expired under open tunnels.
const renewConcurrency = 32

// renewPass renews the leases held now, up to renewConcurrency at once, each bounded by
// the pass interval, so one slow owner or peer delays none of the others.
func (g *Gateway) renewPass(ctx context.Context) {
	g.mu.Lock()
	held := maps.Clone(g.held)
	g.mu.Unlock()
	sem := make(chan struct{}, renewConcurrency)
	var wg sync.WaitGroup
	for id, auth := range held {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, g.cfg.LeaseTTL/3)
			defer cancel()
			err := g.renewOne(rctx, auth, id)
			if err == nil {
				return
			}
			if ae, _ := discovery.ErrorOf(err); ae.Code == codes.ReplicasUnavailable || rctx.Err() != nil && ctx.Err() == nil {
				return // the owner will answer again; the lease has LeaseTTL/3*2 left
			}
			// A lease released since the pass began is not lost: its request ended.
			if g.unhold(id) {
				g.metrics.leasesLost.Inc()
			}
		})
	}
	wg.Wait()
}

// renewOne renews one held lease (a field only so tests can stand in a slow owner).
func (g *Gateway) renewOne(ctx context.Context, auth, id string) error {
	if g.renewHook != nil {
		return g.renewHook(ctx, auth, id)
	}
	_, err := g.ops.RenewLease(ctx, auth, id, g.cfg.LeaseTTL)
	return err
}

// serveUntil serves hs on ln until ctx ends, then stops accepting and gives the requests
// in flight up to 10s. It returns the error of serving (nil for that stop) and the
// shutdown's, which says requests were cut off.
func serveUntil(ctx context.Context, hs *http.Server, ln net.Listener) (err, shutdownErr error) {
	shutdown := make(chan error, 1)
	go func() {
		<-ctx.Done()
		sctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		shutdown <- hs.Shutdown(sctx)
	}()
	err = hs.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil, <-shutdown
	}
	return err, nil
}

// Serve runs the gateway on ln until ctx ends. Then it stops accepting, gives plain
// requests in flight up to 10s, closes the tunnels still open and releases their leases.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	renewed := make(chan struct{})
	go func() { g.renewHeld(ctx); close(renewed) }()
	// No read or write timeout: a plain answer may stream for as long as the site sends
	// it, and a tunnel lives past its handler. The header timeout bounds a silent client.
	hs := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelDebug)}
	err, _ := serveUntil(ctx, hs, ln)
	cancel()
	g.mu.Lock()
	g.closed = true
	open := make([]*tunnel, 0, len(g.tunnels))
	for t := range g.tunnels {
		open = append(open, t)
	}
	switched := slices.Collect(maps.Keys(g.switched))
	g.mu.Unlock()
	// Each tunnel's splices end and release its lease; a switched connection releases its
	// lease as it closes (the server does not wait for either).
	for _, t := range open {
		t.close()
	}
	for _, c := range switched {
		_ = c.Close()
	}
	<-renewed
	return err
}
