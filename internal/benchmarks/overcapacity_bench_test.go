// What one crawler more than the fleet has slots costs the crawlers that are served:
// BenchmarkGatewayOverCapacity runs 12 crawlers against 12 slots behind the gateway, then
// 13, and reports the fetches/s of 13 against 12 and the gateway's CPU for each. Feeds the
// table of "Demand over capacity" in docs/benchmarks.md (## Demand over capacity).

package benchmarks

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkGatewayOverCapacity: what one crawler more than the fleet has slots costs the
// crawlers that are served. 3 fleet proxies of maxLeases 4 (12 slots) behind the gateway,
// which runs in a process of its own; 12 crawlers (exactly the slots: the baseline, run
// before and after) and then 13, each with one connection fetching a local site as fast as
// it can, in rounds. It reports the fetches per second of 13 against 12 (the goal is at least 0.95:
// the one that finds no slot waits, or is told to come back, without slowing the rest),
// the CPU the gateway's process spends in each run, and the difference per second: what
// the waiting crawler costs discovery. Feeds the "Demand over capacity" table of
// docs/benchmarks.md.
//
//	go test ./internal/benchmarks -run '^$' -bench GatewayOverCapacity -benchtime 1x -timeout 30m
func BenchmarkGatewayOverCapacity(b *testing.B) {
	const proxies, maxLeases = 3, 4
	slots := proxies * maxLeases
	fleet := benchFleetProxies(b, proxies, maxLeases)
	body := strings.Repeat("x", 1024)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
	defer site.Close()
	tlsSite := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, body) }))
	defer tlsSite.Close()
	gw, pid := startGatewayHelper(b, fleet, "MAX_LEASES="+strconv.Itoa(maxLeases))
	d := benchDuration()
	// In kept tunnels a tunnel holds its slot while it is open, and the 13th waits for one
	// to close; with a lease per request (plain HTTP) it takes its turn as requests end.
	for _, tc := range benchLoads(site.URL, tlsSite.URL) {
		b.Run(tc.name, func(b *testing.B) {
			client := func(int) *http.Client { return benchClient(gw, tc.keepAlive) }
			run := func(n int) (rate, cpu float64, refused int64) {
				before := procCPU(b, pid)
				t0 := time.Now()
				rate, _, refused = runLoad(b, n, d, tc.url, client, true)
				cpu = (procCPU(b, pid) - before).Seconds() / time.Since(t0).Seconds()
				return rate, cpu, refused
			}
			// Rounds of slots, slots+1, slots+1, slots: a drift of the machine's speed
			// weighs the same on each, and the rounds' spread shows how far one can be
			// trusted.
			rounds := 3
			if v, err := strconv.Atoi(os.Getenv("GATEWAY_BENCH_ROUNDS")); err == nil && v > 0 {
				rounds = v
			}
			var rate, overRate, cpu, overCPU float64
			var overRefused int64
			var ratios []float64
			for range rounds {
				r1, c1, f1 := run(slots)
				o1, oc1, of1 := run(slots + 1)
				o2, oc2, of2 := run(slots + 1)
				r2, c2, f2 := run(slots)
				require.Zero(b, f1+f2, "crawlers refused with exactly as many crawlers as slots")
				rate, overRate, cpu, overCPU = rate+r1+r2, overRate+o1+o2, cpu+c1+c2, overCPU+oc1+oc2
				overRefused += of1 + of2
				ratios = append(ratios, (o1+o2)/(r1+r2))
			}
			n := float64(2 * rounds)
			rate, overRate, cpu, overCPU = rate/n, overRate/n, cpu/n, overCPU/n
			b.ReportMetric(rate, "slots-fetches/s")
			b.ReportMetric(overRate, "over-fetches/s")
			b.ReportMetric(overRate/rate, "ratio")
			b.ReportMetric(slices.Min(ratios), "ratio-min")
			b.ReportMetric(cpu, "slots-gateway-cpu")
			b.ReportMetric(overCPU, "over-gateway-cpu")
			b.ReportMetric(float64(overRefused), "over-refused")
			b.Logf("%s: %d crawlers %.0f fetches/s (gateway CPU %.2f cores), %d crawlers %.0f fetches/s "+
				"(gateway CPU %.2f cores, %d fetches refused after waiting): %.3f of the served rate (rounds %.3f), the waiting one costs %.3f cores",
				tc.name, slots, rate, cpu, slots+1, overRate, overCPU, overRefused, overRate/rate, ratios, overCPU-cpu)
		})
	}
}

// procCPU is the CPU time (user and system) process pid has used so far.
func procCPU(b testing.TB, pid int) time.Duration {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	require.NoError(b, err)
	// The fields after the command name, which is in parentheses and may hold spaces:
	// utime and stime are the 14th and 15th of the line, in clock ticks (100 a second
	// on Linux for this file, whatever the kernel's own tick).
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	utime, err := strconv.ParseInt(fields[11], 10, 64)
	require.NoError(b, err)
	stime, err := strconv.ParseInt(fields[12], 10, 64)
	require.NoError(b, err)
	return time.Duration(utime+stime) * (time.Second / 100)
}
