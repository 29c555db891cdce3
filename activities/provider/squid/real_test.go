package squid_test

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// Every test here runs the real Squid, and every address it is asked to reach is on
// loopback: the denied ranges are stood in for by 127.0.0.0/8 addresses through the same
// Render code, never tried out on real private or metadata addresses.

// creds have a mixed-case user name (Squid lowercases names unless told not to) and a
// password with ':' and a space (Squid must pass both through to its helper).
var creds = proxyauth.Credentials{Username: "Crawler.One", Password: "pa:ss word-0123456789"}

// target is an origin server on loopback that answers with the request headers it saw and
// counts the connections it accepted.
type target struct {
	srv   *httptest.Server
	conns atomic.Int32
}

func (tg *target) Addr() string { return tg.srv.Listener.Addr().String() }
func (tg *target) Port() int32 {
	_, p, _ := net.SplitHostPort(tg.Addr())
	n, _ := strconv.Atoi(p)
	return int32(n)
}

type countingListener struct {
	net.Listener
	n *atomic.Int32
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func newTarget(t *testing.T, ip string, useTLS bool) *target {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	tg := &target{}
	tg.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r.Header)
	}))
	tg.srv.Listener = countingListener{Listener: l, n: &tg.conns}
	if useTLS {
		tg.srv.StartTLS()
	} else {
		tg.srv.Start()
	}
	t.Cleanup(tg.srv.Close)
	return tg
}

