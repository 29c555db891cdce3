// The gateway's benchmarks, each figure against baselines from the same run: the same
// requests sent straight through the same fleet proxies, and (throughput, latency) through
// Debian's Squid set up as the round-robin gateway a team would build instead. Everything
// runs on loopback; the gateways of the throughput and latency benchmarks, and the
// gateways, fleet and echo server of the memory benchmark, run in processes of their own
// (startHelper).
// They feed the three tables of ## Gateway in docs/benchmarks.md:
// BenchmarkGatewayThroughput the fetches/s and CPU per fetch, BenchmarkGatewayLatency what
// each gateway adds to one fetch, BenchmarkGatewayTunnelMemory the memory per open tunnel.
// The over-capacity benchmark (overcapacity_bench_test.go) uses the same fleet, loads and
// helper processes.
//
//	go test ./internal/benchmarks -run '^$' -bench Gateway -benchtime 1x -timeout 30m

package benchmarks

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// benchFleetProxies starts n local forward proxies in this process and returns the index's
// view of them (maxLeases each).
func benchFleetProxies(b testing.TB, n, maxLeases int) []discovery.Proxy {
	return benchFleetFrom(b, 0, n, maxLeases)
}

// benchFleetFrom is benchFleetProxies numbered from first: bench-<first>, and on.
func benchFleetFrom(b testing.TB, first, n, maxLeases int) []discovery.Proxy {
	var fleet []discovery.Proxy
	for i := first; i < first+n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		creds := proxyauth.Credentials{Username: "proxyfleet", Password: fmt.Sprintf("bench-%d-password", i)} // its name's
		hs := &http.Server{Handler: &localproxy.ForwardProxy{Auth: local.NewAuth(creds)}, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		b.Cleanup(func() { _ = hs.Close() })
		fleet = append(fleet, discovery.Proxy{Name: fmt.Sprintf("bench-%d", i), Namespace: "bench", IP: "127.0.0.1",
			Port: int32(ln.Addr().(*net.TCPAddr).Port), Healthy: true, Phase: "Ready", MaxLeases: maxLeases, Credentials: creds})
	}
	return fleet
}

// benchToken is the crawlers' token in the gateway benchmarks: the gateway checks it on
// every request and tunnel, as in a deployment, and the Squid baseline checks the same
// credentials.
const benchToken = "bench-gateway-token"

// benchUser is the gateway credentials of the benchmarks' crawlers.
var benchUser = url.UserPassword("default", benchToken)

// benchProxyAuthorization is benchUser as a Proxy-Authorization header's value.
var benchProxyAuthorization = "Basic " + base64.StdEncoding.EncodeToString([]byte("default:"+benchToken))

// benchGateway serves a gateway over fleet, as deployed: crawlers authenticate with
// benchToken, every request and tunnel holds a lease, and plain answers' statuses are
// checked for reports. It returns the gateway's address.
func benchGateway(b testing.TB, fleet []discovery.Proxy) string {
	st := discovery.NewStore(time.Hour)
	st.ReplaceAll(fleet)
	srv := discovery.NewServer(discovery.Config{Token: benchToken}, st, nil, nopSignaler{}, slog.New(slog.DiscardHandler), nil)
	ln, err := gateway.Listen(context.Background(), "127.0.0.1:0") // as cmd/discovery listens
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = gateway.New(gateway.Config{}, srv, slog.New(slog.DiscardHandler), nil).Serve(ctx, ln)
	}()
	b.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

type nopSignaler struct{}

func (nopSignaler) Report(context.Context, string, string, contract.ReportSignal) error { return nil }

// proxyURL is a fleet proxy's URL with its credentials.
func proxyURL(p discovery.Proxy) *url.URL {
	return &url.URL{Scheme: "http", Host: net.JoinHostPort(p.IP, strconv.Itoa(int(p.Port))),
		User: url.UserPassword(p.Credentials.Username, p.Credentials.Password)}
}

// benchClient is a crawler's HTTP client through proxy, keeping its connections.
func benchClient(proxy *url.URL, keepAlive bool) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy),
		MaxIdleConnsPerHost: 4, DisableKeepAlives: !keepAlive, TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // a loopback test site's own certificate
}

// fetchLoad runs workers, each with its own client (clientFor(i)), fetching u for d, and
// returns fetches per second and every latency. Every fetch must succeed.
func fetchLoad(b testing.TB, workers int, d time.Duration, u string, clientFor func(i int) *http.Client) (float64, []time.Duration) {
	rate, lat, _ := runLoad(b, workers, d, u, clientFor, false)
	return rate, lat
}

