package discovery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/discovery/temporal/temporaltest"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestReportsCoalesce: crawlers that report every failed request send one signal per
// cooldown, not one per request. A different result, a different target, a cooldown that
// has ended and a replacement (a new address) each get their own.
func TestReportsCoalesce(t *testing.T) {
	p := proxy("only", 1, true, nil)
	p.MaxLeases = 10
	h := newHarness(t, defaultConfig(), p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.srv.RunReports(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	report := func(lease, result, target string) {
		t.Helper()
		rec := h.do(http.MethodPost, "/v1/leases/"+lease+"/report", fmt.Sprintf(`{"result":%q,"target":%q}`, result, target))
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	}
	expect := func(want ...string) {
		t.Helper()
		var got []string
		for range want {
			select {
			case f := <-h.signals:
				got = append(got, f.sig.Result+" "+f.sig.Target)
			case <-time.After(10 * time.Second):
				t.Fatalf("signals so far %v, want %v", got, want)
			}
		}
		assert.ElementsMatch(t, want, got)
		select {
		case f := <-h.signals:
			t.Fatalf("unexpected signal %+v", f.sig)
		case <-time.After(50 * time.Millisecond):
		}
	}

	l := h.acquire(`{}`)
	for range 50 {
		report(l.LeaseID, contract.ReportBanned, "shop.example")
	}
	report(l.LeaseID, contract.ReportRateLimited, "shop.example")
	report(l.LeaseID, contract.ReportBanned, "news.example")
	expect("banned shop.example", "rate_limited shop.example", "banned news.example")

	rec := h.doAuth(http.MethodGet, "/metrics", "", "")
	assert.Contains(t, rec.Body.String(), "proxyfleet_discovery_reports_coalesced_total 49")

	h.clock.Advance(31 * time.Minute) // the ban cooldown has ended
	l2 := h.acquire(`{}`)
	report(l2.LeaseID, contract.ReportBanned, "shop.example")
	expect("banned shop.example")

	// The proxy was replaced: a new address starts without cooldowns in its workflow.
	moved := p
	moved.IP = "10.9.9.9"
	h.store.ReplaceAll([]discovery.Proxy{moved})
	l3 := h.acquire(`{}`)
	report(l3.LeaseID, contract.ReportBanned, "shop.example")
	expect("banned shop.example")
}

// TestFailedSignalIsNotCoalesced: a report whose signal did not get through does not hold
// back the next one.
func TestFailedSignalIsNotCoalesced(t *testing.T) {
	h := newHarness(t, defaultConfig(), proxy("only", 1, true, nil))
	var mu sync.Mutex
	calls := 0
	sig := &fakeSignaler{report: func(ctx context.Context, _, _ string, s contract.ReportSignal) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls <= 5 {
			return fmt.Errorf("temporal unavailable")
		}
		return nil
	}}
	h.srv = service.NewAPI(defaultConfig(), h.store, sig, slog.New(slog.DiscardHandler), nil)
	h.handler = h.srv.Handler()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.srv.RunReports(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	l := h.acquire(`{}`)
	path := "/v1/leases/" + l.LeaseID + "/report"
	require.Equal(t, http.StatusNoContent, h.do(http.MethodPost, path, `{"result":"banned","target":"a.example"}`).Code)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return calls == 5 }, 30*time.Second, 10*time.Millisecond,
		"five attempts, all failed")
	require.Equal(t, http.StatusNoContent, h.do(http.MethodPost, path, `{"result":"banned","target":"a.example"}`).Code)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return calls == 6 }, 10*time.Second, 10*time.Millisecond,
		"the next report was signalled")
}

// slowTemporal is a Temporal whose index has one proxy and whose signals take a while.
type slowTemporal struct {
	temporaltest.Scripted
	delay time.Duration

	mu        sync.Mutex
	delivered []string
}

func (s *slowTemporal) SignalWorkflow(ctx context.Context, workflowID, _, _ string, arg any) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(s.delay):
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delivered = append(s.delivered, arg.(contract.ReportSignal).Target)
	return nil
}

// TestShutdownDrainsReports: a discovery told to stop while reports are still queued
// forwards them before it returns, so a rollout loses no durable cooldown.
func TestShutdownDrainsReports(t *testing.T) {
	tc := &slowTemporal{delay: 20 * time.Millisecond}
	memo := temporaltest.ReadyMemo("p")
	memo.MaxLeases = 100
	tc.Set(temporaltest.Run{Memo: memo, Status: enums.WORKFLOW_EXECUTION_STATUS_RUNNING, Updated: time.Now()})
	svc := service.New(service.Config{API: defaultConfig(), Namespace: "default",
		RefreshInterval: time.Hour, FullResyncInterval: time.Hour}, tc, slog.New(slog.DiscardHandler), nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- svc.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	require.Eventually(t, svc.Store.Loaded, 10*time.Second, 5*time.Millisecond)

	post := func(path, body string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp
	}
	resp := post("/v1/leases", `{}`)
	var lease discovery.LeaseResponse
	decodeJSON(t, resp, &lease)
	const n = 40
	for i := range n {
		resp := post("/v1/leases/"+lease.LeaseID+"/report", fmt.Sprintf(`{"result":"banned","target":"t%d.example"}`, i))
		require.Equal(t, http.StatusNoContent, resp.StatusCode)
		resp.Body.Close()
	}
	cancel() // ~0.8s of signals are still queued
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	tc.mu.Lock()
	defer tc.mu.Unlock()
	assert.Len(t, tc.delivered, n, "every queued report was forwarded before Serve returned")
}

func decodeJSON(t *testing.T, resp *http.Response, v any) {
	t.Helper()
	defer resp.Body.Close()
	require.Less(t, resp.StatusCode, 300)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(v))
}
