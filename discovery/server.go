package discovery

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"

	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Config configures the API.
type Config struct {
	// Token is the bearer token crawlers present; empty turns authentication off (loudly).
	Token string
	// DefaultTTL applies when a lease request has no ttlSeconds; MaxTTL is the most a
	// lease or renewal may ask for (more is a 400, not a silent clamp).
	DefaultTTL, MaxTTL time.Duration
	// CooldownRateLimited and CooldownBanned are how long a proxy rests for a target after
	// such a report.
	CooldownRateLimited, CooldownBanned time.Duration
	// BodyLimit caps request bodies (default 64 KiB).
	BodyLimit int64
}

// Defaults of Config and of the refresher; cmd/discovery's flags default to them too.
const (
	DefaultTTL                 = 5 * time.Minute
	DefaultMaxTTL              = time.Hour
	DefaultCooldownRateLimited = 5 * time.Minute
	DefaultCooldownBanned      = 30 * time.Minute
	DefaultBodyLimit           = 64 << 10
	DefaultRefreshInterval     = time.Second
	DefaultFullResyncInterval  = 5 * time.Minute
)

func (c *Config) defaults() {
	orDefault(&c.DefaultTTL, DefaultTTL)
	orDefault(&c.MaxTTL, DefaultMaxTTL)
	orDefault(&c.CooldownRateLimited, DefaultCooldownRateLimited)
	orDefault(&c.CooldownBanned, DefaultCooldownBanned)
	if c.BodyLimit <= 0 {
		c.BodyLimit = DefaultBodyLimit
	}
}

// orDefault sets a zero or negative duration to def.
func orDefault(d *time.Duration, def time.Duration) {
	if *d <= 0 {
		*d = def
	}
}

// Signaler forwards reports to the proxies' workflows, which keep cooldowns durably.
type Signaler interface {
	Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error
}

// TemporalSignaler signals ProxyWorkflows.
type TemporalSignaler struct {
	Client interface {
		SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
	}
}

// Report implements Signaler.
func (t TemporalSignaler) Report(ctx context.Context, namespace, name string, sig contract.ReportSignal) error {
	return t.Client.SignalWorkflow(ctx, contract.ProxyWorkflowID(namespace, name), "", contract.SignalReport, sig)
}

// Server is the discovery API.
type Server struct {
	cfg     Config
	store   *Store
	signal  Signaler
	log     *slog.Logger
	metrics *serverMetrics
	// reports queues durable report signals, so a slow Temporal never slows a crawler.
	reports chan pendingReport
}

type pendingReport struct {
	namespace, name string
	sig             contract.ReportSignal
}

// NewServer builds the API. reg may be nil (no metrics).
func NewServer(cfg Config, store *Store, signal Signaler, log *slog.Logger, reg prometheus.Registerer) *Server {
	cfg.defaults()
	if log == nil {
		log = slog.Default()
	}
	s := &Server{cfg: cfg, store: store, signal: signal, log: log, reports: make(chan pendingReport, 4096)}
	s.metrics = newServerMetrics(reg, store)
	if cfg.Token == "" {
		log.Warn("WARNING: discovery runs WITHOUT authentication: no bearer token is configured; anyone who can reach it can lease proxies")
	}
	return s
}

// RunReports forwards queued reports to Temporal until ctx ends, retrying each a few times.
func (s *Server) RunReports(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-s.reports:
			var err error
			for attempt := range 5 {
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err = s.signal.Report(sctx, r.namespace, r.name, r.sig)
				cancel()
				if err == nil || ctx.Err() != nil {
					break
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(1<<attempt) * 200 * time.Millisecond):
				}
			}
			if err != nil {
				s.metrics.reportSignalFailures.Inc()
				s.log.Warn("report not forwarded to the proxy's workflow; the local cooldown still applies",
					"proxy", r.namespace+"/"+r.name, "target", r.sig.Target, "error", err)
			}
		}
	}
}

