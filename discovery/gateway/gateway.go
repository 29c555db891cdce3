// Package gateway is discovery's forward proxy: the whole fleet behind one HTTP_PROXY
// address (plain HTTP and CONNECT), for crawlers that cannot speak the lease API. It
// leases through the same operations as the API's handlers (the leaseOps it is given), so
// its crawlers count against maxLeases, client caps, cooldowns and sessions as the API's
// do; what is its own is the proxying: dialling fleet proxies, tunnels, retries, waiting
// for a slot and renewing the leases of long requests.
package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	// Wait is how long a request or tunnel waits for a proxy when none can take it now:
	// every one that could is at capacity or resting, or none matches yet or is healthy
	// (default 10s; negative: not at all). A crawler's tool seldom honours Retry-After on a
	// proxy's 503, and slots free up as other requests end, so a short wait here turns a
	// refusal into a delay.
	Wait time.Duration
	// GrowWait is how long a request or tunnel waits instead, when no proxy can take it
	// because none matches it yet or none is healthy, and the proxies it asks for may
	// grow: their selector is watched (a ProxyPool's autoscaler asks its demand), now or
	// by the end of Wait. A pool
	// scaled to zero then serves its first request once it has started a proxy, rather
	// than refusing it (default 2m; a crawler's own timeout, Scrapy's 3 minutes, is
	// longer; negative: not at all).
	GrowWait time.Duration
	// HalfClosedTimeout bounds how long a tunnel (or a switched plain connection) stays
	// open, and keeps its lease, once one side has ended while the other sends nothing
	// (default 30s). A crawler that hangs up must not leave its slot to a site that never
	// finishes, nor a site that is done to a crawler that never closes.
	HalfClosedTimeout time.Duration
	// KeepAliveAfter is how long a tunnel lasts before its fleet proxy's connection gets
	// TCP keepalive (default 15s), which notices a fleet proxy gone without a word (a VM
	// lost) and frees the slot. Set at the dial, it would cost four system calls for every
	// tunnel, most of which carry one fetch and end within this.
	KeepAliveAfter time.Duration
	// Loops is how many event loops serve CONNECT tunnels (Linux; default one per
	// processor Go uses; negative: none, a goroutine per connection as elsewhere). A loop
	// serves a tunnel from its head to its end with no goroutine of its own, which costs
	// about a third less CPU per tunnel; everything else goes to the HTTP server.
	Loops int
}

