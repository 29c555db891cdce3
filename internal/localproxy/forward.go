package localproxy

import (
	"context"
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
type ForwardProxy struct {
	// AllowRemote lets the proxy reach non-loopback targets.
	AllowRemote bool
	// DialTimeout bounds connecting to a target.
	DialTimeout time.Duration

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
	return d.DialContext(ctx, network, addr)
}

// ServeHTTP implements the proxy.
func (p *ForwardProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.init()
	p.mu.RLock()
	fault, hung := p.fault, p.hung
	p.mu.RUnlock()
	switch fault {
	case local.FaultAuth:
		w.Header().Set("Proxy-Authenticate", `Basic realm="proxyfleet-local"`)
		http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
		return
	case local.FaultBadGateway:
		http.Error(w, "bad gateway (injected fault)", http.StatusBadGateway)
		return
	case local.FaultHang:
		select {
		case <-hung:
		case <-r.Context().Done():
		}
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
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		http.Error(w, "upstream: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	removeHopHeaders(resp.Header)
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
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