// Handler returns the HTTP handler with every route and middleware.
func (s *Server) Handler() http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.HandleMethodNotAllowed = true
	// A trailing slash or odd case gets a JSON 404, not a redirect with an HTML body.
	r.RedirectTrailingSlash, r.RedirectFixedPath = false, false
	// logRequests wraps recoverPanics so a recovered panic is logged and counted as the 500
	// it answers.
	// Server spans continue an incoming traceparent; probes and metrics scrapes are noise.
	r.Use(otelgin.Middleware("proxyfleet-discovery", otelgin.WithGinFilter(func(c *gin.Context) bool {
		return !probeRoute(c.FullPath())
	})))
	r.Use(s.logRequests, s.recoverPanics, s.limitBody)
	r.NoRoute(func(c *gin.Context) {
		s.fail(c, apiErr(codeNotFound, "no such route: %s %s", c.Request.Method, c.Request.URL.Path))
	})
	r.NoMethod(func(c *gin.Context) {
		s.fail(c, apiErr(codeMethodNotAllowed, "%s is not allowed on %s", c.Request.Method, c.Request.URL.Path))
	})
	healthz := func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) }
	r.GET("/healthz", healthz)
	r.HEAD("/healthz", func(c *gin.Context) { c.Status(http.StatusOK) })
	// /healthz is liveness (the process serves); /readyz is readiness (it has something
	// true to serve). Restarting a replica whose Temporal is down would not help, taking it
	// out of the Service until its index loads does.
	r.GET("/readyz", s.readyz)
	r.HEAD("/readyz", s.readyz)
	if s.metrics.handler != nil {
		r.GET("/metrics", gin.WrapH(s.metrics.handler))
	}
	v1 := r.Group("/v1", s.authenticate)
	// Only the answers that depend on the whole index wait for it. Renew, release and
	// report work on leases, which live in memory and are all this process has granted.
	v1.GET("/proxies", s.requireIndex, s.listProxies)
	v1.POST("/leases", s.requireIndex, s.acquire)
	v1.POST("/leases/:id/renew", s.renew)
	v1.DELETE("/leases/:id", s.release)
	v1.POST("/leases/:id/report", s.report)
	return r
}

// --- errors ------------------------------------------------------------------------

// Error codes of the API, mapped to HTTP statuses in exactly one place (status).
const (
	codeInvalid          = "invalid"
	codeInvalidResult    = "invalid_result"
	codeInvalidSelector  = "invalid_selector"
	codeUnauthorized     = "unauthorized"
	codeNotFound         = "not_found"
	codeUnknownLease     = "unknown_lease"
	codeLeaseExpired     = "lease_expired"
	codeNoMatch          = "no_match"
	codeTooLarge         = "too_large"
	codeMethodNotAllowed = "method_not_allowed"
	codeInternal         = "internal"
	// codeIndexLoading: the index has not been loaded from Temporal yet (just started, or
	// Temporal unreachable since), so an empty answer would be a lie.
	codeIndexLoading = "index_loading"
)

func status(code string) int {
	switch code {
	case codeInvalid, codeInvalidResult, codeInvalidSelector:
		return http.StatusBadRequest
	case codeUnauthorized:
		return http.StatusUnauthorized
	case codeNotFound, codeUnknownLease:
		return http.StatusNotFound
	case codeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case codeNoMatch:
		return http.StatusConflict
	case codeLeaseExpired:
		return http.StatusGone
	case codeTooLarge:
		return http.StatusRequestEntityTooLarge
	case codeIndexLoading:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

// APIError is the body of every error answer.
type APIError struct {
	Code    string `json:"error"`
	Message string `json:"message"`
	// NoMatch details a 409.
	*NoMatch `json:",omitempty"`
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

func apiErr(code, format string, args ...any) *APIError {
	return &APIError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// fail answers with err. Errors that are not *APIError are internal: logged, never shown.
func (s *Server) fail(c *gin.Context, err error) {
	var ae *APIError
	if !errors.As(err, &ae) {
		s.log.Error("internal error", "method", c.Request.Method, "path", c.FullPath(), "error", err)
		ae = apiErr(codeInternal, "internal error")
	}
	c.AbortWithStatusJSON(status(ae.Code), ae)
}

// --- middleware ----------------------------------------------------------------------

func (s *Server) recoverPanics(c *gin.Context) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.fail(c, fmt.Errorf("panic: %v", v))
		}
	}()
	c.Next()
}

func (s *Server) logRequests(c *gin.Context) {
	start := time.Now()
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	s.metrics.observeRequest(c.Request.Method, route, c.Writer.Status(), time.Since(start))
	if probeRoute(route) {
		return
	}
	s.log.Info("request", "method", c.Request.Method, "route", route, "status", c.Writer.Status(),
		"duration", time.Since(start).Round(time.Microsecond).String(), "remote", c.ClientIP())
}

// probeRoute reports whether route is polled by probes or Prometheus every few seconds:
// logging or tracing each of those would drown the requests of crawlers.
func probeRoute(route string) bool {
	return route == "/healthz" || route == "/readyz" || route == "/metrics"
}

// retryIndexAfter is the Retry-After of index_loading answers, in seconds: short, so that
// crawlers resume soon after the index loads, and each retry is one cheap refusal.
const retryIndexAfter = "1"

// requireIndex answers 503 index_loading until the store's index has been loaded in full.
// Before the first full pass from Temporal, an empty listing or a no_match with considered=0
// would be indistinguishable from a fleet without proxies, and a crawler would give up or
// alert instead of waiting a second.
func (s *Server) requireIndex(c *gin.Context) {
	if !s.store.Loaded() {
		s.indexLoading(c)
		return
	}
	c.Next()
}

func (s *Server) indexLoading(c *gin.Context) {
	c.Header("Retry-After", retryIndexAfter)
	s.fail(c, apiErr(codeIndexLoading, "the proxy index is still loading from Temporal; retry shortly"))
}

// readyz serves GET and HEAD /readyz: 200 once the index is loaded, 503 index_loading
// before, so a Service sends crawlers only to replicas that can lease. HEAD gets no body.
func (s *Server) readyz(c *gin.Context) {
	head, loaded := c.Request.Method == http.MethodHead, s.store.Loaded()
	switch {
	case !loaded && head:
		c.Header("Retry-After", retryIndexAfter)
		c.AbortWithStatus(status(codeIndexLoading))
	case !loaded:
		s.indexLoading(c)
	case head:
		c.Status(http.StatusOK)
	default:
		c.JSON(http.StatusOK, gin.H{"status": "ok"})
	}
}

func (s *Server) limitBody(c *gin.Context) {
	if c.Request.Body != nil {
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, s.cfg.BodyLimit)
	}
	c.Next()
}