// exchange sends one raw request through the proxy at addr and reads the answer. A raw
// request says exactly what the client sends (any scheme, any spelling of the host), which
// net/http would normalise or refuse.
func exchange(t *testing.T, addr, method, uri string, header http.Header) (*http.Response, []byte, net.Conn) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	require.NoError(t, conn.SetDeadline(time.Now().Add(10*time.Second)))

	host := uri
	if method != http.MethodConnect {
		if i := strings.Index(uri, "://"); i >= 0 {
			host, _, _ = strings.Cut(uri[i+3:], "/")
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, uri, host)
	if method != http.MethodConnect {
		b.WriteString("Connection: close\r\n")
	}
	require.NoError(t, header.Write(&b))
	b.WriteString("\r\n")
	_, err = io.WriteString(conn, b.String())
	require.NoError(t, err)

	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	require.NoError(t, err)
	if method == http.MethodConnect && resp.StatusCode == http.StatusOK {
		return resp, nil, &bufferedConn{Conn: conn, r: br}
	}
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, body, conn
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func auth(c proxyauth.Credentials, extra ...string) http.Header {
	h := http.Header{}
	if !c.Empty() {
		h.Set("Proxy-Authorization", c.Header())
	}
	for i := 0; i+1 < len(extra); i += 2 {
		h.Add(extra[i], extra[i+1])
	}
	return h
}

// seen decodes a target's answer: the request headers it received.
func seen(t *testing.T, body []byte) http.Header {
	t.Helper()
	var h http.Header
	require.NoError(t, json.Unmarshal(body, &h), "%s", body)
	return h
}

// revealing are the headers that would tell the origin about the client or the proxy.
var revealing = []string{"X-Forwarded-For", "Via", "Forwarded", "Proxy-Authorization"}

// tunnelGET does a GET through an established CONNECT tunnel to tg.
func tunnelGET(t *testing.T, conn net.Conn, tg *target, header http.Header) http.Header {
	t.Helper()
	tc := tls.Client(conn, &tls.Config{RootCAs: tg.srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, ServerName: "127.0.0.1"})
	req, err := http.NewRequest(http.MethodGet, "https://"+tg.Addr()+"/", nil)
	require.NoError(t, err)
	req.Header = header
	require.NoError(t, req.Write(tc))
	resp, err := http.ReadResponse(bufio.NewReader(tc), req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return seen(t, body)
}

func TestRealSquid(t *testing.T) {
	t.Run("hardened", testHardened)
	t.Run("allowed exceptions", testAllowed)
	t.Run("default denied ranges", testDefaultDenied)
}

func testHardened(t *testing.T) {
	t.Parallel()
	web := newTarget(t, "127.0.0.1", false)
	secure := newTarget(t, "127.0.0.1", true)
	denied := newTarget(t, "127.0.0.2", false)
	otherPort := newTarget(t, "127.0.0.1", false) // reachable, but its port is not allowed
	ftpish := newTarget(t, "127.0.0.1", false)    // its port is allowed; the scheme is not

	paths := squidtest.TempPaths(t)
	include := filepath.Join(filepath.Dir(paths.Conf), "user.conf")
	// The user's additions refuse one path, and try (in vain) to open the proxy to all.
	require.NoError(t, os.WriteFile(include, []byte(
		"acl user_blocked urlpath_regex ^/blocked\nhttp_access deny user_blocked\nhttp_access allow all\n"), 0o644))

	sq := squidtest.Start(t, squid.Config{
		Credentials: creds,
		Ports:       []int32{web.Port(), secure.Port(), denied.Port(), ftpish.Port()},
		Denied:      []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
		Include:     include,
		Paths:       paths,
	})
	webURL := "http://" + web.Addr() + "/"

	t.Run("no credentials", func(t *testing.T) {
		resp, _, _ := exchange(t, sq.Addr, http.MethodGet, webURL, nil)
		assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
		assert.Equal(t, `Basic realm="proxyfleet"`, resp.Header.Get("Proxy-Authenticate"))
		assert.NotContains(t, resp.Header.Get("Server"), "/", "no version")
	})
	t.Run("wrong password", func(t *testing.T) {
		resp, _, _ := exchange(t, sq.Addr, http.MethodGet, webURL, auth(proxyauth.Credentials{Username: creds.Username, Password: "wrong"}))
		assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
	})
	t.Run("user name in another case", func(t *testing.T) {
		resp, _, _ := exchange(t, sq.Addr, http.MethodGet, webURL, auth(proxyauth.Credentials{Username: strings.ToLower(creds.Username), Password: creds.Password}))
		assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
	})
	t.Run("plain HTTP reveals nothing", func(t *testing.T) {
		resp, body, _ := exchange(t, sq.Addr, http.MethodGet, webURL, auth(creds,
			"X-Forwarded-For", "203.0.113.7", "Via", "1.1 client-side", "Forwarded", "for=203.0.113.7"))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		got := seen(t, body)
		for _, h := range revealing {
			assert.Empty(t, got.Values(h), "the target saw %s", h)
		}
		assert.Empty(t, got.Values("Cache-Control"), "Squid's own max-age, a Squid fingerprint")

		resp, body, _ = exchange(t, sq.Addr, http.MethodGet, webURL, auth(creds, "Cache-Control", "no-cache"))
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		assert.Equal(t, []string{"no-cache"}, seen(t, body).Values("Cache-Control"), "the client's own is kept")
	})
	t.Run("CONNECT reveals nothing", func(t *testing.T) {
		resp, _, conn := exchange(t, sq.Addr, http.MethodConnect, secure.Addr(), auth(creds))
		require.Equal(t, http.StatusOK, resp.StatusCode)
		got := tunnelGET(t, conn, secure, http.Header{})
		for _, h := range revealing {
			assert.Empty(t, got.Values(h), "the target saw %s", h)
		}
	})
	t.Run("denied destination", func(t *testing.T) {
		deniedURL := "http://" + denied.Addr() + "/"
		for _, uri := range []string{
			deniedURL,
			// Other spellings of 127.0.0.2, which Squid parses as that address.
			"http://[::ffff:127.0.0.2]:" + strconv.Itoa(int(denied.Port())) + "/",
			"http://2130706434:" + strconv.Itoa(int(denied.Port())) + "/",
		} {
			resp, _, _ := exchange(t, sq.Addr, http.MethodGet, uri, auth(creds))
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, uri)
		}
		resp, _, _ := exchange(t, sq.Addr, http.MethodConnect, denied.Addr(), auth(creds))
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "CONNECT")

		resp, _, _ = exchange(t, sq.Addr, http.MethodGet, deniedURL, nil)
		assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode, "an unauthenticated client learns nothing about the rules")
		assert.Zero(t, denied.conns.Load(), "Squid connected to a denied destination")
	})
	t.Run("port not allowed", func(t *testing.T) {
		resp, _, _ := exchange(t, sq.Addr, http.MethodGet, "http://"+otherPort.Addr()+"/", auth(creds))
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "GET")
		resp, _, _ = exchange(t, sq.Addr, http.MethodConnect, otherPort.Addr(), auth(creds))
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "CONNECT")
		assert.Zero(t, otherPort.conns.Load())
	})
	t.Run("other schemes", func(t *testing.T) {
		for _, uri := range []string{"ftp://" + ftpish.Addr() + "/", "cache_object://127.0.0.1/info", "http://" + sq.Addr + "/squid-internal-mgr/info"} {
			resp, _, _ := exchange(t, sq.Addr, http.MethodGet, uri, auth(creds))
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, uri)
		}
		assert.Zero(t, ftpish.conns.Load())
	})
	t.Run("the user's additions", func(t *testing.T) {
		resp, _, _ := exchange(t, sq.Addr, http.MethodGet, "http://"+web.Addr()+"/blocked/page", auth(creds))
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "their deny applies")
		resp, _, _ = exchange(t, sq.Addr, http.MethodGet, "http://"+web.Addr()+"/open", auth(creds))
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		resp, _, _ = exchange(t, sq.Addr, http.MethodGet, webURL, nil)
		assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode, "their allow all does not undo authentication")
	})
	assert.Zero(t, denied.conns.Load())
}

