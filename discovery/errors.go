package discovery

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

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

// AcquireError is err, an acquire's for target, worded by ErrorOf with that target.
func AcquireError(target string, err error) error {
	return &opError{op: opAcquire, target: target, err: err}
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

// ErrIndexLoading is the answer while the index has not been loaded in full, with its
// Retry-After.
func ErrIndexLoading() *APIError {
	e := Errorf(codes.IndexLoading, "the proxy index is still loading from Temporal; retry shortly")
	e.RetryAfterSeconds = 1
	return e
}

// DecodeJSON is the strict decoder of request bodies: unknown fields, trailing data and
// wrong types are 400, a body over the limit is 413. An empty body decodes as {} when
// allowEmpty.
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
