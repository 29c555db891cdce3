package observability

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/discovery"
	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// freeAddr is a loopback address for a process the test starts.
func freeAddr(t *testing.T) string { return testenv.FreeAddr(t) }

// process runs one of the project's binaries for the test and stops it at the end.
func process(t *testing.T, name string, env []string, args ...string) {
	t.Helper()
	require.NoError(t, testenv.LoggedProcess(t, name, testenv.Command(t, name), env, args...).Start())
}

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return fams
}

// lint runs promtool's metrics linter over an endpoint's exposition and returns what it
// found, one line per problem.
func lint(t *testing.T, addr string) []string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	problems, err := promlint.New(resp.Body).Lint()
	require.NoError(t, err)
	var out []string
	for _, p := range problems {
		out = append(out, p.Metric+": "+p.Text)
	}
	return out
}

// value sums the series of a family whose labels include every pair in match.
func value(fams map[string]*dto.MetricFamily, name string, match map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
	total, found := 0.0, false
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		matches := true
		for k, v := range match {
			if labels[k] != v {
				matches = false
			}
		}
		if !matches {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		case m.Untyped != nil:
			total += m.Untyped.GetValue()
		}
	}
	return total, found
}

// TestEachBinaryExportsItsMetrics runs the operator, worker and discovery binaries against
// the real servers, does real work (provision, lease, report, sweep), scrapes each /metrics,
// and checks the documented series and that the dashboard and alerts use only exported names.
func TestEachBinaryExportsItsMetrics(t *testing.T) {
	s := stack.Start(t, stack.Options{NoWorker: true, NoController: true})
	ctx := context.Background()
	kubeconfig := s.Kube.Kubeconfig(t)
	opMetrics, workerHTTP, discoveryAddr, gatewayAddr := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	temporalFlags := []string{"--temporal-address", s.Temporal.HostPort, "--temporal-namespace", s.Temporal.Namespace,
		"--task-queue", s.TaskQueue, "--installation", s.Installation}
	env := []string{"KUBECONFIG=" + kubeconfig, "PROXYFLEET_FLEET_KEY=" + s.FleetKey}

	process(t, "operator", env, append(temporalFlags, "--metrics-bind-address", opMetrics, "--health-probe-bind-address", freeAddr(t))...)
	process(t, "worker", env, append(temporalFlags, "--providers", "local", "--local-daemon", s.DaemonURL, "--http-address", workerHTTP)...)
	process(t, "discovery", []string{"DISCOVERY_TOKEN=secret-token", "PROXYFLEET_FLEET_KEY=" + s.FleetKey}, "--temporal-address", s.Temporal.HostPort,
		"--temporal-namespace", s.Temporal.Namespace, "--listen", discoveryAddr, "--gateway-listen", gatewayAddr, "--refresh-interval", "200ms")
	h := s.Temporal.Client.ScheduleClient().GetHandle(ctx, contract.GCScheduleID)
	t.Cleanup(func() { _ = h.Delete(context.Background()) })

	ns := s.Namespace(t)
	require.NoError(t, s.Kube.Client.Create(ctx, stack.Tagged(s.LocalProxy(ns, "measured"), ns)))
	p := s.WaitFor(t, ns, "measured", 2*time.Minute, "Ready", stack.Ready)

	// Leases: one granted, one refused.
	dc := dclient.New("http://"+discoveryAddr, "secret-token")
	var lease *dclient.Lease
	require.Eventually(t, func() bool {
		l, err := dc.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"run": ns}, Target: "shop.example"})
		lease = l
		return err == nil
	}, time.Minute, 100*time.Millisecond, "discovery never offered the proxy")
	_, err := dc.Acquire(ctx, dclient.AcquireRequest{Selector: map[string]string{"run": "nobody"}})
	require.True(t, dclient.IsNoMatch(err), "%v", err)
	require.NoError(t, dc.Report(ctx, lease.ID, dclient.ResultBanned, ""))
	require.NoError(t, dc.Release(ctx, lease.ID))
	// One request through the gateway, to the local proxies' own host.
	gw := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http",
		Host: gatewayAddr, User: url.UserPassword(discovery.DefaultClientName+";run="+ns, "secret-token")})}}
	resp, err := gw.Get(s.DaemonURL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// An orphan for the worker's own schedule to sweep.
	hoursAgo := time.Now().Add(-2 * time.Hour)
	_, err = s.Local.CreateRaw(ctx, "metrics-orphan", local.CreateRequest{CreatedAt: &hoursAgo,
		Auth: local.NewAuth(proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: "planted"}), Labels: map[string]string{
			provider.LabelProxyUID: "gone", provider.LabelInstallation: s.Installation, provider.LabelManagedBy: provider.ManagedByValue}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := h.Describe(ctx); return err == nil }, time.Minute, 100*time.Millisecond,
		"the worker never created the proxy-gc schedule")
	require.NoError(t, h.Trigger(ctx, client.ScheduleTriggerOptions{}))
	require.Eventually(t, func() bool { _, ok := s.Daemon.Get("metrics-orphan"); return !ok }, time.Minute, 100*time.Millisecond,
		"the scheduled sweep never deleted the orphan")

	var worker, operator, disc map[string]*dto.MetricFamily
	// A sweep's deletions are counted as they happen, its outcome and spared instances when
	// it ends (a local activity after the last delete): wait for the end.
	require.Eventually(t, func() bool {
		worker = scrape(t, workerHTTP)
		deleted, _ := value(worker, "proxyfleet_gc_deleted_total", map[string]string{"provider": "local"})
		runs, _ := value(worker, "proxyfleet_gc_runs_total", map[string]string{"outcome": "swept"})
		return deleted >= 1 && runs >= 1
	}, 30*time.Second, 200*time.Millisecond, "the sweep never showed in the worker's metrics")
	operator, disc = scrape(t, opMetrics), scrape(t, discoveryAddr)
	// Every endpoint passes the checks `promtool check metrics` makes (its linter): help
	// text everywhere, counters named _total and nothing else so.
	for _, addr := range []string{workerHTTP, opMetrics, discoveryAddr} {
		assert.Empty(t, lint(t, addr), "%s/metrics", addr)
	}

	positive := func(fams map[string]*dto.MetricFamily, name string, match map[string]string) {
		t.Helper()
		v, ok := value(fams, name, match)
		assert.True(t, ok, "series %s%v missing", name, match)
		assert.Positive(t, v, "series %s%v", name, match)
	}
	// Worker.
	positive(worker, "proxyfleet_provider_requests_total", map[string]string{"provider": "local", "op": "create", "result": "ok"})
	positive(worker, "proxyfleet_provider_request_duration_seconds", map[string]string{"provider": "local", "op": "create"})
	positive(worker, "proxyfleet_probe_duration_seconds", map[string]string{"outcome": "ok"})
	positive(worker, "proxyfleet_monitors_running", nil)
	positive(worker, "proxyfleet_gc_runs_total", map[string]string{"outcome": "swept"})
	positive(worker, "proxyfleet_gc_spared_total", map[string]string{"reason": workflows.GCReasonTooYoung})
	_, ok := value(worker, "proxyfleet_probe_failures_total", map[string]string{"kind": "refused"})
	assert.True(t, ok, "failure kinds are exported before any failure")
	sdk := 0
	for name := range worker {
		if strings.HasPrefix(name, "temporal_") {
			sdk++
		}
	}
	assert.Greater(t, sdk, 5, "Temporal SDK metrics missing")
	// Operator.
	positive(operator, "proxyfleet_proxies", map[string]string{"phase": "Ready"})
	positive(operator, "proxyfleet_proxy_info", map[string]string{"namespace": ns, "name": "measured", "phase": "Ready", "provider": "local"})
	positive(operator, "controller_runtime_reconcile_total", map[string]string{"controller": "proxy"})
	_, ok = value(operator, "proxyfleet_proxies_quota_exceeded", nil)
	assert.True(t, ok)
	// Discovery.
	positive(disc, "proxyfleet_discovery_lease_requests_total", map[string]string{"outcome": "granted"})
	positive(disc, "proxyfleet_discovery_lease_requests_total", map[string]string{"outcome": "no_match"})
	positive(disc, "proxyfleet_discovery_acquire_duration_seconds", nil)
	positive(disc, "proxyfleet_discovery_index_proxies", nil)
	positive(disc, "proxyfleet_discovery_cooldowns_active", nil)
	positive(disc, "proxyfleet_discovery_reports_total", map[string]string{"result": "banned"})
	positive(disc, "proxyfleet_gateway_requests_total", map[string]string{"kind": "http", "outcome": "ok"})
	age, ok := value(disc, "proxyfleet_discovery_index_age_seconds", nil)
	assert.True(t, ok && age >= 0 && age < 30, "index age %v", age)

	// The dashboard and the alert rules use only names the binaries export.
	exported := map[string]bool{}
	for _, fams := range []map[string]*dto.MetricFamily{worker, operator, disc} {
		for name := range fams {
			exported[name] = true
		}
	}
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	nameRE := regexp.MustCompile(`\b((?:proxyfleet|controller_runtime|temporal)_[a-z0-9_]+)\b`)
	for _, file := range []string{"deploy/monitoring/dashboard.json", "deploy/monitoring/alerts.yaml"} {
		raw, err := os.ReadFile(filepath.Join(root, file))
		require.NoError(t, err)
		names := nameRE.FindAllString(string(raw), -1)
		require.NotEmpty(t, names, file)
		for _, n := range names {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
			assert.True(t, exported[base], "%s uses %s, which no binary exports", file, n)
		}
	}

	// Deleting the Proxy removes its series.
	require.NoError(t, s.Kube.Client.Delete(ctx, p))
	s.WaitGone(t, ns, "measured", time.Minute)
	require.Eventually(t, func() bool {
		_, ok := value(scrape(t, opMetrics), "proxyfleet_proxy_info", map[string]string{"namespace": ns, "name": "measured"})
		return !ok
	}, 30*time.Second, 200*time.Millisecond, "a deleted Proxy's series stayed")
}