func (s *Server) authenticate(c *gin.Context) {
	if s.cfg.Token == "" {
		c.Next()
		return
	}
	scheme, got, _ := strings.Cut(c.GetHeader("Authorization"), " ")
	// The scheme name is case-insensitive (RFC 9110); the token is compared in constant time.
	if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.Token)) != 1 {
		c.Header("WWW-Authenticate", `Bearer realm="proxyfleet"`)
		s.fail(c, apiErr(codeUnauthorized, "a valid bearer token is required"))
		return
	}
	c.Next()
}

// decode reads a JSON body strictly: unknown fields, trailing data and wrong types are 400,
// a body over the limit is 413. An empty body decodes as {} when allowEmpty.
func (s *Server) decode(c *gin.Context, v any, allowEmpty bool) error {
	return DecodeJSON(c.Request.Body, v, allowEmpty)
}

// DecodeJSON is the strict decoder of request bodies (exported for the fuzz target).
func DecodeJSON(r io.Reader, v any, allowEmpty bool) error {
	if r == nil {
		if allowEmpty {
			return nil
		}
		return apiErr(codeInvalid, "a JSON body is required")
	}
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &tooBig):
		return apiErr(codeTooLarge, "request body exceeds %d bytes", tooBig.Limit)
	case errors.Is(err, io.EOF):
		if allowEmpty {
			return nil
		}
		return apiErr(codeInvalid, "a JSON body is required")
	case errors.As(err, &typeErr):
		return apiErr(codeInvalid, "field %q: want %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return apiErr(codeInvalid, "malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case err != nil && strings.HasPrefix(err.Error(), "json: unknown field"):
		return apiErr(codeInvalid, "%s", strings.TrimPrefix(err.Error(), "json: "))
	case err != nil:
		return apiErr(codeInvalid, "invalid JSON: %v", err)
	}
	// Anything after the object is a client bug worth reporting.
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if errors.As(err, &tooBig) {
			return apiErr(codeTooLarge, "request body exceeds %d bytes", tooBig.Limit)
		}
		return apiErr(codeInvalid, "unexpected data after the JSON object")
	}
	return nil
}

// --- handlers ------------------------------------------------------------------------

// ProxyInfo is a proxy as the API shows it.
type ProxyInfo struct {
	Name          string            `json:"name"`
	Namespace     string            `json:"namespace"`
	URL           string            `json:"url"`
	IP            string            `json:"ip"`
	Port          int32             `json:"port"`
	Attributes    map[string]string `json:"attributes"`
	LatencyMillis int64             `json:"latencyMillis"`
}