func testAllowed(t *testing.T) {
	t.Parallel()
	web := newTarget(t, "127.0.0.1", false)
	two := newTarget(t, "127.0.0.2", false)
	three := newTarget(t, "127.0.0.3", false)
	sq := squidtest.Start(t, squid.Config{
		Credentials: creds,
		Ports:       []int32{web.Port(), two.Port(), three.Port()},
		// Given narrow range first: in that order Squid itself would drop the wide one
		// (it drops a range that overlaps an earlier one), so the order given must not be
		// the order rendered.
		Denied:  []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32"), netip.MustParsePrefix("127.0.0.0/8")},
		Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
	})

	resp, body, _ := exchange(t, sq.Addr, http.MethodGet, "http://"+web.Addr()+"/", auth(creds))
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	for _, tg := range []*target{two, three} {
		resp, _, _ := exchange(t, sq.Addr, http.MethodGet, "http://"+tg.Addr()+"/", auth(creds))
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, tg.Addr())
		resp, _, _ = exchange(t, sq.Addr, http.MethodConnect, tg.Addr(), auth(creds))
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "CONNECT %s", tg.Addr())
		assert.Zero(t, tg.conns.Load(), tg.Addr())
	}
}

// testDefaultDenied runs DefaultDenied itself, with the origin's port allowed, against the
// only denied ranges a test may try: loopback.
func testDefaultDenied(t *testing.T) {
	t.Parallel()
	web := newTarget(t, "127.0.0.1", false)
	sq := squidtest.Start(t, squid.Config{Credentials: creds, Ports: []int32{web.Port()}})
	port := strconv.Itoa(int(web.Port()))
	for _, uri := range []string{
		"http://" + web.Addr() + "/",
		"http://localhost:" + port + "/", // resolved from /etc/hosts, not by a resolver
		"http://[::1]:" + port + "/",
		"http://0.0.0.0:" + port + "/",
	} {
		resp, _, _ := exchange(t, sq.Addr, http.MethodGet, uri, auth(creds))
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, uri)
	}
	resp, _, _ := exchange(t, sq.Addr, http.MethodConnect, web.Addr(), auth(creds))
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, "CONNECT")
	assert.Zero(t, web.conns.Load())
}

// TestSquidParses: Squid accepts the renderings without a warning. A warning matters: Squid
// warns, and drops a range, when an ACL's ranges overlap.
func TestSquidParses(t *testing.T) {
	include := filepath.Join(t.TempDir(), "user.conf")
	require.NoError(t, os.WriteFile(include, []byte("acl user_ports port 8080\nhttp_access deny user_ports\n"), 0o644))
	for _, tc := range []struct {
		name string
		c    squid.Config
	}{
		{"defaults, Debian paths", squid.Config{Port: 3128, Credentials: creds}},
		{"everything set", squid.Config{
			Port: 8080, Listen: "127.0.0.1", Credentials: creds,
			Ports:   []int32{80, 443, 8080, 8443, 1, 65535, 3000, 5000, 9000},
			Denied:  append(append([]netip.Prefix{}, squid.DefaultDenied...), netip.MustParsePrefix("203.0.113.128/25"), netip.MustParsePrefix("::ffff:198.18.0.0/111")),
			Allowed: []netip.Prefix{netip.MustParsePrefix("10.1.2.3/32"), netip.MustParsePrefix("fd00::/64")},
			Include: include,
		}},
		{"nothing denied, IPv6 listener", squid.Config{Port: 3128, Listen: "::1", Credentials: creds, Denied: []netip.Prefix{}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := squid.Render(tc.c)
			require.NoError(t, err)
			out := squidtest.Parse(t, f.Conf)
			for l := range strings.Lines(out) {
				if strings.Contains(l, "HTTP requires the use of Via") {
					continue // via off is the point
				}
				for _, bad := range []string{"WARNING", "ERROR", "FATAL"} {
					assert.NotContains(t, l, bad)
				}
			}
		})
	}
}