// Defaults of Config.
const (
	DefaultAttempts       = 3
	DefaultLeaseTTL       = time.Minute
	DefaultConnectTimeout = 10 * time.Second
	DefaultHeaderTimeout  = time.Minute
	DefaultWait           = 10 * time.Second
	DefaultGrowWait       = 2 * time.Minute
	DefaultHalfClosed     = 30 * time.Second
	DefaultKeepAliveAfter = 15 * time.Second
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
	if c.GrowWait == 0 {
		c.GrowWait = DefaultGrowWait
	}
	orDefault(&c.HalfClosedTimeout, DefaultHalfClosed)
	orDefault(&c.KeepAliveAfter, DefaultKeepAliveAfter)
	if c.Loops == 0 {
		c.Loops = loopCount()
	}
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
	transport *fleetTransport
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
	// loops are the event loops Serve runs, if any.
	loops *loopSet
	// headerTimeout bounds a crawler's request head (headerTimeout; tests shorten it).
	headerTimeout time.Duration

	// waitPoll bounds how long a request waiting for a slot goes without looking by
	// itself (0: the domain's); every change of the store that can free a slot wakes the
	// first waiter at once (discovery.WaitForProxy).
	waitPoll time.Duration
}

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
	// Alone says every operation is answered from memory, without a peer (no replica set):
	// the event loop then grants and releases inline instead of on a goroutine.
	Alone() bool
	// WaitForProxy waits for a lease Grant refused, in the queue the API's waiting
	// acquires share (discovery.Server.WaitForProxy).
	WaitForProxy(ctx context.Context, w discovery.Want, wait time.Duration, refusal error, freed uint64, how discovery.Waiting) (*discovery.LeaseResponse, error)
	// MayGrow says whether the proxies a selector asks for may grow (discovery's demand);
	// NoteRefusal counts a refusal answered without a wait as demand for them.
	MayGrow(want discovery.Selector) bool
	NoteRefusal(w discovery.Want, err error)
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
		switched: map[*leaseConn]struct{}{}, headerTimeout: headerTimeout}
	for _, st := range cfg.ReportStatuses {
		g.report[st] = contract.ReportBanned
		if st == http.StatusTooManyRequests {
			g.report[st] = contract.ReportRateLimited
		}
	}
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}
	g.transport = newFleetTransport(dialer, cfg.ResponseHeaderTimeout, &http.Transport{
		Proxy:       fleetProxyOf,
		DialContext: dialer.DialContext,
		// The crawler's own Accept-Encoding goes through untouched, and its answer too.
		DisableCompression:    true,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       time.Minute,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
	})
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
		Transport: gatewayRoundTripper{g},
		// After the reverse proxy removed the answer's hop-by-hop headers, those its
		// Connection names included: a site can neither strip the header that names the
		// proxy (by naming it in Connection) nor forge the gateway's own error mark.
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(ErrorHeader)
			resp.Header.Del(ProxyHeader)
			if x, _ := resp.Request.Context().Value(exchangeKey{}).(*exchange); x != nil && len(x.tried) > 0 {
				// The last proxy tried is the one whose answer this is.
				resp.Header.Set(ProxyHeader, x.tried[len(x.tried)-1])
			}
			return nil
		},
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
	// final says a proxy refused the request itself: no other is tried.
	final bool
	// result is a forwarded request's outcome when it is not ok.
	result string
	// body is the answer handed to the reverse proxy, whose Close ends the lease.
	body io.Closer
	// flusher sends on what the crawler's connection holds of a plain answer (leaseBody).
	flusher http.Flusher
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
	h := takeHandoff(r.Context())
	if h != nil {
		// The event loop began this CONNECT: it goes on where the loop stopped.
		x = h.x
		x.span = span
		x.span.SetAttributes(attribute.String("server.address", x.target))
		for _, f := range x.failures {
			// What the loop's attempts met, on the request's span as the server's are.
			span.AddEvent("upstream failure", trace.WithAttributes(attribute.String("proxyfleet.proxy", f.proxy),
				attribute.String("proxyfleet.gateway.failure", f.kind)))
		}
	}
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
	if h != nil {
		if h.refusal != nil {
			record(g.failNoLease(w, x, h.refusal))
			return
		}
		record(g.tunnel(w, r.WithContext(ctx), x))
		return
	}
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
	x.flusher, _ = w.(http.Flusher)
	if !r.ProtoAtLeast(1, 1) {
		w = noInterim{w}
	}
	g.forward.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), exchangeKey{}, x)))
	if x.result == "" {
		return "ok"
	}
	return x.result
}

// noInterim is the answer writer of a crawler that spoke HTTP/1.0, which must not be sent
// a 1xx answer (RFC 9110, 15.2): it would read the site's 103 as the final answer, without
// a length, and the real answer as its body. The site's 1xx answers are dropped; the
// reverse proxy reaches the flusher and hijacker below through Unwrap.
type noInterim struct{ http.ResponseWriter }

func (w noInterim) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w noInterim) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// authenticate finds the client whose token is the password of the request's proxy
// credentials, reads the options of its username and holds it to its rate limit.
func (g *Gateway) authenticate(r *http.Request, x *exchange) *discovery.APIError {
	if ae := g.identify(r.Header, x); ae != nil || x.client == nil {
		return ae
	}
	return g.ops.Throttle(x.client)
}

// identify is authenticate without the rate limit: it finds the client and reads the
// username's options, and changes nothing.
func (g *Gateway) identify(h http.Header, x *exchange) *discovery.APIError {
	user, password, ok := proxyCredentials(h)
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
	return nil
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
	x.final = x.final || !f.retry
	x.span.AddEvent("upstream failure", trace.WithAttributes(attribute.String("proxyfleet.proxy", f.proxy),
		attribute.String("proxyfleet.gateway.failure", f.kind)))
	g.log.Info("fleet proxy failed", "proxy", f.proxy, "kind", f.kind, "detail", f.detail, "client", x.clientName())
}