// runLoad is fetchLoad that, when refusals are allowed (a load over capacity), counts a
// fetch the gateway refused (its 503 after waiting for a slot, for a request or a
// tunnel's CONNECT) instead of failing, and returns their number too.
func runLoad(b testing.TB, workers int, d time.Duration, u string, clientFor func(i int) *http.Client, refusals bool) (float64, []time.Duration, int64) {
	clients := make([]*http.Client, workers)
	for i := range clients {
		clients[i] = clientFor(i)
	}
	defer closeIdle(clients)
	ok, lat, refused := fetchWith(b, clients, d, u, refusals)
	return float64(ok) / d.Seconds(), lat, refused
}

// fetchWith has every client fetch u, one fetch after another, until d has passed, and
// returns how many fetches succeeded, their latencies, and how many were refused (counted
// only when refusals are allowed, see runLoad). Any other outcome fails the benchmark.
func fetchWith(b testing.TB, clients []*http.Client, d time.Duration, u string, refusals bool) (int64, []time.Duration, int64) {
	var total, refused, failed atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(stop) {
				t0 := time.Now()
				status := 0
				resp, err := c.Get(u)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				} else if strings.Contains(err.Error(), http.StatusText(http.StatusServiceUnavailable)) {
					status = http.StatusServiceUnavailable // a tunnel's CONNECT refused
				}
				switch {
				case status == http.StatusOK:
					mine = append(mine, time.Since(t0))
					total.Add(1)
				case refusals && status == http.StatusServiceUnavailable:
					refused.Add(1)
				default:
					failed.Add(1)
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	require.Zero(b, failed.Load(), "fetches failed")
	return total.Load(), lat, refused.Load()
}

func closeIdle(clients []*http.Client) {
	for _, c := range clients {
		c.CloseIdleConnections()
	}
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func benchDuration() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("GATEWAY_BENCH_DURATION")); err == nil {
		return d
	}
	return 10 * time.Second
}

// benchLoad is one kind of fetch the gateway benchmarks load it with.
type benchLoad struct {
	name      string
	url       string
	keepAlive bool
}

// benchLoads are plain HTTP to site, and HTTPS to tlsSite in tunnels kept open and in a
// tunnel per fetch.
func benchLoads(site, tlsSite string) []benchLoad {
	return []benchLoad{
		{"http", site + "/page", true},
		{"https-tunnel-kept", tlsSite + "/page", true},
		{"https-tunnel-per-fetch", tlsSite + "/page", false},
	}
}

// startGatewayHelper runs a gateway over fleet in a process of its own (env as
// startHelper's) and returns its URL with the crawlers' credentials, and its process ID.
func startGatewayHelper(b *testing.B, fleet []discovery.Proxy, env ...string) (*url.URL, int) {
	raw, _ := json.Marshal(fleet)
	h := startHelper(b, "gateway", append([]string{"FLEET=" + string(raw)}, env...)...)
	var addr string
	require.NoError(b, h.out.Decode(&addr))
	return &url.URL{Scheme: "http", Host: addr, User: benchUser}, h.cmd.Process.Pid
}

