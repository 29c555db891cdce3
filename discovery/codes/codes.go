// Package codes is the discovery API's error codes and what each one answers with: the
// HTTP status of the lease API, and the status and outcome of the gateway. The server, the
// gateway and the Go client read this one table, so that a code cannot come to mean one
// thing to one of them and another to the next. It imports nothing but the standard
// library: the client, which crawlers link, stays small.
package codes

import (
	"maps"
	"net/http"
	"slices"
)

// The codes, as the "error" field of every error answer (and the gateway's
// Proxyfleet-Error header) carries them.
const (
	Invalid         = "invalid"
	InvalidResult   = "invalid_result"
	InvalidSelector = "invalid_selector"
	Unauthorized    = "unauthorized"
	NotFound        = "not_found"
	UnknownLease    = "unknown_lease"
	// UnknownSession: the client has no session of that name (or it has been idle for
	// longer than sessions are remembered).
	UnknownSession = "unknown_session"
	LeaseExpired   = "lease_expired"
	// ProxyGone: the lease ended because its proxy cannot serve it any more (replaced,
	// unhealthy or removed; the answer's reason says which). Acquire a new lease.
	ProxyGone = "proxy_gone"
	// ReportLimit: the lease has reported as many cooldowns as a lease may.
	ReportLimit      = "report_limit"
	NoMatch          = "no_match"
	TooLarge         = "too_large"
	MethodNotAllowed = "method_not_allowed"
	Internal         = "internal"
	// IndexLoading: the index has not been loaded from Temporal yet (just started, or
	// Temporal unreachable since), so an empty answer would be a lie.
	IndexLoading = "index_loading"
	// ReplicasUnavailable: the replica that must answer (the lease's or the proxy's owner,
	// or any peer to copy a lease to) cannot now; retry after Retry-After.
	ReplicasUnavailable = "replicas_unavailable"
	// ProxyUnavailable: between replicas only, the owner refuses a grant on a proxy that
	// filled up or started resting; the asking replica picks another.
	ProxyUnavailable = "proxy_unavailable"
	// TooManyRequests: the client is over its requests per second.
	TooManyRequests = "too_many_requests"
	// LeaseLimit: the client holds as many leases as it may.
	LeaseLimit = "lease_limit"
	// ProxyAuthRequired: the gateway's proxy credentials are missing or wrong.
	ProxyAuthRequired = "proxy_auth_required"
	// UpstreamFailed: the gateway tried fleet proxies and none carried the request.
	UpstreamFailed = "upstream_failed"
)

// Meaning is what an answer with a code is.
type Meaning struct {
	// Status is the lease API's HTTP status.
	Status int
	// GatewayStatus is the gateway's, where a proxy client must read the code otherwise
	// (a 409 means nothing to an HTTP client; a proxy with no upstream answers 503); 0 is
	// Status.
	GatewayStatus int
	// Outcome is the gateway's outcome label (proxyfleet_gateway_requests_total): ""
	// counts as "internal", for codes the gateway never answers with.
	Outcome string
	// Only names the one door that answers with the code: "gateway", or "peers" (between
	// replicas); "" for the lease API (and the gateway when it has a reason to).
	Only string
}

// table is every code's meaning.
var table = map[string]Meaning{
	Invalid:             {Status: http.StatusBadRequest, Outcome: "invalid"},
	InvalidResult:       {Status: http.StatusBadRequest},
	InvalidSelector:     {Status: http.StatusBadRequest, Outcome: "invalid"},
	Unauthorized:        {Status: http.StatusUnauthorized},
	NotFound:            {Status: http.StatusNotFound},
	UnknownLease:        {Status: http.StatusNotFound},
	UnknownSession:      {Status: http.StatusNotFound},
	MethodNotAllowed:    {Status: http.StatusMethodNotAllowed},
	NoMatch:             {Status: http.StatusConflict, GatewayStatus: http.StatusServiceUnavailable, Outcome: "no_proxy"},
	ProxyUnavailable:    {Status: http.StatusConflict, Only: "peers"},
	LeaseExpired:        {Status: http.StatusGone},
	ProxyGone:           {Status: http.StatusGone},
	ReportLimit:         {Status: http.StatusTooManyRequests},
	TooManyRequests:     {Status: http.StatusTooManyRequests, Outcome: "throttled"},
	LeaseLimit:          {Status: http.StatusTooManyRequests, Outcome: "throttled"},
	TooLarge:            {Status: http.StatusRequestEntityTooLarge},
	IndexLoading:        {Status: http.StatusServiceUnavailable, Outcome: "unavailable"},
	ReplicasUnavailable: {Status: http.StatusServiceUnavailable, Outcome: "unavailable"},
	Internal:            {Status: http.StatusInternalServerError},
	ProxyAuthRequired:   {Status: http.StatusProxyAuthRequired, Outcome: "auth_failed", Only: "gateway"},
	UpstreamFailed:      {Status: http.StatusBadGateway, Outcome: "upstream_failed", Only: "gateway"},
}

// Of is code's meaning; an unknown code means an internal error.
func Of(code string) Meaning {
	m, ok := table[code]
	if !ok {
		m = table[Internal]
	}
	if m.GatewayStatus == 0 {
		m.GatewayStatus = m.Status
	}
	if m.Outcome == "" {
		m.Outcome = "internal"
	}
	return m
}

// Status is the lease API's status for code.
func Status(code string) int { return Of(code).Status }

// All is every code, sorted.
func All() []string {
	return slices.Sorted(maps.Keys(table))
}

// API is every code the lease API answers with, sorted: the enum of openapi.yaml's Error.
func API() []string {
	var out []string
	for _, c := range All() {
		if table[c].Only == "" {
			out = append(out, c)
		}
	}
	return out
}
