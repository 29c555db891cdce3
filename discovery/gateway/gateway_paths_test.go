package gateway_test

import (
	"bufio"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
)

// answersSite is a site on loopback that answers in every way an answer can go: 1xx
// first, switches of protocol, no body, a body cut short or badly chunked, a connection
// reset, an answer that starts and then stalls for as long as the test runs (whatever
// its peer does). It says on started when a stalling answer has reached its stall.
type answersSite struct {
	*httptest.Server
	started chan string
	hold    chan struct{}
}

func newAnswersSite(t *testing.T) *answersSite {
	s := &answersSite{started: make(chan string, 16), hold: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/continue", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		_, _ = fmt.Fprintf(w, "got %q", b)
	})
	mux.HandleFunc("/hints", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		_, _ = io.WriteString(w, "hinted")
	})
	mux.HandleFunc("/hints-endless", func(w http.ResponseWriter, r *http.Request) {
		for range 20 {
			w.WriteHeader(http.StatusEarlyHints)
		}
		_, _ = io.WriteString(w, "hinted at last")
	})
	mux.HandleFunc("/upgrade", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("force") == "" && !strings.EqualFold(r.Header.Get("Upgrade"), "echo") {
			http.Error(w, "ask to upgrade to echo", http.StatusUpgradeRequired)
			return
		}
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		_ = buf.Flush()
		if r.URL.Query().Get("force") != "" {
			<-s.hold // switched unasked, and keeps the connection
			return
		}
		line, err := buf.ReadString('\n')
		if err != nil {
			return
		}
		_, _ = io.WriteString(conn, line)
		if r.URL.Query().Get("end") != "" {
			return // the site is done after one line
		}
		_, _ = io.Copy(conn, buf)
	})
	mux.HandleFunc("/sized", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		_, _ = io.WriteString(w, "sized")
	})
	mux.HandleFunc("/no-content", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("/not-modified", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		w.WriteHeader(http.StatusNotModified)
	})
	raw := func(answer string, reset bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			_, _ = buf.WriteString(answer)
			_ = buf.Flush()
			if tc, ok := conn.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			conn.Close()
		}
	}
	mux.Handle("/cut", raw("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", false))
	mux.Handle("/bad-chunk", raw("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n", false))
	mux.Handle("/reset", raw("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this", true))
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		// A length, so that the crawler can read all that was sent, and more than the
		// local proxy buffers before it sends anything on.
		w.Header().Set("Content-Length", "1000000")
		_, _ = io.WriteString(w, streamStart)
		_ = http.NewResponseController(w).Flush()
		s.started <- r.URL.Path
		<-s.hold // deaf to its crawler's going away, as a site can be
	})
	mux.HandleFunc("/pause", func(w http.ResponseWriter, r *http.Request) {
		// A few bytes of a long answer, then a pause that lasts as long as the test.
		w.Header().Set("Content-Length", "100000")
		_, _ = io.WriteString(w, pauseStart)
		_ = http.NewResponseController(w).Flush()
		s.started <- r.URL.Path
		<-s.hold
	})
	mux.HandleFunc("/stall", func(w http.ResponseWriter, r *http.Request) {
		s.started <- r.URL.Path
		<-s.hold
	})
	mux.HandleFunc("/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		_, _ = io.WriteString(w, "bye")
	})
	s.Server = httptest.NewServer(mux)
	// Cleanups run last first: the stalled answers end before the server waits for them.
	t.Cleanup(s.Close)
	t.Cleanup(func() { close(s.hold) })
	return s
}

// pauseStart is what /pause sends before it pauses: less than any buffer on the way.
const pauseStart = "paused here\n"

// streamStart is what /stream sends before it stalls.
var streamStart = "first\n" + strings.Repeat(".", 16<<10) + "\n"

func (s *answersSite) host() string { return strings.TrimPrefix(s.URL, "http://") }

// waitStarted waits for the site to reach the stall of an answer to path.
func (s *answersSite) waitStarted(t *testing.T, path string) {
	t.Helper()
	select {
	case got := <-s.started:
		require.Equal(t, path, got)
	case <-time.After(10 * time.Second):
		t.Fatalf("the site never started answering %s", path)
	}
}

// rawCrawler is a crawler's connection to the gateway, written and read by hand, so
// that a test can hang up at any point of an answer.
type rawCrawler struct {
	t    *testing.T
	conn net.Conn
	br   *bufio.Reader
	auth string
}

