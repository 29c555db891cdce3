package discovery_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/proxyfleet/proxyfleet/discovery"
)

// benchFleet fills a store with n healthy proxies over 4 regions and 8 countries, in one
// full pass, so the server serves them (it refuses until a full pass has loaded the index).
func benchFleet(n int) *discovery.Store {
	st := discovery.NewStore(time.Hour)
	ps := make([]discovery.Proxy, 0, n)
	for i := range n {
		ps = append(ps, discovery.Proxy{
			Name: fmt.Sprintf("p-%06d", i), Namespace: "bench", IP: "127.0.0.1", Port: int32(10000 + i%50000),
			Attributes: map[string]string{
				"region":  fmt.Sprintf("r%d", i%4),
				"country": fmt.Sprintf("c%d", i%8),
			},
			LatencyMillis: int64(i % 97), Healthy: true, Phase: "Ready", MaxLeases: 4,
		})
	}
	st.ReplaceAll(ps)
	return st
}

// BenchmarkAcquireRelease measures one acquire+release pair in process as the fleet grows.
// The cost must stay flat: 100 → 100,000 proxies within 3x.
//
//	go test ./discovery -run '^$' -bench AcquireRelease
func BenchmarkAcquireRelease(b *testing.B) {
	for _, n := range []int{100, 1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("proxies=%d", n), func(b *testing.B) {
			st := benchFleet(n)
			sel := discovery.Selector{"region": "r1"}
			targets := []string{"a.example", "b.example", "c.example", ""}
			// Warm the selector's view, as a running server's would be.
			l, err := st.Acquire(sel, "", time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			st.Release(l.ID)
			b.ResetTimer()
			i := 0
			for b.Loop() {
				l, err := st.Acquire(sel, targets[i%len(targets)], time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				st.Release(l.ID)
				i++
			}
		})
	}
}

// BenchmarkHTTPAcquireRelease runs 64 concurrent clients doing acquire+release pairs through
// the real HTTP server with 10,000 proxies in the index, and a no-op Gin route with the
// same clients in the same run as the baseline. It reports pairs/s, the ratio of requests/s
// to the baseline's, and the p99 acquire latency.
//
//	go test ./discovery -run '^$' -bench HTTPAcquireRelease -benchtime 20000x
func BenchmarkHTTPAcquireRelease(b *testing.B) {
	const clients = 64
	st := benchFleet(10_000)
	srv := discovery.NewServer(discovery.Config{Token: "t"}, st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	api := httptest.NewServer(srv.Handler())
	defer api.Close()
	gin.SetMode(gin.ReleaseMode)
	noop := gin.New()
	noop.POST("/noop", func(c *gin.Context) { c.Status(http.StatusNoContent) })
	base := httptest.NewServer(noop)
	defer base.Close()

	transport := &http.Transport{MaxIdleConns: clients * 2, MaxIdleConnsPerHost: clients * 2}
	hc := &http.Client{Transport: transport}
	body, _ := json.Marshal(map[string]any{"selector": map[string]string{"region": "r2"}, "ttlSeconds": 60, "target": "shop.example"})

	run := func(n int, one func() (time.Duration, error)) (time.Duration, []time.Duration) {
		var next atomic.Int64
		lat := make([][]time.Duration, clients)
		var wg sync.WaitGroup
		start := time.Now()
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(n) {
					d, err := one()
					if err != nil {
						b.Error(err)
						return
					}
					lat[c] = append(lat[c], d)
				}
			}()
		}
		wg.Wait()
		var all []time.Duration
		for _, l := range lat {
			all = append(all, l...)
		}
		return time.Since(start), all
	}
	post := func(url string, body []byte) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer t")
		return hc.Do(req)
	}
	pair := func() (time.Duration, error) {
		t0 := time.Now()
		resp, err := post(api.URL+"/v1/leases", body)
		if err != nil {
			return 0, err
		}
		var l struct{ LeaseID string }
		err = json.NewDecoder(resp.Body).Decode(&l)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated {
			return 0, fmt.Errorf("acquire: %d %v", resp.StatusCode, err)
		}
		acquire := time.Since(t0)
		req, _ := http.NewRequest(http.MethodDelete, api.URL+"/v1/leases/"+l.LeaseID, nil)
		req.Header.Set("Authorization", "Bearer t")
		resp, err = hc.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return acquire, nil
	}
	noopReq := func() (time.Duration, error) {
		t0 := time.Now()
		resp, err := post(base.URL+"/noop", body)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return time.Since(t0), nil
	}

	n := max(b.N, 2000)
	b.ResetTimer()
	baseTook, _ := run(2*n, noopReq) // a pair is two requests
	took, lat := run(n, pair)
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pairsPerSec := float64(n) / took.Seconds()
	baseReqPerSec := float64(2*n) / baseTook.Seconds()
	b.ReportMetric(pairsPerSec, "pairs/s")
	b.ReportMetric(baseReqPerSec, "noop-req/s")
	b.ReportMetric(2*pairsPerSec/baseReqPerSec, "ratio")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-acquire-ms")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-acquire-ms")
}
