package discovery

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
)

// Error codes of the API, mapped to HTTP statuses in exactly one place (status).
const (
	codeInvalid         = "invalid"
	codeInvalidResult   = "invalid_result"
	codeInvalidSelector = "invalid_selector"
	codeUnauthorized    = "unauthorized"
	codeNotFound        = "not_found"
	codeUnknownLease    = "unknown_lease"
	// codeUnknownSession: the client has no session of that name (or it has been idle
	// for longer than sessions are remembered).
	codeUnknownSession = "unknown_session"
	codeLeaseExpired   = "lease_expired"
	// codeProxyGone: the lease ended because its proxy cannot serve it any more (replaced,
	// unhealthy or removed; the answer's reason says which). Acquire a new lease.
	codeProxyGone = "proxy_gone"
	// codeReportLimit: the lease has reported as many cooldowns as a lease may.
	codeReportLimit      = "report_limit"
	codeNoMatch          = "no_match"
	codeTooLarge         = "too_large"
	codeMethodNotAllowed = "method_not_allowed"
	codeInternal         = "internal"
	// codeIndexLoading: the index has not been loaded from Temporal yet (just started, or
	// Temporal unreachable since), so an empty answer would be a lie.
	codeIndexLoading = "index_loading"
	// codeReplicasUnavailable: the replica that must answer (the lease's or the proxy's
	// owner, or any peer to copy a lease to) cannot now; retry after Retry-After.
	codeReplicasUnavailable = "replicas_unavailable"
	// codeProxyUnavailable: between replicas only, the owner refuses a grant on a proxy
	// that filled up or started resting; the asking replica picks another.
	codeProxyUnavailable = "proxy_unavailable"
	// codeTooManyRequests: the client is over its requests per second.
	codeTooManyRequests = "too_many_requests"
	// codeLeaseLimit: the client holds as many leases as it may.
	codeLeaseLimit = "lease_limit"
)

func status(code string) int {
	switch code {
	case codeInvalid, codeInvalidResult, codeInvalidSelector:
		return http.StatusBadRequest
	case codeUnauthorized:
		return http.StatusUnauthorized
	case codeNotFound, codeUnknownLease, codeUnknownSession:
		return http.StatusNotFound
	case codeMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case codeNoMatch, codeProxyUnavailable:
		return http.StatusConflict
	case codeLeaseExpired, codeProxyGone:
		return http.StatusGone
	case codeReportLimit, codeTooManyRequests, codeLeaseLimit:
		return http.StatusTooManyRequests
	case codeTooLarge:
		return http.StatusRequestEntityTooLarge
	case codeIndexLoading, codeReplicasUnavailable:
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
	// Reason details a proxy_gone: a ProxyGone reason.
	Reason string `json:"reason,omitempty"`
	// RetryAfterSeconds, when set, is also the Retry-After header: how long to wait before
	// the same request can succeed.
	RetryAfterSeconds int `json:"retryAfterSeconds,omitempty"`
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

func apiErr(code, format string, args ...any) *APIError {
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
// error alone; what it adds is for toAPIError.
type opError struct {
	op      string // opAcquire, opRenew or opReport
	leaseID string // renew and report
	target  string // acquire
	err     error
}

func (e *opError) Error() string { return e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// toAPIError maps err to the answer the API gives for it: an *APIError as it is (request
// validation and DecodeJSON make those), and the store's errors (*NoMatch, ErrUnknownLease,
// ErrLeaseExpired) worded with what their *opError names. Any other error is a bug of
// discovery: known is false, and the answer is a bare internal error, so that nothing of
// err reaches the client; the caller logs err.
func toAPIError(err error) (ae *APIError, known bool) {
	if e, ok := errors.AsType[*APIError](err); ok {
		return e, true
	}
	var op opError
	if oe, ok := errors.AsType[*opError](err); ok {
		op = *oe
	}
	if nm, ok := errors.AsType[*NoMatch](err); ok {
		ae := &APIError{Code: codeNoMatch, NoMatch: nm,
			Message: fmt.Sprintf("no proxy available: %d match the selector, %d unhealthy, %d at capacity, %d in cooldown%s",
				nm.Considered, nm.Unhealthy, nm.AtCapacity, nm.InCooldown, forTarget(op.target))}
		if nm.RetryAfter > 0 {
			ae.RetryAfterSeconds = int((nm.RetryAfter + time.Second - 1) / time.Second)
			ae.Message += fmt.Sprintf("; the first frees up in %ds", ae.RetryAfterSeconds)
		}
		return ae, true
	}
	if ll, ok := errors.AsType[*LeaseLimit](err); ok {
		ae := apiErr(codeLeaseLimit, "client %q holds %d leases, as many as it may; release one or wait", ll.Client, ll.Max)
		ae.RetryAfterSeconds = int((ll.RetryAfter + time.Second - 1) / time.Second)
		return ae, true
	}
	if pg, ok := errors.AsType[*ProxyGone](err); ok {
		return &APIError{Code: codeProxyGone, Reason: pg.Reason,
			Message: fmt.Sprintf("lease %q has ended: its proxy %s; acquire a new lease", op.leaseID, goneText(pg.Reason))}, true
	}
	switch {
	case errors.Is(err, ErrUnknownLease) && op.op == opReport:
		// Reports are taken for the cooldown window after a lease ends, so an unknown
		// lease may also be one that ended before that window.
		return apiErr(codeUnknownLease, "no lease %q (or it expired more than the cooldown window ago)", op.leaseID), true
	case errors.Is(err, ErrUnknownLease):
		return apiErr(codeUnknownLease, "no lease %q", op.leaseID), true
	case errors.Is(err, ErrReportLimit):
		return apiErr(codeReportLimit, "lease %q has reported as many cooldowns as a lease may; report further ones on a new lease", op.leaseID), true
	case errors.Is(err, ErrLeaseExpired):
		return apiErr(codeLeaseExpired, "lease %q has expired; acquire a new one", op.leaseID), true
	}
	return apiErr(codeInternal, "internal error"), false
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

// fail answers with err, as toAPIError maps it. An internal error is logged, never shown.
func (s *Server) fail(c *gin.Context, err error) {
	ae, known := toAPIError(err)
	if !known {
		s.log.Error("internal error", "method", c.Request.Method, "path", c.FullPath(), "error", err)
	}
	if ae.RetryAfterSeconds > 0 {
		c.Header("Retry-After", strconv.Itoa(ae.RetryAfterSeconds))
	}
	c.AbortWithStatusJSON(status(ae.Code), ae)
}
