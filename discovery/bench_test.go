package discovery_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	commonpb "go.temporal.io/api/common/v1"
	"go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
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
			st.Release("", l.ID)
			b.ResetTimer()
			i := 0
			for b.Loop() {
				l, err := st.Acquire(sel, targets[i%len(targets)], time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				st.Release("", l.ID)
				i++
			}
		})
		// With sessions: 1,000 sessions in turn, each placed once on the ring and then
		// found in the session table.
		b.Run(fmt.Sprintf("sessions/proxies=%d", n), func(b *testing.B) {
			st := benchFleet(n)
			sel := discovery.Selector{"region": "r1"}
			i := 0
			for b.Loop() {
				l, err := st.Lease(discovery.Want{Selector: sel, Session: fmt.Sprintf("s%d", i%1000), TTL: time.Minute})
				if err != nil {
					b.Fatal(err)
				}
				st.Release("", l.ID)
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
	srv := service.NewAPI(discovery.Config{Token: "t"}, st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
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

// staticLister answers every ListWorkflow with the same page, encoded once, so a benchmark
// of the refresher measures decoding rather than the test's encoding.
type staticLister struct {
	resp *workflowservice.ListWorkflowExecutionsResponse
}

func (l staticLister) ListWorkflow(context.Context, *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error) {
	return l.resp, nil
}

// benchMemos are n running ProxyWorkflows whose memos point to credentials as auth says:
// "none", "managed" (derived from kr) or "sealed" (sealed with kr for each Proxy).
func benchMemos(b *testing.B, n int, auth string, kr *proxyauth.Keyring) staticLister {
	b.Helper()
	dc := converter.GetDefaultDataConverter()
	updated, err := dc.ToPayload(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		b.Fatal(err)
	}
	resp := &workflowservice.ListWorkflowExecutionsResponse{}
	for i := range n {
		m := contract.ProxyMemo{Name: fmt.Sprintf("p-%06d", i), Namespace: "bench", UID: fmt.Sprintf("uid-%06d", i),
			Phase: contract.PhaseReady, Healthy: true, IP: "127.0.0.1", Port: int32(10000 + i%50000), MaxLeases: 4,
			LatencyMillis: int64(i % 97), Attributes: map[string]string{"region": fmt.Sprintf("r%d", i%4)}}
		switch auth {
		case "managed":
			m.Auth = &contract.ProxyAuth{KeyID: kr.PrimaryID(), Instance: fmt.Sprintf("pf-bench-%06d-1a2b3c", i)}
		case "sealed":
			sealed, err := kr.Seal(proxyauth.Credentials{Username: "ext", Password: fmt.Sprintf("external-password-%06d", i)}, m.UID)
			if err != nil {
				b.Fatal(err)
			}
			m.Auth = &contract.ProxyAuth{Sealed: sealed}
		}
		memo, err := dc.ToPayload(m)
		if err != nil {
			b.Fatal(err)
		}
		resp.Executions = append(resp.Executions, &workflowpb.WorkflowExecutionInfo{
			Execution:        &commonpb.WorkflowExecution{WorkflowId: contract.ProxyWorkflowID(m.Namespace, m.Name)},
			Status:           enums.WORKFLOW_EXECUTION_STATUS_RUNNING,
			Memo:             &commonpb.Memo{Fields: map[string]*commonpb.Payload{contract.MemoKey: memo}},
			SearchAttributes: &commonpb.SearchAttributes{IndexedFields: map[string]*commonpb.Payload{contract.SearchAttrUpdatedAt.GetName(): updated}},
		})
	}
	return staticLister{resp: resp}
}

// BenchmarkRefreshCredentials measures a full pass of the refresher over 1,000 memos, by
// how their proxies' credentials are resolved: none, Managed (derived, an HMAC per memo)
// and External (opened, AES-GCM per memo). Credentials are resolved here, once per memo
// read, so that a lease costs nothing extra (see BenchmarkLeaseCredentials).
//
//	go test ./discovery -run '^$' -bench RefreshCredentials
func BenchmarkRefreshCredentials(b *testing.B) {
	const n = 1000
	kr := benchKeyring(b)
	for _, auth := range []string{"none", "managed", "sealed"} {
		b.Run("auth="+auth, func(b *testing.B) {
			st, r := benchRefreshed(b, n, auth, kr)
			if s := st.Stats(); s.Healthy != n {
				b.Fatalf("%d of %d proxies leasable", s.Healthy, n)
			}
			b.ResetTimer()
			for b.Loop() {
				if err := r.Full(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/memo")
		})
	}
}

// benchRefreshed is a store loaded by a full refresh of n memos whose proxies take auth
// credentials ("none", "managed" or "sealed"), and the refresher that loaded it.
func benchRefreshed(b *testing.B, n int, auth string, kr *proxyauth.Keyring) (*discovery.Store, *temporal.Refresher) {
	b.Helper()
	st := discovery.NewStore(time.Hour)
	r := &temporal.Refresher{Client: benchMemos(b, n, auth, kr), Namespace: "bench", Store: st, Keyring: kr,
		Log: slog.New(slog.DiscardHandler)}
	if err := r.Full(b.Context()); err != nil {
		b.Fatal(err)
	}
	return st, r
}

// BenchmarkLeaseCredentials measures an acquire and a release through the API handler (no
// network) over 1,000 proxies loaded by the refresher, with Managed credentials and
// without: the difference is what carrying credentials in the answer costs, since they
// were resolved when the memos were read.
//
//	go test ./discovery -run '^$' -bench LeaseCredentials
func BenchmarkLeaseCredentials(b *testing.B) {
	const n = 1000
	kr := benchKeyring(b)
	for _, auth := range []string{"none", "managed"} {
		b.Run("auth="+auth, func(b *testing.B) {
			st, _ := benchRefreshed(b, n, auth, kr)
			srv := service.NewAPI(discovery.Config{Token: "t"}, st, nil, slog.New(slog.DiscardHandler), nil)
			h := srv.Handler()
			body := `{"selector":{"region":"r1"},"ttlSeconds":60,"target":"shop.example"}`
			pair := func() {
				rec := serve(h, http.MethodPost, "/v1/leases", body, "Bearer t")
				if rec.Code != http.StatusCreated {
					b.Fatalf("acquire: %d %s", rec.Code, rec.Body)
				}
				var l discovery.LeaseResponse
				if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
					b.Fatal(err)
				}
				if (auth == "managed") != (l.Proxy.Password != "" && strings.Contains(l.Proxy.URL, "@")) {
					b.Fatalf("auth=%s but the answer's proxy is %v", auth, l.Proxy)
				}
				if rec := serve(h, http.MethodDelete, "/v1/leases/"+l.LeaseID, "", "Bearer t"); rec.Code != http.StatusNoContent {
					b.Fatalf("release: %d", rec.Code)
				}
			}
			pair() // warms the selector's view, as a running server's would be
			b.ResetTimer()
			for b.Loop() {
				pair()
			}
		})
	}
}

// BenchmarkDeriveManaged is what deriving a Managed proxy's credentials costs, which a
// lease would pay if they were derived per lease instead of per memo read.
//
//	go test ./discovery -run '^$' -bench DeriveManaged
func BenchmarkDeriveManaged(b *testing.B) {
	kr := benchKeyring(b)
	for b.Loop() {
		if _, err := kr.Managed(kr.PrimaryID(), "pf-bench-000001-1a2b3c"); err != nil {
			b.Fatal(err)
		}
	}
}

func benchKeyring(b *testing.B) *proxyauth.Keyring {
	b.Helper()
	kr, err := proxyauth.Parse(strings.Repeat("A", 43) + "=")
	if err != nil {
		b.Fatal(err)
	}
	return kr
}

// BenchmarkRotationSpread leases per request as rotating-proxy crawlers do: 1,000
// sequential acquire+release pairs for one target over 100 idle proxies. It reports the
// most and fewest uses of a proxy and their ratio (goal ≤ 1.5; an even split is 1.0).
//
//	go test ./discovery -run '^$' -bench RotationSpread -benchtime 1x
func BenchmarkRotationSpread(b *testing.B) {
	for b.Loop() {
		st := benchFleet(100)
		uses := map[string]int{}
		for range 1000 {
			l, err := st.Acquire(nil, "shop.example", time.Minute)
			if err != nil {
				b.Fatal(err)
			}
			st.Release("", l.ID)
			uses[l.ProxyID]++
		}
		lo, hi := 1000, 0
		for _, n := range uses {
			lo, hi = min(lo, n), max(hi, n)
		}
		if len(uses) < 100 {
			lo = 0
		}
		b.ReportMetric(float64(hi), "max-uses")
		b.ReportMetric(float64(lo), "min-uses")
		b.ReportMetric(float64(hi)/float64(max(lo, 1)), "max/min")
	}
}

// BenchmarkBoundedMemory drives acquire+report+release cycles through the API handler,
// each report on a target no other cycle used, at 10,000 proxies, and reports the live
// heap after a GC: with the index alone (the baseline), after 100,000 cycles, after
// 1,000,000 (the goal: under 64 MiB) and after 2,000,000 (the goal: no growth from the
// millionth cycle on). The tables fill up within the first 100,000 cycles; Go's maps
// under constant churn settle a little later, so flatness is measured over the second
// million.
//
//	go test ./discovery -run '^$' -bench BoundedMemory -benchtime 1x -timeout 30m
func BenchmarkBoundedMemory(b *testing.B) {
	heap := func() float64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return float64(m.HeapAlloc) / (1 << 20)
	}
	for b.Loop() {
		st := benchFleet(10_000)
		srv := service.NewAPI(discovery.Config{Token: "t"}, st, nil, slog.New(slog.DiscardHandler), nil)
		h := srv.Handler()
		base := heap()
		do := func(method, path, body string) *httptest.ResponseRecorder {
			req := httptest.NewRequest(method, path, strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer t")
			req.Header.Set("Content-Type", "application/json")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			return rec
		}
		var warm, million float64
		for i := range 2_000_000 {
			rec := do(http.MethodPost, "/v1/leases", `{"ttlSeconds":60}`)
			if rec.Code != http.StatusCreated {
				b.Fatalf("acquire: %d %s", rec.Code, rec.Body)
			}
			var l discovery.LeaseResponse
			if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
				b.Fatal(err)
			}
			rec = do(http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", fmt.Sprintf(`{"result":"banned","target":"t%07d.example"}`, i))
			if rec.Code != http.StatusNoContent {
				b.Fatalf("report: %d %s", rec.Code, rec.Body)
			}
			do(http.MethodDelete, "/v1/leases/"+l.LeaseID, "")
			switch i + 1 {
			case 100_000:
				warm = heap()
			case 1_000_000:
				million = heap()
			}
		}
		end := heap()
		b.ReportMetric(base, "heap-index-MiB")
		b.ReportMetric(warm, "heap-100k-MiB")
		b.ReportMetric(million, "heap-1M-MiB")
		b.ReportMetric(end, "heap-2M-MiB")
		b.ReportMetric(end-million, "growth-1M-to-2M-MiB")
	}
}
