package httpapi

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/codes"
	"github.com/proxyfleet/proxyfleet/discovery/peer"
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
	if !s.ops.Loaded() {
		s.indexLoading(c)
		return
	}
	c.Next()
}

func (s *Server) indexLoading(c *gin.Context) { s.fail(c, discovery.ErrIndexLoading()) }

// readyz serves GET and HEAD /readyz: 200 once the index is loaded (and, in a replica
// set, this replica's leases restored), 503 before, so a Service sends crawlers only to
// replicas that can lease, and a rolling update stops a replica only once the one it
// replaced holds its leases again. HEAD gets no body.
func (s *Server) readyz(c *gin.Context) {
	head, loaded := c.Request.Method == http.MethodHead, s.ops.Loaded()
	switch {
	case loaded && !s.peers.Restored() && head:
		c.Header("Retry-After", retryIndexAfter)
		c.AbortWithStatus(codes.Status(codes.ReplicasUnavailable))
	case loaded && !s.peers.Restored():
		s.fail(c, discovery.Unavailable("this replica is restoring its leases from the others"))
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
			// Replicas send batches of lease changes; the route is closed to all but them.
			limit = peer.BodyLimit
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
	if s.ops.Open() {
		c.Next()
		return
	}
	cl := s.ops.BearerClient(c.GetHeader("Authorization"))
	if cl == nil {
		c.Header("WWW-Authenticate", `Bearer realm="proxyfleet"`)
		s.fail(c, discovery.Errorf(codes.Unauthorized, "a valid bearer token is required"))
		return
	}
	c.Set(clientKey, cl)
	if !s.peers.FromPeer(c.Request) {
		if e := s.ops.Throttle(cl); e != nil {
			s.fail(c, e)
			return
		}
	}
	c.Next()
}

// clientOf is the client authenticate found (nil when authentication is off).
func clientOf(c *gin.Context) *discovery.Client {
	cl, _ := c.Get(clientKey)
	v, _ := cl.(*discovery.Client)
	return v
}

// clientName labels a request's client in logs and metrics.
func clientName(c *gin.Context) string {
	if cl := clientOf(c); cl != nil {
		return cl.Name()
	}
	return ""
}

// decode reads a JSON body strictly (discovery.DecodeJSON).
func (s *Server) decode(c *gin.Context, v any, allowEmpty bool) error {
	return discovery.DecodeJSON(c.Request.Body, v, allowEmpty)
}