// BenchmarkGatewayThroughput: fetches per second of 64 crawler connections through the
// gateway, against two baselines in the same run over the same 4 fleet proxies and the
// same sites: the same 64 connections sent straight through the fleet proxies (16 each),
// and through Debian's Squid set up as the round-robin gateway a user would build instead
// (squidGateway). Each for plain HTTP and for HTTPS in tunnels (kept open, and one tunnel
// per fetch). Two settings: "shared", everything on every core; and "own-core", the
// crawlers, fleet and sites on core 0 and the gateway under test (ours, or Squid) alone on
// core 1, as a discovery replica has CPU of its own in a deployment (taskset). Both
// gateways run in processes of their own, whose CPU time per fetch is reported too. Ours
// runs as deployed: crawlers authenticate, every request and tunnel holds a lease, plain
// answers are checked for reports; Squid checks the same credentials. Feeds the Gateway
// table of docs/benchmarks.md.
//
// The three are measured in short slices (GATEWAY_BENCH_SLICE, 1 s), in rounds of ours,
// Squid, direct, direct, Squid, ours (GATEWAY_BENCH_ROUNDS, 15), each with the same 64
// clients throughout the load, so kept tunnels stay open from slice to slice. Why: the
// machines these figures come from are VMs whose speed moves by a fifth within seconds,
// and with runs of 5 s in three rounds, one run's rounds spread by more than the
// difference being measured. Slices a second long see the same machine; a drift within a
// round weighs the same on each (the round reads the same both ways); and fifteen rounds
// give the mean's 95% interval, which is reported with the ratio.
//
// On a core of its own, neither gateway is the bottleneck: core 0 is, busy all the time
// with the crawlers, fleet proxies and sites. There the rate is what core 0 does per
// fetch, and the benchmark reports it for each gateway (its busy time and the network
// receive work, NET_RX softirqs, per fetch, from /proc): what a gateway costs the other
// side of the machine. It also counts how often core 1 was woken from the other core
// (ipis): a gateway that falls idle more often makes the crawlers' core pay for more
// interrupts, which on a VM are dear.
func BenchmarkGatewayThroughput(b *testing.B) {
	fleet := benchFleetProxies(b, 4, 64)
	body := strings.Repeat("x", 1024)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
	defer site.Close()
	tlsSite := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
	defer tlsSite.Close()
	slice, rounds := time.Second, 15
	if v, err := time.ParseDuration(os.Getenv("GATEWAY_BENCH_SLICE")); err == nil && v > 0 {
		slice = v
	}
	if v, err := strconv.Atoi(os.Getenv("GATEWAY_BENCH_ROUNDS")); err == nil && v > 1 {
		rounds = v
	}
	for _, setting := range []string{"shared", "own-core"} {
		var gw, sq *url.URL
		// The processes whose CPU time is read.
		var gwPid, sqPid int
		switch setting {
		case "shared":
			// In a process of its own, as Squid is: in this one it would share the
			// crawlers' scheduler, which Squid cannot.
			gw, gwPid = startGatewayHelper(b, fleet)
			sq, sqPid = squidGateway(b, fleet, []string{site.URL, tlsSite.URL}, "")
		case "own-core":
			if _, err := exec.LookPath("taskset"); err != nil || runtime.NumCPU() < 2 {
				b.Logf("own-core skipped: needs taskset and 2 cores")
				continue
			}
			pin(b, "0")
			gw, gwPid = startGatewayHelper(b, fleet, "TASKSET=1")
			sq, sqPid = squidGateway(b, fleet, []string{site.URL, tlsSite.URL}, "1")
		}
		for _, tc := range benchLoads(site.URL, tlsSite.URL) {
			b.Run(setting+"/"+tc.name, func(b *testing.B) {
				ours := newSliced(b, gwPid, func(int) *http.Client { return benchClient(gw, tc.keepAlive) })
				theirs := newSliced(b, sqPid, func(int) *http.Client { return benchClient(sq, tc.keepAlive) })
				direct := newSliced(b, 0, func(i int) *http.Client { return benchClient(proxyURL(fleet[i%len(fleet)]), tc.keepAlive) })
				all := []*sliced{ours, theirs, direct}
				for _, l := range all {
					fetchWith(b, l.clients, slice, tc.url, false) // a warm-up: tunnels and pools opened, not counted
				}
				var ratios []float64
				for range rounds {
					o, t := ours.fetches, theirs.fetches
					for _, l := range []*sliced{ours, theirs, direct, direct, theirs, ours} {
						l.run(b, slice, tc.url)
					}
					ratios = append(ratios, float64(ours.fetches-o)/float64(theirs.fetches-t))
				}
				mean, half := meanInterval(ratios)
				through, squid, base := ours.rate(), theirs.rate(), direct.rate()
				b.ReportMetric(base, "direct-fetches/s")
				b.ReportMetric(through, "gateway-fetches/s")
				b.ReportMetric(squid, "squid-fetches/s")
				b.ReportMetric(through/base, "ratio")
				b.ReportMetric(through/squid, "squid-ratio")
				b.ReportMetric(mean-half, "squid-ratio-lo95")
				b.ReportMetric(mean+half, "squid-ratio-hi95")
				b.ReportMetric(ours.cpuPerFetch(), "gateway-cpu-µs/fetch")
				b.ReportMetric(theirs.cpuPerFetch(), "squid-cpu-µs/fetch")
				extra := ""
				if setting == "own-core" {
					b.ReportMetric(ours.core0PerFetch(), "core0-gateway-µs/fetch")
					b.ReportMetric(theirs.core0PerFetch(), "core0-squid-µs/fetch")
					b.ReportMetric(ours.wakesPerFetch(), "core1-gateway-wakes/fetch")
					b.ReportMetric(theirs.wakesPerFetch(), "core1-squid-wakes/fetch")
					extra = fmt.Sprintf("; core 0 per fetch: busy %.1f / %.1f µs (idle %.3f / %.3f of the time), NET_RX %.2f / %.2f; "+
						"core 1 woken by the other %.2f / %.2f times a fetch",
						ours.core0PerFetch(), theirs.core0PerFetch(), ours.core0Idle(), theirs.core0Idle(),
						ours.netRxPerFetch(), theirs.netRxPerFetch(), ours.wakesPerFetch(), theirs.wakesPerFetch())
				}
				b.Logf("%s/%s: %d rounds of %s slices: direct %.0f fetches/s, gateway %.0f, squid %.0f: %.2f of direct, "+
					"%.2f of squid (mean of rounds %.3f ± %.3f, min %.2f, max %.2f); CPU per fetch: gateway %.1f µs, squid %.1f µs%s",
					setting, tc.name, rounds, slice, base, through, squid, through/base, through/squid, mean, half,
					slices.Min(ratios), slices.Max(ratios), ours.cpuPerFetch(), theirs.cpuPerFetch(), extra)
				for _, l := range all {
					closeIdle(l.clients)
				}
			})
		}
	}
}

