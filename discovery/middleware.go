package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

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
	name := clientName(c)
	if name != "" {
		s.metrics.clientRequests.WithLabelValues(name, strconv.Itoa(c.Writer.Status())).Inc()
	}
	if probeRoute(route) {
		return
	}
	s.log.Info("request", "method", c.Request.Method, "route", route, "status", c.Writer.Status(),
		"duration", time.Since(start).Round(time.Microsecond).String(), "remote", c.ClientIP(), "client", name)
}

// probeRoute reports whether route is polled by probes or Prometheus every few seconds,
// or is one of the calls replicas make to each other for every lease change: logging or
// tracing each of those would drown the requests of crawlers. They are still counted in
// the request metrics.
func probeRoute(route string) bool {
	return route == "/healthz" || route == "/readyz" || route == "/metrics" || strings.HasPrefix(route, "/peer/")
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

func (s *Server) indexLoading(c *gin.Context) { s.fail(c, ErrIndexLoading()) }

// ErrIndexLoading is the answer while the index has not been loaded in full, with its
// Retry-After.
func ErrIndexLoading() *APIError {
	e := Errorf(codes.IndexLoading, "the proxy index is still loading from Temporal; retry shortly")
	e.RetryAfterSeconds = 1
	return e
}

// readyz serves GET and HEAD /readyz: 200 once the index is loaded (and, in a replica
// set, this replica's leases restored), 503 before, so a Service sends crawlers only to
// replicas that can lease, and a rolling update stops a replica only once the one it
// replaced holds its leases again. HEAD gets no body.
func (s *Server) readyz(c *gin.Context) {
	head, loaded := c.Request.Method == http.MethodHead, s.store.Loaded()
	switch {
	case loaded && !s.restored() && head:
		c.Header("Retry-After", retryIndexAfter)
		c.AbortWithStatus(codes.Status(codes.ReplicasUnavailable))
	case loaded && !s.restored():
		s.fail(c, Unavailable("this replica is restoring its leases from the others"))
	case !loaded && head:
		c.Header("Retry-After", retryIndexAfter)
		c.AbortWithStatus(codes.Status(codes.IndexLoading))
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
		limit := s.cfg.BodyLimit
		if strings.HasPrefix(c.Request.URL.Path, "/peer/") {
			// Replicas send batches of lease changes (maxBatch records of well under
			// 1 KiB each); the route is closed to all but them.
			limit = maxBatch << 10
		}
		c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, limit)
	}
	c.Next()
}

// clientKey is where authenticate leaves the request's *Client in the gin context.
const clientKey = "proxyfleet.client"

// authenticate finds the client whose token the request bears, and holds it to its rate
// limit. A request another replica forwarded was counted where it arrived.
func (s *Server) authenticate(c *gin.Context) {
	if s.clients == nil {
		c.Next()
		return
	}
	cl := s.bearerClient(c.GetHeader("Authorization"))
	if cl == nil {
		c.Header("WWW-Authenticate", `Bearer realm="proxyfleet"`)
		s.fail(c, Errorf(codes.Unauthorized, "a valid bearer token is required"))
		return
	}
	c.Set(clientKey, cl)
	if !s.fromPeer(c) {
		if e := s.Throttle(cl); e != nil {
			s.fail(c, e)
			return
		}
	}
	c.Next()
}

// bearerClient is the client whose token an Authorization header bears, or nil (also when
// authentication is off). The scheme name is case-insensitive (RFC 9110).
func (s *Server) bearerClient(auth string) *Client {
	scheme, token, _ := strings.Cut(auth, " ")
	if s.clients == nil || !strings.EqualFold(scheme, "Bearer") {
		return nil
	}
	return s.clients.lookup(token)
}

// Throttle holds a client to its requests per second, through the API or the gateway:
// nil when the request may go on, else the 429 to answer.
func (s *Server) Throttle(cl *Client) *APIError {
	if cl.limiter == nil {
		return nil
	}
	now := time.Now()
	r := cl.limiter.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d == 0 && r.OK() {
		return nil
	}
	r.CancelAt(now)
	s.metrics.throttled.WithLabelValues(cl.name, "requests").Inc()
	e := Errorf(codes.TooManyRequests, "client %q is over its limit of %g requests per second", cl.name, float64(cl.limiter.Limit()))
	e.RetryAfterSeconds = int(max(1, (d+time.Second-1)/time.Second))
	return e
}

// clientOf is the client authenticate found (nil when authentication is off).
func clientOf(c *gin.Context) *Client {
	cl, _ := c.Get(clientKey)
	v, _ := cl.(*Client)
	return v
}

// clientName labels a request's client in logs and metrics.
func clientName(c *gin.Context) string {
	if cl := clientOf(c); cl != nil {
		return cl.name
	}
	return ""
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
		return Errorf(codes.Invalid, "a JSON body is required")
	}
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &tooBig):
		return Errorf(codes.TooLarge, "request body exceeds %d bytes", tooBig.Limit)
	case errors.Is(err, io.EOF):
		if allowEmpty {
			return nil
		}
		return Errorf(codes.Invalid, "a JSON body is required")
	case errors.As(err, &typeErr):
		return Errorf(codes.Invalid, "field %q: want %s, got %s", typeErr.Field, typeErr.Type, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return Errorf(codes.Invalid, "malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case err != nil && strings.HasPrefix(err.Error(), "json: unknown field"):
		return Errorf(codes.Invalid, "%s", strings.TrimPrefix(err.Error(), "json: "))
	case err != nil:
		return Errorf(codes.Invalid, "invalid JSON: %v", err)
	}
	// Anything after the object is a client bug worth reporting.
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if errors.As(err, &tooBig) {
			return Errorf(codes.TooLarge, "request body exceeds %d bytes", tooBig.Limit)
		}
		return Errorf(codes.Invalid, "unexpected data after the JSON object")
	}
	return nil
}
