package discovery

// The bodies of the lease API's requests and answers: what the lease operations take and
// give, whichever adapter (the HTTP API, the gateway, a peer replica) carries them.

import (
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/net/idna"

	"github.com/proxyfleet/proxyfleet/discovery/codes"
)

// ProxyInfo is a proxy as the API shows it. It has no place for credentials: listings are
// made of it, and only LeasedProxy, in lease answers, carries them.
type ProxyInfo struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// URL is http://ip:port; in a LeasedProxy it has the credentials as userinfo.
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

// LeasedProxy is the proxy of a lease answer (a grant or a renewal), the only answers that
// carry a proxy's credentials, to the crawler holding the lease. The credentials are also
// in URL, as userinfo, so that the URL alone works as an HTTP client's proxy. Username and
// Password are left out when the proxy takes none.
//
// A LeasedProxy prints and logs with the password redacted; only its JSON, the answer
// itself, has it.
type LeasedProxy struct {
	ProxyInfo
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// leased shows p to the crawler that leased it.
func leased(p Proxy) LeasedProxy {
	lp := LeasedProxy{ProxyInfo: info(p)}
	c := p.Credentials
	if c.Empty() {
		return lp
	}
	// Copied field by field on purpose: proxyauth.Credentials redacts the password when
	// marshalled, so that it leaves discovery only here.
	lp.Username, lp.Password = c.Username, c.Password
	u := &url.URL{Scheme: "http", Host: net.JoinHostPort(p.IP, strconv.Itoa(int(p.Port))), User: url.User(c.Username)}
	if c.Password != "" {
		u.User = url.UserPassword(c.Username, c.Password)
	}
	// url.URL escapes the userinfo, so any password survives the round trip.
	lp.URL = u.String()
	return lp
}

// ID is the proxy's namespace/name, as the index and the metrics name it.
func (p ProxyInfo) ID() string { return p.Namespace + "/" + p.Name }

// String shows the proxy with its password redacted.
func (p LeasedProxy) String() string {
	return p.ID() + " at " + redactURL(p.URL)
}

// GoString shows the proxy with its password redacted, for %#v.
func (p LeasedProxy) GoString() string { return "discovery.LeasedProxy{" + p.String() + "}" }

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

// ListedProxy is an entry of GET /v1/proxies.
type ListedProxy struct {
	ProxyInfo
	Healthy      bool   `json:"healthy"`
	Phase        string `json:"phase"`
	ActiveLeases int    `json:"activeLeases"`
	MaxLeases    int    `json:"maxLeases"`
	// Cooldowns are the targets the proxy rests for now (after a rate_limited or banned
	// report), with when each rest ends; "*" is every target.
	Cooldowns map[string]time.Time `json:"cooldowns,omitempty"`
}

// ProxyList is the body of GET /v1/proxies.
type ProxyList struct {
	Proxies []ListedProxy `json:"proxies"`
	Count   int           `json:"count"`
}

// LeaseRequest is the body of POST /v1/leases.
type LeaseRequest struct {
	Selector   Selector `json:"selector"`
	TTLSeconds int      `json:"ttlSeconds"`
	// Target is the site the crawler will visit: proxies in cooldown for it are skipped.
	Target string `json:"target"`
	// Session keeps the crawler on one proxy across leases (Store.Lease).
	Session string `json:"session"`
	// WaitSeconds, when no proxy can take the lease now, is how long to wait for one
	// (Server.GrantWaiting) before answering the 409; 0 answers at once.
	WaitSeconds int `json:"waitSeconds"`
}

// LeaseResponse is the body of a granted lease (201) and a renewal (200).
type LeaseResponse struct {
	LeaseID    string      `json:"leaseID"`
	Proxy      LeasedProxy `json:"proxy"`
	ExpiresAt  time.Time   `json:"expiresAt"`
	TTLSeconds int         `json:"ttlSeconds"`
	Target     string      `json:"target,omitempty"`
	Session    string      `json:"session,omitempty"`
}

// LogValue shows the lease with the proxy's password redacted, for slog.
func (r LeaseResponse) LogValue() slog.Value {
	return slog.GroupValue(slog.String("leaseID", r.LeaseID), slog.Any("proxy", r.Proxy),
		slog.Time("expiresAt", r.ExpiresAt), slog.Int("ttlSeconds", r.TTLSeconds), slog.String("target", r.Target),
		slog.String("session", r.Session))
}

// Validate checks a lease request and returns the TTL to grant: its ttlSeconds, or
// cfg.DefaultTTL when it gives none. It normalises r.Target (NormalizeTarget).
func (r *LeaseRequest) Validate(cfg Config) (time.Duration, error) {
	if err := r.Selector.Validate(); err != nil {
		return 0, Errorf(codes.InvalidSelector, "%v", err)
	}
	target, err := NormalizeTarget(r.Target)
	if err != nil {
		return 0, err
	}
	r.Target = target
	if r.Session != "" && !ValidSession(r.Session) {
		return 0, Errorf(codes.Invalid, "session must be 1-128 letters, digits, '.', '_', '~', ':' or '-'")
	}
	return cfg.TTL(r.TTLSeconds)
}

// TTL is the lease duration a request's ttlSeconds asks for: cfg.DefaultTTL for none (0),
// a 400 invalid past cfg.MaxTTL or below 0.
func (cfg Config) TTL(seconds int) (time.Duration, error) {
	switch {
	case seconds < 0:
		return 0, Errorf(codes.Invalid, "ttlSeconds must be positive")
	case seconds == 0:
		return cfg.DefaultTTL, nil
	// Compared in seconds: seconds*time.Second can overflow into a negative duration.
	case int64(seconds) > int64(cfg.MaxTTL/time.Second):
		return 0, Errorf(codes.Invalid, "ttlSeconds %d exceeds the maximum of %d", seconds, int(cfg.MaxTTL/time.Second))
	}
	return time.Duration(seconds) * time.Second, nil
}

// NormalizeTarget is the cooldown key of a target site: its host name in lower case,
// without a port or a trailing dot, so "Shop.Example", "shop.example:443" and
// "shop.example." rest a proxy for the same site. Anything that is not a host name (a URL,
// spaces, control characters) is refused rather than becoming a key of its own.
func NormalizeTarget(t string) (string, error) {
	if t == "" {
		return "", nil
	}
	bad := func() (string, error) {
		return "", Errorf(codes.Invalid, "target must be a host name such as shop.example (at most 253 characters, optionally with a port; no scheme, path, spaces or control characters)")
	}
	if len(t) > 253+6 || strings.ContainsFunc(t, func(r rune) bool {
		return r <= ' ' || r == 0x7f || r == '/' || r == '?' || r == '#' || r == '@' || r == '\\'
	}) {
		return bad()
	}
	host := t
	if h, port, err := net.SplitHostPort(t); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return bad()
		}
		host = h
	} else if strings.Count(t, ":") == 1 {
		return bad() // "host:" or "host:port" with a port that is not one
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); ip != nil {
		return ip.String(), nil
	}
	if strings.ContainsFunc(host, func(r rune) bool { return r >= utf8.RuneSelf }) {
		// An internationalised name rests a proxy under its ASCII form, which is what
		// the crawler's requests carry: "bücher.example" and "xn--bcher-kva.example"
		// are one site.
		ascii, err := idna.Lookup.ToASCII(host)
		if err != nil {
			return bad()
		}
		host = ascii
	}
	if host == "" || len(host) > 253 || strings.Contains(host, "..") || strings.ContainsRune(host, ':') {
		return bad()
	}
	return host, nil
}

// leaseResponse shows a lease just granted or renewed for d. The TTL is d itself, not
// ExpiresAt minus the wall clock: ExpiresAt is on the store's clock.
func leaseResponse(l *Lease, d time.Duration) LeaseResponse {
	return LeaseResponse{LeaseID: l.ID, Proxy: leased(l.Proxy), ExpiresAt: l.ExpiresAt.UTC(),
		TTLSeconds: int(d / time.Second), Target: l.Target, Session: l.Session}
}

// RenewRequest is the body of POST /v1/leases/{id}/renew.
type RenewRequest struct {
	TTLSeconds int `json:"ttlSeconds"`
}

// ReportRequest is the body of POST /v1/leases/{id}/report.
type ReportRequest struct {
	Result string `json:"result"`
	// Target defaults to the lease's target; with neither, the report covers every target.
	Target string `json:"target"`
}