// sliced is one way of fetching (through a gateway, or straight) measured in slices: the
// same clients throughout, and the sums of what its slices counted.
type sliced struct {
	pid     int // the gateway's process; 0 for none
	clients []*http.Client
	fetches int64
	elapsed time.Duration
	cpu     time.Duration // the gateway process's
	busy0   time.Duration // core 0's, busy and idle
	idle0   time.Duration
	netRx0  int64 // core 0's NET_RX softirqs
	wakes1  int64 // interrupts core 1 received from the other core (see ipis)
}

func newSliced(b testing.TB, pid int, clientFor func(i int) *http.Client) *sliced {
	l := &sliced{pid: pid}
	for i := range 64 {
		l.clients = append(l.clients, clientFor(i))
	}
	return l
}

// run fetches u for d with every client, and adds what it counted.
func (l *sliced) run(b testing.TB, d time.Duration, u string) {
	var cpu time.Duration
	if l.pid != 0 {
		cpu = procCPU(b, l.pid)
	}
	busy, idle := coreTimes(b, 0)
	rx, wakes := netRx(b, 0), ipis(b, 1)
	start := time.Now()
	n, _, _ := fetchWith(b, l.clients, d, u, false)
	l.elapsed += time.Since(start)
	l.fetches += n
	if l.pid != 0 {
		l.cpu += procCPU(b, l.pid) - cpu
	}
	busyNow, idleNow := coreTimes(b, 0)
	l.busy0 += busyNow - busy
	l.idle0 += idleNow - idle
	l.netRx0 += netRx(b, 0) - rx
	l.wakes1 += ipis(b, 1) - wakes
}

func (l *sliced) rate() float64 { return float64(l.fetches) / l.elapsed.Seconds() }

func (l *sliced) cpuPerFetch() float64 { return float64(l.cpu.Microseconds()) / float64(l.fetches) }

func (l *sliced) core0PerFetch() float64 { return float64(l.busy0.Microseconds()) / float64(l.fetches) }

func (l *sliced) core0Idle() float64 { return l.idle0.Seconds() / (l.busy0 + l.idle0).Seconds() }

func (l *sliced) netRxPerFetch() float64 { return float64(l.netRx0) / float64(l.fetches) }

func (l *sliced) wakesPerFetch() float64 { return float64(l.wakes1) / float64(l.fetches) }

// meanInterval is the mean of xs and the half width of its 95% confidence interval
// (Student's t, two-sided; 2.0 beyond 30 values).
func meanInterval(xs []float64) (float64, float64) {
	n := float64(len(xs))
	var sum, sq float64
	for _, x := range xs {
		sum += x
	}
	mean := sum / n
	for _, x := range xs {
		sq += (x - mean) * (x - mean)
	}
	t := 2.0
	if i := len(xs) - 2; i >= 0 && i < len(studentT95) {
		t = studentT95[i]
	}
	return mean, t * math.Sqrt(sq/(n-1)) / math.Sqrt(n)
}