func info(p Proxy) ProxyInfo {
	attrs := p.Attributes
	if attrs == nil {
		attrs = map[string]string{}
	}
	return ProxyInfo{
		Name: p.Name, Namespace: p.Namespace, IP: p.IP, Port: p.Port, Attributes: attrs, LatencyMillis: p.LatencyMillis,
		URL: "http://" + net.JoinHostPort(p.IP, strconv.Itoa(int(p.Port))),
	}
}

// ListedProxy is an entry of GET /v1/proxies.
type ListedProxy struct {
	ProxyInfo
	Healthy      bool   `json:"healthy"`
	Phase        string `json:"phase"`
	ActiveLeases int    `json:"activeLeases"`
	MaxLeases    int    `json:"maxLeases"`
}

// ProxyList is the body of GET /v1/proxies.
type ProxyList struct {
	Proxies []ListedProxy `json:"proxies"`
	Count   int           `json:"count"`
}

func (s *Server) listProxies(c *gin.Context) {
	sel, err := ParseQuerySelector(c.Request.URL.Query())
	if err != nil {
		s.fail(c, apiErr(codeInvalidSelector, "%v", err))
		return
	}
	var healthy *bool
	if h := c.Query("healthy"); h != "" {
		v, err := strconv.ParseBool(h)
		if err != nil {
			s.fail(c, apiErr(codeInvalid, "healthy must be true or false, got %q", h))
			return
		}
		healthy = &v
	}
	list := s.store.List(sel, healthy)
	out := ProxyList{Proxies: make([]ListedProxy, 0, len(list)), Count: len(list)}
	for _, p := range list {
		out.Proxies = append(out.Proxies, ListedProxy{ProxyInfo: info(p.Proxy), Healthy: p.Healthy, Phase: p.Phase,
			ActiveLeases: p.ActiveLeases, MaxLeases: p.MaxLeases})
	}
	c.JSON(http.StatusOK, out)
}

// LeaseRequest is the body of POST /v1/leases.
type LeaseRequest struct {
	Selector   Selector `json:"selector"`
	TTLSeconds int      `json:"ttlSeconds"`
	// Target is the site the crawler will visit: proxies in cooldown for it are skipped.
	Target string `json:"target"`
}

// LeaseResponse is the body of a granted lease (201) and a renewal (200).
type LeaseResponse struct {
	LeaseID    string    `json:"leaseID"`
	Proxy      ProxyInfo `json:"proxy"`
	ExpiresAt  time.Time `json:"expiresAt"`
	TTLSeconds int       `json:"ttlSeconds"`
	Target     string    `json:"target,omitempty"`
}

// Validate checks a lease request and fills defaults.
func (r *LeaseRequest) Validate(cfg Config) (time.Duration, error) {
	if err := r.Selector.Validate(); err != nil {
		return 0, apiErr(codeInvalidSelector, "%v", err)
	}
	if err := validateTarget(r.Target); err != nil {
		return 0, err
	}
	return ttl(r.TTLSeconds, cfg)
}

func ttl(seconds int, cfg Config) (time.Duration, error) {
	switch {
	case seconds < 0:
		return 0, apiErr(codeInvalid, "ttlSeconds must be positive")
	case seconds == 0:
		return cfg.DefaultTTL, nil
	// Compared in seconds: seconds*time.Second can overflow into a negative duration.
	case int64(seconds) > int64(cfg.MaxTTL/time.Second):
		return 0, apiErr(codeInvalid, "ttlSeconds %d exceeds the maximum of %d", seconds, int(cfg.MaxTTL/time.Second))
	}
	return time.Duration(seconds) * time.Second, nil
}

func validateTarget(t string) error {
	if len(t) > 253 || strings.ContainsAny(t, " \t\r\n/") {
		return apiErr(codeInvalid, "target must be a host name (at most 253 characters, no spaces or slashes)")
	}
	return nil
}