// leaseFor grants the next attempt's lease, on a proxy not tried yet, waiting for a slot
// when none is free (see waitForSlot).
func (g *Gateway) leaseFor(ctx context.Context, x *exchange) (*discovery.LeaseResponse, error) {
	freed := g.ops.Freed()
	l, err := g.ops.Grant(ctx, x.want(g.cfg.LeaseTTL), x.skip)
	if err != nil {
		if l, err = g.waitForSlot(ctx, x, err, freed); err != nil {
			return nil, err
		}
	}
	x.tried = append(x.tried, l.Proxy.Namespace+"/"+l.Proxy.Name)
	g.hold(l.LeaseID, x.auth)
	return l, nil
}

// waitForSlot waits up to Wait for a lease the store refused with refusal: a proxy that
// could take it may free a slot (every one full or resting, or the client at its cap) or
// turn up (none matches yet, or none is healthy). When the proxies it asks for may grow
// (MayGrow: a pool's autoscaler watches them), it waits up to GrowWait instead, counting as
// that pool's demand meanwhile; a request that began waiting before the autoscaler first
// looked at a new pool goes on waiting once it has. It waits as the API's acquires do, in
// their queue, passing over the proxies it tried; freed is the store's count of freeing
// changes before the refused grant. It returns the last refusal if none came.
func (g *Gateway) waitForSlot(ctx context.Context, x *exchange, refusal error, freed uint64) (*discovery.LeaseResponse, error) {
	want := x.want(g.cfg.LeaseTTL)
	if !worthWaiting(refusal) && !mayAppear(refusal) {
		return nil, refusal
	}
	// A refusal answered without a wait is demand, as an acquire's is (a wait that runs
	// out is noted where it ends).
	refuse := func(err error) (*discovery.LeaseResponse, error) {
		g.ops.NoteRefusal(want, err)
		return nil, err
	}
	worth := func(err error) bool { return worthWaiting(err) || mayAppear(err) }
	start, counted := time.Now(), false
	for {
		limit := g.cfg.Wait
		grows := g.cfg.GrowWait > 0 && mayAppear(refusal) && g.ops.MayGrow(want.Selector)
		if grows {
			limit = max(limit, g.cfg.GrowWait)
		}
		left := limit - time.Since(start)
		if limit < 0 || left <= 0 {
			return refuse(refusal)
		}
		if !counted {
			g.metrics.waits.Inc()
			counted = true
		}
		l, err := g.ops.WaitForProxy(ctx, want, left, refusal, freed,
			discovery.Waiting{Skip: x.skip, Worth: worth, Poll: g.waitPoll})
		if err == nil || ctx.Err() != nil || grows || !mayAppear(err) || !g.ops.MayGrow(want.Selector) {
			return l, err
		}
		// Watched since the wait began: wait on, up to GrowWait in all.
		refusal, freed = err, g.ops.Freed()
	}
}

// mayAppear says whether a refusal was for want of any proxy that could take the request
// (none matches, or none is healthy): one may come, or heal, while the request waits.
func mayAppear(err error) bool {
	nm := discovery.NoMatchOf(err)
	return nm != nil && nm.AtCapacity == 0 && nm.InCooldown == 0
}

// worthWaiting says whether a refused grant may succeed soon by itself: some matching
// proxy is full or resting (not when every one is unhealthy or none matches), or the
// client is at its cap. The refusal may come from this replica's store or, in a replica
// set, as the answer of the proxy's owner.
func worthWaiting(err error) bool {
	if nm := discovery.NoMatchOf(err); nm != nil {
		return nm.AtCapacity > 0 || nm.InCooldown > 0
	}
	if _, limited := errors.AsType[*discovery.LeaseLimit](err); limited {
		return true
	}
	ae, ok := errors.AsType[*discovery.APIError](err)
	return ok && ae.Code == codes.LeaseLimit
}