// studentT95 is Student's t for a two-sided 95% interval, from 1 to 29 degrees of freedom.
var studentT95 = []float64{12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23, 2.20, 2.18, 2.16, 2.14,
	2.13, 2.12, 2.11, 2.10, 2.09, 2.09, 2.08, 2.07, 2.07, 2.06, 2.06, 2.06, 2.05, 2.05, 2.05}

// coreTimes is the time core cpu has spent busy and idle (or waiting on I/O) so far, from
// /proc/stat.
func coreTimes(b testing.TB, cpu int) (busy, idle time.Duration) {
	for _, f := range procLines(b, "/proc/stat") {
		if len(f) < 8 || f[0] != "cpu"+strconv.Itoa(cpu) {
			continue
		}
		for i, v := range f[1:8] {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(b, err)
			t := time.Duration(n) * (time.Second / 100) // in USER_HZ, 100 a second
			if i == 3 || i == 4 {                       // the fourth and fifth: idle, iowait
				idle += t
			} else {
				busy += t
			}
		}
		return busy, idle
	}
	b.Fatalf("no cpu%d in /proc/stat", cpu)
	return 0, 0
}

// netRx is core cpu's count of network receive softirqs so far: on loopback, a segment
// is received on the core that sent it.
func netRx(b testing.TB, cpu int) int64 {
	for _, f := range procLines(b, "/proc/softirqs") {
		if len(f) > cpu+1 && f[0] == "NET_RX:" {
			n, err := strconv.ParseInt(f[cpu+1], 10, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatalf("no NET_RX in /proc/softirqs")
	return 0
}

// ipis is how many interrupts core cpu has received from other cores so far, to reschedule
// or to run a function (a remote wake-up): "RES" and "CAL" in /proc/interrupts. A core
// that falls idle is woken by one when a task on another core makes work for it.
func ipis(b testing.TB, cpu int) int64 {
	var n int64
	for _, f := range procLines(b, "/proc/interrupts") {
		if len(f) > cpu+1 && (f[0] == "RES:" || f[0] == "CAL:") {
			v, err := strconv.ParseInt(f[cpu+1], 10, 64)
			require.NoError(b, err)
			n += v
		}
	}
	return n
}

func procLines(b testing.TB, path string) [][]string {
	raw, err := os.ReadFile(path)
	require.NoError(b, err)
	var out [][]string
	for _, l := range strings.Split(string(raw), "\n") {
		out = append(out, strings.Fields(l))
	}
	return out
}

// squidGateway runs Debian's Squid as the gateway a team would configure instead of ours:
// every fleet proxy a parent (cache_peer … parent … round-robin login=…), never direct,
// nothing cached, nothing logged per request, the crawlers' credentials checked by Squid's
// own helper (with their answers cached, as a deployment would), and nothing added that
// names the client. sites are the URLs crawlers fetch. cores, unless empty, is where Squid
// runs (taskset), as the own-core setting puts our gateway. It returns Squid's URL with the
// crawlers' credentials and Squid's process ID.
func squidGateway(b *testing.B, fleet []discovery.Proxy, sites []string, cores string) (*url.URL, int) {
	// The passwd file and paths of the fleet's own rendering; the configuration is this one.
	port := squidtest.FreePort(b)
	files, err := squid.Render(squid.Config{Credentials: proxyauth.Credentials{Username: "default", Password: benchToken},
		Port: port, Listen: "127.0.0.1", Paths: squidtest.TempPaths(b)})
	require.NoError(b, err)
	p := files.Paths
	var c strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&c, format+"\n", args...) }
	line("http_port 127.0.0.1:%d", port)
	line("visible_hostname gateway")
	line("pid_filename %s", p.PidFile)
	line("cache_log %s", p.CacheLog)
	line("access_log none")
	line("icp_port 0")
	line("htcp_port 0")
	line("pinger_enable off")
	line("netdb_filename none")
	line("digest_generation off")
	line("cache deny all")
	line("auth_param basic program %s %s", p.AuthHelper, p.Passwd)
	line("auth_param basic children 5 startup=1 idle=1")
	line("auth_param basic realm gateway")
	line("auth_param basic credentialsttl 5 minutes")
	line("acl crawlers proxy_auth REQUIRED")
	line("http_access allow crawlers")
	line("http_access deny all")
	line("never_direct allow all")
	for _, f := range fleet {
		line("cache_peer %s parent %d 0 no-query no-digest round-robin login=%s:%s name=%s",
			f.IP, f.Port, f.Credentials.Username, f.Credentials.Password, f.Name)
	}
	line("forwarded_for delete")
	line("via off")
	files.Conf = []byte(c.String())
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))
	inst := squidtest.Run(b, files, addr)
	if cores != "" {
		// Its helpers, started later, inherit the core.
		out, err := exec.Command("taskset", "-a", "-p", "-c", cores, strconv.Itoa(inst.Pid())).CombinedOutput()
		require.NoError(b, err, "%s", out)
	}
	u := &url.URL{Scheme: "http", Host: addr, User: benchUser}
	// One fetch through it, so a configuration Squid took but cannot serve fails here and
	// not as a rate of zero.
	for _, site := range sites {
		resp, err := benchClient(u, false).Get(site)
		require.NoError(b, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(b, http.StatusOK, resp.StatusCode, "a fetch of %s through the Squid gateway:\n%s", site, inst.Logs())
	}
	return u, inst.Pid()
}

