package discovery

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// APIError is the body of every error answer.
type APIError struct {
	Code    string `json:"error"`
	Message string `json:"message"`
	// NoMatch details a 409.
	*NoMatch `json:",omitempty"`
	// Reason details a proxy_gone: a ProxyGone reason.
	Reason string `json:"reason,omitempty"`
	// RetryAfterSeconds, when set, is also the Retry-After header: how long to wait before
	// the same request can succeed.
	RetryAfterSeconds int `json:"retryAfterSeconds,omitempty"`
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

// Errorf is the error answered with code (a codes constant) and the message.
func Errorf(code, format string, args ...any) *APIError {
	return &APIError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Operations an opError comes from.
const (
	opAcquire = "acquire"
	opRenew   = "renew"
	opReport  = "report"
)

// opError is an error of the store with the request it failed for: the API's messages name
// the lease or the target, which the store's errors do not carry. Its text is the store's
// error alone; what it adds is for ErrorOf.
type opError struct {
	op      string // opAcquire, opRenew or opReport
	leaseID string // renew and report
	target  string // acquire
	err     error
}

func (e *opError) Error() string { return e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// ErrorOf maps err to the answer the API and the gateway give for it: an *APIError as it is (request
// validation and DecodeJSON make those), and the store's errors (*NoMatch, ErrUnknownLease,
// ErrLeaseExpired) worded with what their *opError names. Any other error is a bug of
// discovery: known is false, and the answer is a bare internal error, so that nothing of
// err reaches the client; the caller logs err.
func ErrorOf(err error) (ae *APIError, known bool) {
	if e, ok := errors.AsType[*APIError](err); ok {
		return e, true
	}
	var op opError
	if oe, ok := errors.AsType[*opError](err); ok {
		op = *oe
	}
	if nm, ok := errors.AsType[*NoMatch](err); ok {
		ae := &APIError{Code: codes.NoMatch, NoMatch: nm,
			Message: fmt.Sprintf("no proxy available: %d match the selector, %d unhealthy, %d at capacity, %d in cooldown%s",
				nm.Considered, nm.Unhealthy, nm.AtCapacity, nm.InCooldown, forTarget(op.target))}
		if nm.RetryAfter > 0 {
			ae.RetryAfterSeconds = int((nm.RetryAfter + time.Second - 1) / time.Second)
			ae.Message += fmt.Sprintf("; the first frees up in %ds", ae.RetryAfterSeconds)
		}
		return ae, true
	}
	if ll, ok := errors.AsType[*LeaseLimit](err); ok {
		ae := Errorf(codes.LeaseLimit, "client %q holds %d leases, as many as it may; release one or wait", ll.Client, ll.Max)
		ae.RetryAfterSeconds = int((ll.RetryAfter + time.Second - 1) / time.Second)
		return ae, true
	}
	if pg, ok := errors.AsType[*ProxyGone](err); ok {
		return &APIError{Code: codes.ProxyGone, Reason: pg.Reason,
			Message: fmt.Sprintf("lease %q has ended: its proxy %s; acquire a new lease", op.leaseID, goneText(pg.Reason))}, true
	}
	switch {
	case errors.Is(err, ErrUnknownLease) && op.op == opReport:
		// Reports are taken for the cooldown window after a lease ends, so an unknown
		// lease may also be one that ended before that window.
		return Errorf(codes.UnknownLease, "no lease %q (or it expired more than the cooldown window ago)", op.leaseID), true
	case errors.Is(err, ErrUnknownLease):
		return Errorf(codes.UnknownLease, "no lease %q", op.leaseID), true
	case errors.Is(err, ErrReportLimit):
		return Errorf(codes.ReportLimit, "lease %q has reported as many cooldowns as a lease may; report further ones on a new lease", op.leaseID), true
	case errors.Is(err, ErrLeaseExpired):
		return Errorf(codes.LeaseExpired, "lease %q has expired; acquire a new one", op.leaseID), true
	}
	return Errorf(codes.Internal, "internal error"), false
}

func goneText(reason string) string {
	switch reason {
	case ProxyGoneReplaced:
		return "was replaced by an instance with another address"
	case ProxyGoneUnhealthy:
		return "is unhealthy"
	default:
		return "has left the fleet"
	}
}

// forTarget ends a no_match message: cooldowns are counted for the target, so without one
// only those for every target keep a proxy back.
func forTarget(t string) string {
	if t == "" {
		return " (no target given: only cooldowns for every target apply)"
	}
	return fmt.Sprintf(" for %q", t)
}

// fail answers with err, as ErrorOf maps it. An internal error is logged, never shown.
func (s *Server) fail(c *gin.Context, err error) {
	ae, known := ErrorOf(err)
	if !known {
		s.log.Error("internal error", "method", c.Request.Method, "path", c.FullPath(), "error", err)
	}
	if ae.RetryAfterSeconds > 0 {
		c.Header("Retry-After", strconv.Itoa(ae.RetryAfterSeconds))
	}
	c.AbortWithStatusJSON(codes.Status(ae.Code), ae)
}
