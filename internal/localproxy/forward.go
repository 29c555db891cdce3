package localproxy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
)

// ForwardProxy is an HTTP forward proxy: absolute-URI requests are forwarded, CONNECT opens
// a TCP tunnel. By default it reaches only loopback targets, so a local fleet cannot be
// used to send traffic anywhere else by accident.
//
// It behaves as the Squid instances of the other providers are configured to: every
// request, plain or CONNECT, must carry basic proxy credentials, and a forwarded request
// carries none of the headers that would tell the target about the client, the proxy or
// its credentials (see strippedHeaders). Dev and tests then walk the auth path end to end.
type ForwardProxy struct {
	// AllowRemote lets the proxy reach non-loopback targets.
	AllowRemote bool
	// DialTimeout bounds connecting to a target.
	DialTimeout time.Duration
	// SourceIP, when set, is the address connections to targets leave from: on Linux any
	// 127.0.0.0/8 address is local, so each local proxy can show sites an address of its
	// own, as proxies on separate machines do. Set it before the first request.
	SourceIP net.IP
	// Auth is the credentials every request must carry; set it before the first request.
	// Nil (or one that fails local.Auth.Validate) refuses every request with 407: a proxy
	// that was given no credentials is misconfigured, and must not be an open one.
	Auth *local.Auth

	// wantUser and wantHash are Auth, parsed once; wantHash is nil when nothing can match.
	wantUser []byte
	wantHash []byte

	mu    sync.RWMutex
	fault local.Fault
	// hung holds connections parked by local.FaultHang until the fault is cleared or the proxy
	// is closed.
	hung chan struct{}

	transport *http.Transport
	once      sync.Once
}

// SetFault changes how the proxy behaves from the next request on.
func (p *ForwardProxy) SetFault(f local.Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hung == nil {
		p.hung = make(chan struct{})
	}
	if p.fault == local.FaultHang && f != local.FaultHang {
		close(p.hung)
		p.hung = make(chan struct{})
	}
	p.fault = f
}

// Fault returns the current fault.
func (p *ForwardProxy) Fault() local.Fault {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.fault
}

func (p *ForwardProxy) init() {
	p.once.Do(func() {
		if p.DialTimeout <= 0 {
			p.DialTimeout = 10 * time.Second
		}
		p.transport = &http.Transport{
			Proxy:                 nil,
			DialContext:           p.dial,
			MaxIdleConnsPerHost:   16,
			IdleConnTimeout:       30 * time.Second,
			ResponseHeaderTimeout: time.Minute,
		}
		if p.Auth.Validate() == nil {
			p.wantUser = []byte(p.Auth.Username)
			p.wantHash, _ = hex.DecodeString(p.Auth.PasswordSHA256)
		}
		p.mu.Lock()
		if p.hung == nil {
			p.hung = make(chan struct{})
		}
		p.mu.Unlock()
	})
}

var errRemoteTarget = errors.New("this local proxy reaches loopback targets only (start localproxyd with --allow-remote to change that)")

func (p *ForwardProxy) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if !p.AllowRemote {
		ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			if !ip.IP.IsLoopback() {
				return nil, errRemoteTarget
			}
		}
	}
	d := net.Dialer{Timeout: p.DialTimeout}
	if p.SourceIP != nil {
		d.LocalAddr = &net.TCPAddr{IP: p.SourceIP}
	}
	return d.DialContext(ctx, network, addr)
}

// authorized reports whether h carries the proxy's credentials. The user name and the
// SHA-256 of the password are compared in constant time, and both always, so the answer's
// timing tells nothing about which of them was wrong or how much of the hash matched.
func (p *ForwardProxy) authorized(h http.Header) bool {
	values := h.Values("Proxy-Authorization")
	if p.wantHash == nil || len(values) != 1 {
		return false
	}
	user, password, ok := parseBasic(values[0])
	if !ok {
		return false
	}
	sum := sha256.Sum256([]byte(password))
	userOK := subtle.ConstantTimeCompare([]byte(user), p.wantUser)
	passwordOK := subtle.ConstantTimeCompare(sum[:], p.wantHash)
	return userOK&passwordOK == 1
}