// pin moves every thread of this process to the given cores until the benchmark ends.
func pin(b *testing.B, cores string) {
	out, err := exec.Command("taskset", "-a", "-p", "-c", cores, strconv.Itoa(os.Getpid())).CombinedOutput()
	require.NoError(b, err, "%s", out)
	b.Cleanup(func() {
		_ = exec.Command("taskset", "-a", "-p", "-c", fmt.Sprintf("0-%d", runtime.NumCPU()-1), strconv.Itoa(os.Getpid())).Run()
	})
}

// BenchmarkGatewayLatency: what the gateway adds to one fetch, with one crawler
// connection sending one request at a time, against the same fetches sent straight
// through the fleet proxy, and what the Squid gateway of BenchmarkGatewayThroughput adds
// in the same run: for plain HTTP, and for HTTPS in a tunnel kept open and in a tunnel per
// fetch (the CONNECT, the TLS handshake and the request). Both gateways run in processes of
// their own, as in the throughput benchmark: in the crawlers' process ours would be spared
// the wake-up of another process at each hop, which Squid cannot be.
func BenchmarkGatewayLatency(b *testing.B) {
	fleet := benchFleetProxies(b, 1, 4)
	gw, _ := startGatewayHelper(b, fleet)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer site.Close()
	tlsSite := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") }))
	defer tlsSite.Close()
	sq, _ := squidGateway(b, fleet, []string{site.URL, tlsSite.URL}, "")
	d := benchDuration()
	for _, tc := range []struct {
		name      string
		url       string
		keepAlive bool
	}{
		{"http", site.URL + "/", true},
		{"https-tunnel-kept", tlsSite.URL + "/", true},
		{"https-tunnel-per-fetch", tlsSite.URL + "/", false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			_, direct := fetchLoad(b, 1, d, tc.url, func(int) *http.Client { return benchClient(proxyURL(fleet[0]), tc.keepAlive) })
			_, through := fetchLoad(b, 1, d, tc.url, func(int) *http.Client { return benchClient(gw, tc.keepAlive) })
			_, squid := fetchLoad(b, 1, d, tc.url, func(int) *http.Client { return benchClient(sq, tc.keepAlive) })
			for _, q := range []struct {
				name string
				q    float64
			}{{"p50", 0.5}, {"p99", 0.99}} {
				dq, gq, sq := quantile(direct, q.q), quantile(through, q.q), quantile(squid, q.q)
				b.ReportMetric(float64(dq.Microseconds()), "direct-"+q.name+"-µs")
				b.ReportMetric(float64((gq - dq).Microseconds()), "added-"+q.name+"-µs")
				b.ReportMetric(float64((sq - dq).Microseconds()), "squid-added-"+q.name+"-µs")
				b.Logf("%s %s: direct %s, gateway %s (adds %s), squid %s (adds %s); %d, %d and %d fetches",
					tc.name, q.name, dq, gq, gq-dq, sq, sq-dq, len(direct), len(through), len(squid))
			}
		})
	}
}

// --- memory per tunnel: the gateway and the fleet in processes of their own ---------------

// helperEnv switches a test binary re-run by the memory benchmark into one of its
// helpers: "fleet" or "gateway".
const helperEnv = "PROXYFLEET_GATEWAY_BENCH_HELPER"