func (s *Server) acquire(c *gin.Context) {
	start := time.Now()
	var req LeaseRequest
	if err := s.decode(c, &req, true); err != nil {
		s.metrics.leaseRequests.WithLabelValues("invalid").Inc()
		s.fail(c, err)
		return
	}
	d, err := req.Validate(s.cfg)
	if err != nil {
		s.metrics.leaseRequests.WithLabelValues("invalid").Inc()
		s.fail(c, err)
		return
	}
	l, err := s.store.Acquire(req.Selector, req.Target, d)
	var nm *NoMatch
	if errors.As(err, &nm) {
		s.metrics.leaseRequests.WithLabelValues("no_match").Inc()
		c.AbortWithStatusJSON(status(codeNoMatch), &APIError{Code: codeNoMatch,
			Message: fmt.Sprintf("no proxy available: %d match the selector, %d unhealthy, %d at capacity, %d in cooldown%s",
				nm.Considered, nm.Unhealthy, nm.AtCapacity, nm.InCooldown, forTarget(req.Target)),
			NoMatch: nm})
		return
	}
	if err != nil {
		s.fail(c, err)
		return
	}
	s.metrics.leaseRequests.WithLabelValues("granted").Inc()
	s.metrics.acquireSeconds.Observe(time.Since(start).Seconds())
	c.JSON(http.StatusCreated, leaseResponse(l, d))
}

// leaseResponse shows a lease just granted or renewed for d. The TTL is d itself, not
// ExpiresAt minus the wall clock: ExpiresAt is on the store's clock.
func forTarget(t string) string {
	if t == "" {
		return " (no target given: only cooldowns for every target apply)"
	}
	return fmt.Sprintf(" for %q", t)
}

func leaseResponse(l *Lease, d time.Duration) LeaseResponse {
	return LeaseResponse{LeaseID: l.ID, Proxy: info(l.Proxy), ExpiresAt: l.ExpiresAt.UTC(),
		TTLSeconds: int(d / time.Second), Target: l.Target}
}

// RenewRequest is the body of POST /v1/leases/{id}/renew.
type RenewRequest struct {
	TTLSeconds int `json:"ttlSeconds"`
}

func (s *Server) renew(c *gin.Context) {
	var req RenewRequest
	if err := s.decode(c, &req, true); err != nil {
		s.fail(c, err)
		return
	}
	d, err := ttl(req.TTLSeconds, s.cfg)
	if err != nil {
		s.fail(c, err)
		return
	}
	l, err := s.store.Renew(c.Param("id"), d)
	switch {
	case errors.Is(err, ErrUnknownLease):
		s.fail(c, apiErr(codeUnknownLease, "no lease %q", c.Param("id")))
	case errors.Is(err, ErrLeaseExpired):
		s.fail(c, apiErr(codeLeaseExpired, "lease %q has expired; acquire a new one", c.Param("id")))
	case err != nil:
		s.fail(c, err)
	default:
		c.JSON(http.StatusOK, leaseResponse(l, d))
	}
}

func (s *Server) release(c *gin.Context) {
	s.store.Release(c.Param("id"))
	c.Status(http.StatusNoContent)
}

// ReportRequest is the body of POST /v1/leases/{id}/report.
type ReportRequest struct {
	Result string `json:"result"`
	// Target defaults to the lease's target; with neither, the report covers every target.
	Target string `json:"target"`
}

func (s *Server) report(c *gin.Context) {
	var req ReportRequest
	if err := s.decode(c, &req, false); err != nil {
		s.fail(c, err)
		return
	}
	var window time.Duration
	switch req.Result {
	case contract.ReportOK:
	case contract.ReportRateLimited:
		window = s.cfg.CooldownRateLimited
	case contract.ReportBanned:
		window = s.cfg.CooldownBanned
	default:
		s.fail(c, apiErr(codeInvalidResult, "result must be ok, rate_limited or banned, got %q", req.Result))
		return
	}
	if err := validateTarget(req.Target); err != nil {
		s.fail(c, err)
		return
	}
	l, err := s.store.Lookup(c.Param("id"))
	if err != nil {
		s.fail(c, apiErr(codeUnknownLease, "no lease %q (or it expired more than the cooldown window ago)", c.Param("id")))
		return
	}
	s.metrics.reports.WithLabelValues(req.Result).Inc()
	if window > 0 {
		target := req.Target
		if target == "" {
			target = l.Target
		}
		until := s.store.Now().Add(window)
		s.store.Cooldown(l.ProxyID, target, until)
		select {
		case s.reports <- pendingReport{namespace: l.Proxy.Namespace, name: l.Proxy.Name,
			sig: contract.ReportSignal{Target: target, Result: req.Result, Until: until.UTC()}}:
		default:
			s.metrics.reportSignalFailures.Inc()
			s.log.Warn("report queue full; the local cooldown applies but is not made durable", "proxy", l.ProxyID)
		}
	}
	c.Status(http.StatusNoContent)
}