func (e *gatewayEnv) rawCrawler(user string) *rawCrawler {
	e.t.Helper()
	c, err := net.Dial("tcp", e.addr)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { c.Close() })
	require.NoError(e.t, c.SetDeadline(time.Now().Add(20*time.Second)))
	return &rawCrawler{t: e.t, conn: c, br: bufio.NewReader(c),
		auth: "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+gwToken))}
}

// send writes a request head for target (an absolute URI to the gateway, a path inside a
// tunnel) with extra header lines.
func (c *rawCrawler) send(method, target, host string, proxyAuth bool, extra ...string) {
	c.t.Helper()
	head := method + " " + target + " HTTP/1.1\r\nHost: " + host + "\r\n"
	if proxyAuth {
		head += "Proxy-Authorization: " + c.auth + "\r\n"
	}
	for _, h := range extra {
		head += h + "\r\n"
	}
	_, err := io.WriteString(c.conn, head+"\r\n")
	require.NoError(c.t, err)
}

// read reads the next answer head (1xx included) to a request with this method.
func (c *rawCrawler) read(method string) *http.Response {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
	require.NoError(c.t, err)
	return resp
}

// connect opens a tunnel to hostport.
func (c *rawCrawler) connect(hostport string) {
	c.t.Helper()
	c.send(http.MethodConnect, hostport, hostport, true)
	resp := c.read(http.MethodConnect)
	require.Equal(c.t, http.StatusOK, resp.StatusCode)
}

// readLine reads one line of the answer's bytes, as they come.
func (c *rawCrawler) readLine() string {
	c.t.Helper()
	line, err := c.br.ReadString('\n')
	require.NoError(c.t, err)
	return line
}

// ended waits for the gateway to end the connection.
func (c *rawCrawler) ended() {
	c.t.Helper()
	_, err := io.Copy(io.Discard, c.br)
	if err != nil {
		var ne net.Error
		require.False(c.t, errors.As(err, &ne) && ne.Timeout(), "the gateway never ended the connection")
	}
}

// waitOutcome waits for a request of this kind to be counted with this outcome.
func (e *gatewayEnv) waitOutcome(kind, outcome string) {
	e.t.Helper()
	require.Eventually(e.t, func() bool {
		return e.metric("proxyfleet_gateway_requests_total", "kind", kind, "outcome", outcome) == 1
	}, 10*time.Second, 5*time.Millisecond, "no %s request counted %s", kind, outcome)
}