// TestGatewayBenchHelper is not a test: the memory benchmark runs the test binary again as
// a fleet of forward proxies or as a gateway, each of which prints its addresses, answers
// "stats" on stdin with its memory, and exits when stdin closes.
func TestGatewayBenchHelper(t *testing.T) {
	role := os.Getenv(helperEnv)
	if role == "" {
		t.Skip("run by BenchmarkGatewayTunnelMemory")
	}
	raiseFileLimit()
	if f := os.Getenv("GATEWAY_BENCH_CPUPROFILE"); f != "" && role == "gateway" {
		// Where a gateway's time goes under a benchmark's load: go tool pprof on the file.
		w, err := os.Create(f + "." + strconv.Itoa(os.Getpid()))
		require.NoError(t, err)
		require.NoError(t, pprof.StartCPUProfile(w))
		defer func() { pprof.StopCPUProfile(); _ = w.Close() }()
	}
	out := json.NewEncoder(os.Stdout)
	switch role {
	case "fleet":
		first, _ := strconv.Atoi(os.Getenv("FLEET_FIRST"))
		_ = out.Encode(benchFleetFrom(t, first, 1, 100_000))
	case "gateway":
		var fleet []discovery.Proxy
		require.NoError(t, json.Unmarshal([]byte(os.Getenv("FLEET")), &fleet))
		// The index's JSON has no credentials: the fleet's are known by construction.
		// Capacity is no limit unless MAX_LEASES says.
		maxLeases, err := strconv.Atoi(os.Getenv("MAX_LEASES"))
		if err != nil {
			maxLeases = 100_000
		}
		for i := range fleet {
			fleet[i].Credentials = proxyauth.Credentials{Username: "proxyfleet", Password: fleet[i].Name + "-password"}
			fleet[i].MaxLeases = maxLeases
		}
		_ = out.Encode(benchGateway(t, fleet))
	case "echo":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				// A small buffer, not io.Copy: a splice would hold a pipe per idle
				// connection, and this process must hold 10,000 of them.
				go func() {
					_, _ = io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, make([]byte, 64))
					c.Close()
				}()
			}
		}()
		_ = out.Encode(ln.Addr().String())
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if sc.Text() == "stats" {
			_ = out.Encode(selfStats())
		}
	}
}

// procStats is a process's memory as the memory benchmark reads it.
type procStats struct {
	RSSKiB      int64  `json:"rssKiB"`
	HeapInuse   uint64 `json:"heapInuse"`
	StackInuse  uint64 `json:"stackInuse"`
	Goroutines  int    `json:"goroutines"`
	OpenFiles   int    `json:"openFiles"`
	GoSysMemory uint64 `json:"goSys"`
}

func selfStats() procStats {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s := procStats{HeapInuse: m.HeapInuse, StackInuse: m.StackInuse, Goroutines: runtime.NumGoroutine(), GoSysMemory: m.Sys}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		s.OpenFiles = len(fds)
	}
	if raw, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				s.RSSKiB, _ = strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			}
		}
	}
	return s
}

// raiseFileLimit lifts the open files limit as far as the system allows: 10,000 tunnels
// are 20,000 sockets in the gateway alone, and the kernel's splice pipes while they copy.
func raiseFileLimit() {
	want := uint64(400_000)
	if raw, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64); err == nil && n < want {
			want = n
		}
	}
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want})
}

type helper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *json.Decoder
}

func startHelper(b *testing.B, role string, env ...string) *helper {
	args := []string{os.Args[0], "-test.run", "^TestGatewayBenchHelper$", "-test.v=false", "-test.timeout=0"}
	for _, e := range env {
		if cores, ok := strings.CutPrefix(e, "TASKSET="); ok {
			args = append([]string{"taskset", "-c", cores}, args...)
		}
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), append(env, helperEnv+"="+role)...)
	in, err := cmd.StdinPipe()
	require.NoError(b, err)
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	cmd.Stderr = os.Stderr
	require.NoError(b, cmd.Start())
	b.Cleanup(func() { in.Close(); _ = cmd.Wait() })
	return &helper{cmd: cmd, in: in, out: json.NewDecoder(out)}
}

func (h *helper) stats(b *testing.B) procStats {
	_, err := io.WriteString(h.in, "stats\n")
	require.NoError(b, err)
	var s procStats
	require.NoError(b, h.out.Decode(&s))
	return s
}