// parseBasic reads a "Basic base64(user:password)" header value (the scheme in any case).
func parseBasic(v string) (user, password string, ok bool) {
	const prefix = "Basic "
	if len(v) < len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", "", false
	}
	raw, err := base64.StdEncoding.DecodeString(v[len(prefix):])
	if err != nil {
		return "", "", false
	}
	return strings.Cut(string(raw), ":")
}

// ServeHTTP implements the proxy.
func (p *ForwardProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.init()
	p.mu.RLock()
	fault, hung := p.fault, p.hung
	p.mu.RUnlock()
	if fault == local.FaultHang {
		// A hung proxy answers nothing, not even a demand for credentials.
		select {
		case <-hung:
		case <-r.Context().Done():
		}
		return
	}
	// Credentials come before everything else the proxy does, as in Squid: a client
	// without them learns nothing about targets or upstream failures.
	if fault == local.FaultAuth || !p.authorized(r.Header) {
		w.Header().Set("Proxy-Authenticate", `Basic realm="proxyfleet"`)
		http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
		return
	}
	if fault == local.FaultBadGateway {
		http.Error(w, "bad gateway (injected fault)", http.StatusBadGateway)
		return
	}
	if r.Method == http.MethodConnect {
		p.tunnel(w, r)
		return
	}
	if !r.URL.IsAbs() {
		http.Error(w, "this is a forward proxy: send absolute-URI requests or CONNECT", http.StatusBadRequest)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	removeHopHeaders(out.Header)
	for _, k := range strippedHeaders {
		out.Header.Del(k)
	}
	// http.Transport sends the headers it is given and adds none of these;
	// httputil.ReverseProxy would add X-Forwarded-For, which is why it is not used here.
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The request went without its Upgrade (a hop-by-hop header this proxy does not
		// pass on), so the site switched unasked: relaying that would hold the client's
		// connection (and the site's) open for nothing.
		http.Error(w, "the target switched protocols unasked; this proxy does not pass upgrades", http.StatusBadGateway)
		return
	}
	removeHopHeaders(resp.Header)
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	relayAnswer(w, resp.Body)
}

var relayBuffers = sync.Pool{New: func() any { return new([32 << 10]byte) }}

// relayAnswer copies an answer's body to the client, flushing each piece as it comes: a
// site that pauses mid-answer must not leave the last bytes it sent in this proxy's
// buffer, as a plain copy does (the server's writer holds what is smaller than its buffer
// until more comes or the answer ends). Squid passes on what it got, too. The last piece
// is left to the server's own flush at the end of the answer, so a short answer still
// costs one write.
func relayAnswer(w http.ResponseWriter, body io.Reader) {
	rc := http.NewResponseController(w)
	buf := relayBuffers.Get().(*[32 << 10]byte)
	defer relayBuffers.Put(buf)
	for {
		n, err := body.Read(buf[:])
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if err == nil {
				_ = rc.Flush()
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *ForwardProxy) tunnel(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), p.DialTimeout)
	defer cancel()
	target, err := p.dial(ctx, "tcp", r.Host)
	if err != nil {
		http.Error(w, "connect "+r.Host+": "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		target.Close()
		http.Error(w, "tunnelling unsupported", http.StatusInternalServerError)
		return
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		target.Close()
		return
	}
	_, _ = client.Write([]byte("HTTP/1.1 200 Connection Established\r\n\r\n"))
	go func() {
		// Bytes the client sent after the CONNECT head are already buffered.
		if n := buf.Reader.Buffered(); n > 0 {
			b, _ := buf.Reader.Peek(n)
			_, _ = target.Write(b)
		}
		_, _ = io.Copy(target, client)
		closeWrite(target)
	}()
	_, _ = io.Copy(client, target)
	client.Close()
	target.Close()
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	c.Close()
}

// strippedHeaders are removed from every forwarded request, also when the client sent them
// itself, as the real Squid instances are configured to: a target must not learn the
// crawler's address, that a proxy is in the way, or the proxy's credentials. The last two
// are hop-by-hop headers too; they are listed so this list reads the same as Squid's.
var strippedHeaders = []string{"X-Forwarded-For", "Via", "Forwarded", "Proxy-Authorization", "Proxy-Connection"}

var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}