// TestGatewayEveryPathEndsItsLease runs a request or tunnel out of the gateway by every
// way an answer can go, through a real local fleet proxy and, where that proxy hides what
// the site did (it drops 1xx and upgrades, and ends a badly chunked answer cleanly),
// through one that relays the site's bytes as they come. After each, the lease is
// released: the store counts none and the gateway's gauge is back to zero.
func TestGatewayEveryPathEndsItsLease(t *testing.T) {
	type env struct {
		*gatewayEnv
		site *answersSite
	}
	const local, blind = gwClient + ";relay=local", gwClient + ";relay=blind"
	// get fetches path through the gateway; the error is the fetch's or the body's.
	get := func(e env, user, path string) (*http.Response, []byte, error) {
		resp, err := e.client(user, gwToken).Get(e.site.URL + path)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp, b, err
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, e env)
	}{
		{"100-continue", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.send(http.MethodPost, e.site.URL+"/continue", e.site.host(), true, "Content-Length: 5", "Expect: 100-continue")
			resp := c.read(http.MethodPost)
			require.Equal(t, http.StatusContinue, resp.StatusCode, "the crawler is told to send its body")
			_, err := io.WriteString(c.conn, "hello")
			require.NoError(t, err)
			for resp.StatusCode == http.StatusContinue {
				resp = c.read(http.MethodPost)
			}
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, `got "hello"`, string(b))
		}},
		{"103 early hints", func(t *testing.T, e env) {
			c := e.rawCrawler(blind)
			c.send(http.MethodGet, e.site.URL+"/hints", e.site.host(), true)
			resp := c.read(http.MethodGet)
			require.Equal(t, http.StatusEarlyHints, resp.StatusCode)
			assert.Contains(t, resp.Header.Get("Link"), "preload")
			resp = c.read(http.MethodGet)
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, "hinted", string(b))
		}},
		{"103 through a proxy that drops it", func(t *testing.T, e env) {
			resp, b, err := get(e, local, "/hints")
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "hinted", string(b))
		}},
		{"many 1xx", func(t *testing.T, e env) {
			c := e.rawCrawler(blind)
			c.send(http.MethodGet, e.site.URL+"/hints-endless", e.site.host(), true)
			resp := c.read(http.MethodGet)
			for resp.StatusCode == http.StatusEarlyHints {
				resp = c.read(http.MethodGet)
			}
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		}},
		{"101 asked", func(t *testing.T, e env) {
			c := e.rawCrawler(blind)
			c.send(http.MethodGet, e.site.URL+"/upgrade", e.site.host(), true, "Connection: Upgrade", "Upgrade: echo")
			require.Equal(t, http.StatusSwitchingProtocols, c.read(http.MethodGet).StatusCode)
			_, err := io.WriteString(c.conn, "ping\n")
			require.NoError(t, err)
			assert.Equal(t, "ping\n", c.readLine())
			assert.Equal(t, 1, e.leases(), "a switched connection holds its lease while it is open")
			c.conn.Close()
		}},
		{"101 asked, the site ends and the crawler stays", func(t *testing.T, e env) {
			c := e.rawCrawler(blind)
			c.send(http.MethodGet, e.site.URL+"/upgrade?end=1", e.site.host(), true, "Connection: Upgrade", "Upgrade: echo")
			require.Equal(t, http.StatusSwitchingProtocols, c.read(http.MethodGet).StatusCode)
			_, err := io.WriteString(c.conn, "ping\n")
			require.NoError(t, err)
			assert.Equal(t, "ping\n", c.readLine())
			// The crawler keeps its side open and says nothing more.
		}},
		{"101 asked through a proxy that drops the upgrade", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.send(http.MethodGet, e.site.URL+"/upgrade", e.site.host(), true, "Connection: Upgrade", "Upgrade: echo")
			assert.Equal(t, http.StatusUpgradeRequired, c.read(http.MethodGet).StatusCode)
		}},
		{"101 unasked", func(t *testing.T, e env) {
			resp, b, err := get(e, blind, "/upgrade?force=1")
			require.NoError(t, err)
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", b)
			assert.Contains(t, string(b), "switched protocols")
		}},
		{"101 to another protocol than asked", func(t *testing.T, e env) {
			c := e.rawCrawler(blind)
			c.send(http.MethodGet, e.site.URL+"/upgrade?force=1", e.site.host(), true, "Connection: Upgrade", "Upgrade: websocket")
			resp := c.read(http.MethodGet)
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", b)
			assert.Contains(t, string(b), "switched protocols")
		}},
		{"HEAD", func(t *testing.T, e env) {
			for _, user := range []string{local, blind} {
				resp, err := e.client(user, gwToken).Head(e.site.URL + "/sized")
				require.NoError(t, err)
				resp.Body.Close()
				assert.Equal(t, http.StatusOK, resp.StatusCode, user)
				assert.Equal(t, int64(5), resp.ContentLength, user)
			}
		}},
		{"204 and 304", func(t *testing.T, e env) {
			for _, user := range []string{local, blind} {
				resp, _, err := get(e, user, "/no-content")
				require.NoError(t, err)
				assert.Equal(t, http.StatusNoContent, resp.StatusCode, user)
				resp, _, err = get(e, user, "/not-modified")
				require.NoError(t, err)
				assert.Equal(t, http.StatusNotModified, resp.StatusCode, user)
			}
		}},
		{"body cut short", func(t *testing.T, e env) {
			for _, user := range []string{local, blind} {
				_, _, err := get(e, user, "/cut")
				assert.Error(t, err, "%s: the crawler learns its answer is incomplete", user)
			}
		}},
		{"chunked encoding error", func(t *testing.T, e env) {
			_, _, err := get(e, blind, "/bad-chunk")
			assert.Error(t, err)
			// The local proxy ends a badly chunked answer as if it were whole.
			_, _, _ = get(e, local, "/bad-chunk")
		}},
		{"the site resets mid-answer", func(t *testing.T, e env) {
			for _, user := range []string{local, blind} {
				_, _, err := get(e, user, "/reset")
				assert.Error(t, err, user)
			}
		}},
		{"the crawler hangs up before the answer", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.send(http.MethodGet, e.site.URL+"/stall", e.site.host(), true)
			e.site.waitStarted(t, "/stall")
			c.conn.Close()
		}},
		{"the crawler hangs up mid-answer", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.send(http.MethodGet, e.site.URL+"/stream", e.site.host(), true)
			resp := c.read(http.MethodGet)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			e.site.waitStarted(t, "/stream")
			line, err := bufio.NewReader(resp.Body).ReadString('\n')
			require.NoError(t, err)
			assert.Equal(t, "first\n", line)
			c.conn.Close()
			e.waitOutcome("http", "canceled")
		}},
		{"the crawler hangs up mid-answer in a tunnel", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.connect(e.site.host())
			c.send(http.MethodGet, "/stream", e.site.host(), false)
			resp := c.read(http.MethodGet)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			e.site.waitStarted(t, "/stream")
			// All that was sent is read, so nothing the gateway writes after fails, and
			// the hang-up reaches it as an end of stream: just what a crawler that waits
			// for the rest of the answer with its side closed sends.
			_, err := io.ReadFull(resp.Body, make([]byte, len(streamStart)))
			require.NoError(t, err)
			c.conn.Close()
		}},
		{"the site ends a tunnel the crawler keeps open", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.connect(e.site.host())
			c.send(http.MethodGet, "/close", e.site.host(), false)
			resp := c.read(http.MethodGet)
			b, _ := io.ReadAll(resp.Body)
			assert.Equal(t, "bye", string(b))
			// The crawler neither closes nor sends anything more.
		}},
		{"a site that pauses mid-answer", func(t *testing.T, e env) {
			// What the site sent before its pause reaches the crawler during the pause,
			// through a fleet proxy that relays bytes as they come and through the local
			// one, for a request without a body (the gateway's own transport) and one with
			// (the standard transport): nothing waits in a buffer for bytes that may never
			// come.
			for _, user := range []string{blind, local} {
				for _, method := range []string{http.MethodGet, http.MethodPost} {
					c := e.rawCrawler(user)
					if method == http.MethodPost {
						c.send(method, e.site.URL+"/pause", e.site.host(), true, "Content-Length: 2")
						_, err := io.WriteString(c.conn, "hi")
						require.NoError(t, err)
					} else {
						c.send(method, e.site.URL+"/pause", e.site.host(), true)
					}
					e.site.waitStarted(t, "/pause")
					resp := c.read(method)
					require.Equal(t, http.StatusOK, resp.StatusCode)
					line, err := bufio.NewReader(resp.Body).ReadString('\n')
					require.NoError(t, err, "%s through the %s proxy", method, user)
					assert.Equal(t, pauseStart, line)
					require.NoError(t, c.conn.Close())
				}
			}
		}},
		{"the fleet proxy resets before the answer", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.send(http.MethodGet, e.site.URL+"/stall", e.site.host(), true)
			e.site.waitStarted(t, "/stall")
			e.proxies[0].reset()
			resp := c.read(http.MethodGet)
			assert.Equal(t, http.StatusBadGateway, resp.StatusCode)
		}},
		{"the fleet proxy resets mid-answer", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.send(http.MethodGet, e.site.URL+"/stream", e.site.host(), true)
			resp := c.read(http.MethodGet)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			e.site.waitStarted(t, "/stream")
			e.proxies[0].reset()
			_, err := io.ReadAll(resp.Body)
			assert.Error(t, err, "the crawler learns its answer is incomplete")
			e.waitOutcome("http", "aborted")
		}},
		{"the fleet proxy resets mid-answer in a tunnel", func(t *testing.T, e env) {
			c := e.rawCrawler(local)
			c.connect(e.site.host())
			c.send(http.MethodGet, "/stream", e.site.host(), false)
			resp := c.read(http.MethodGet)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			e.site.waitStarted(t, "/stream")
			e.proxies[0].reset()
			c.ended()
		}},
	} {
		// Tunnels on the event loops (Linux), and on a goroutine each (elsewhere, and
		// what the loops hand over).
		for _, loops := range []int{0, -1} {
			t.Run(tc.name+map[int]string{0: "", -1: "/no loops"}[loops], func(t *testing.T) {
				relay := blindProxy(t)
				ge := newGatewayEnv(t, 2, func(_ *discovery.Config, g *gateway.Config, fleet []discovery.Proxy) {
					fleet[0].Attributes = map[string]string{"relay": "local"}
					fleet[1].Attributes = map[string]string{"relay": "blind"}
					fleet[1].Port = int32(relay)
					g.HalfClosedTimeout = 200 * time.Millisecond
					g.Loops = loops
				})
				ge.t = t
				e := env{gatewayEnv: ge, site: newAnswersSite(t)}
				tc.run(t, e)
				e.waitNoLeases()
				require.Eventually(t, func() bool { return e.metric("proxyfleet_gateway_tunnels_open") == 0 }, 10*time.Second, 5*time.Millisecond)
			})
		}
	}
}