// BenchmarkGatewayTunnelMemory opens GATEWAY_TUNNELS (default 10,000) tunnels at once,
// each to an echo server through the gateway and one of 8 fleet proxies, and reports what
// each open tunnel costs a gateway process: resident memory, Go heap and stacks,
// goroutines and open files. The fleet proxies (forward proxies holding the same tunnels
// with Go's plain copy) are the baseline. Every part runs in processes of its own, and
// the tunnels are spread over GATEWAY_PROCS gateways (default 2, as discovery replicas
// share crawlers): a process may hold at most as many files as RLIMIT_NOFILE allows,
// 20,000 on the machine the figures come from, and 10,000 tunnels are 20,000 sockets.
func BenchmarkGatewayTunnelMemory(b *testing.B) {
	n, procs := 10_000, 2
	if v, err := strconv.Atoi(os.Getenv("GATEWAY_TUNNELS")); err == nil {
		n = v
	}
	if v, err := strconv.Atoi(os.Getenv("GATEWAY_PROCS")); err == nil && v > 0 {
		procs = v
	}
	echoProc := startHelper(b, "echo")
	var target string
	require.NoError(b, echoProc.out.Decode(&target))
	var fleet []discovery.Proxy
	var fleetProcs []*helper
	for i := range 8 {
		h := startHelper(b, "fleet", "FLEET_FIRST="+strconv.Itoa(i))
		var ps []discovery.Proxy
		require.NoError(b, h.out.Decode(&ps))
		fleet = append(fleet, ps...)
		fleetProcs = append(fleetProcs, h)
	}
	raw, _ := json.Marshal(fleet)
	var gws []*helper
	var gwAddrs []string
	for range procs {
		h := startHelper(b, "gateway", "FLEET="+string(raw))
		var addr string
		require.NoError(b, h.out.Decode(&addr))
		gws, gwAddrs = append(gws, h), append(gwAddrs, addr)
	}
	statsOf := func(hs []*helper) []procStats {
		var out []procStats
		for _, h := range hs {
			out = append(out, h.stats(b))
		}
		return out
	}
	gwBefore, fleetBefore := statsOf(gws), statsOf(fleetProcs)

	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	start := time.Now()
	for i := range n {
		c, err := net.Dial("tcp", gwAddrs[i%len(gwAddrs)])
		require.NoError(b, err)
		_, err = io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\nProxy-Authorization: "+benchProxyAuthorization+"\r\n\r\n")
		require.NoError(b, err)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		require.NoError(b, err)
		require.Equal(b, http.StatusOK, resp.StatusCode, "tunnel %d", i)
		_, err = io.WriteString(c, "ping")
		require.NoError(b, err)
		buf := make([]byte, 4)
		_, err = io.ReadFull(br, buf)
		require.NoError(b, err)
		conns = append(conns, c)
	}
	opened := time.Since(start)
	gwAfter, fleetAfter := statsOf(gws), statsOf(fleetProcs)
	sum := func(ss []procStats) procStats {
		var t procStats
		for _, s := range ss {
			t.RSSKiB += s.RSSKiB
			t.HeapInuse += s.HeapInuse
			t.StackInuse += s.StackInuse
			t.Goroutines += s.Goroutines
			t.OpenFiles += s.OpenFiles
		}
		return t
	}
	per := func(after, before int64) float64 { return float64(after-before) / float64(n) }
	report := func(who string, a, bf procStats) {
		rss := per(a.RSSKiB*1024, bf.RSSKiB*1024)
		goMem := per(int64(a.HeapInuse+a.StackInuse), int64(bf.HeapInuse+bf.StackInuse))
		b.ReportMetric(rss, who+"-rss-B/tunnel")
		b.ReportMetric(goMem, who+"-go-B/tunnel")
		b.ReportMetric(per(int64(a.Goroutines), int64(bf.Goroutines)), who+"-goroutines/tunnel")
		b.ReportMetric(per(int64(a.OpenFiles), int64(bf.OpenFiles)), who+"-files/tunnel")
		b.Logf("%s: %d tunnels: RSS %d → %d MiB (%.1f KiB each), Go heap+stacks %.1f KiB each, %.2f goroutines and %.2f open files each",
			who, n, bf.RSSKiB>>10, a.RSSKiB>>10, rss/1024, goMem/1024, per(int64(a.Goroutines), int64(bf.Goroutines)),
			per(int64(a.OpenFiles), int64(bf.OpenFiles)))
	}
	b.Logf("opened %d tunnels through %d gateways in %s", n, procs, opened.Round(time.Millisecond))
	report("gateway", sum(gwAfter), sum(gwBefore))
	report("fleet", sum(fleetAfter), sum(fleetBefore))
}
