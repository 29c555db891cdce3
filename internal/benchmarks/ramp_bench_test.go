// What sizing a pool by demand saves, and what it costs the crawlers: BenchmarkPoolRamp
// ramps crawlers 0 → 40 → 0 through the gateway against an autoscaled pool of 0..12 and
// reports the waits and the instance-seconds used, against a static pool sized for the
// peak over the same run. Feeds docs/benchmarks.md (## Pools sized by demand).

package benchmarks

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/operator/controller"
)

// BenchmarkPoolRamp starts crawlers one every RAMP_STEP (default 500ms) up to 40, keeps
// them RAMP_HOLD (default 30s), stops one every RAMP_STEP/2, and waits for the pool (0..12
// proxies of maxLeases 4, target 80%, scaleDownDelay RAMP_DELAY, default 30s; the
// autoscaler looks every 5s, as in production) to give its last instance back. Each
// crawler fetches a page that takes 200ms, through the gateway, one after another.
//
//	go test ./internal/benchmarks -run '^$' -bench PoolRamp -benchtime 1x -timeout 20m
func BenchmarkPoolRamp(b *testing.B) {
	const (
		peak = 40
		most = 12
	)
	step := envDuration(b, "RAMP_STEP", 500*time.Millisecond)
	hold := envDuration(b, "RAMP_HOLD", 30*time.Second)
	delay := envDuration(b, "RAMP_DELAY", 30*time.Second)
	s := stack.Start(b, stack.Options{})
	d := s.StartDiscovery(b)
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(200 * time.Millisecond):
		case <-r.Context().Done():
		}
		_, _ = w.Write([]byte("page\n"))
	}))
	b.Cleanup(site.Close)

	for b.Loop() {
		ns := s.Namespace(b)
		s.StartAutoscaler(b, d, ns, controller.DefaultAutoscaleInterval)
		tmpl := stack.Tagged(s.LocalProxy(ns, "template"), ns)
		pool := &v1alpha1.ProxyPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ramp"},
			Spec: v1alpha1.ProxyPoolSpec{
				Replicas: ptr.To(int32(0)),
				Template: v1alpha1.ProxyTemplate{Spec: tmpl.Spec},
				Autoscale: &v1alpha1.PoolAutoscale{MinReplicas: ptr.To(int32(0)), MaxReplicas: most, TargetUtilization: 80,
					ScaleDownDelay: v1alpha1.Duration(delay.String())},
			},
		}
		require.NoError(b, s.Kube.Client.Create(context.Background(), pool))

		// The instances live, sampled every 100ms: what the pool costs.
		var (
			mu      sync.Mutex
			samples []sample
		)
		sampleCtx, stopSampling := context.WithCancel(context.Background())
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				n := len(s.Daemon.List(map[string]string{}))
				mu.Lock()
				samples = append(samples, sample{time.Now(), n})
				mu.Unlock()
				select {
				case <-sampleCtx.Done():
					return
				case <-t.C:
				}
			}
		}()

		gw := &url.URL{Scheme: "http", User: url.UserPassword(discovery.DefaultClientName+";run="+ns, d.Token), Host: d.GatewayAddr}
		var ok, failed atomic.Int64
		var firstOK atomic.Int64 // unix nanoseconds of the first 200
		start := time.Now()
		var crawlers sync.WaitGroup
		stops := make([]context.CancelFunc, 0, peak)
		for i := range peak {
			ctx, stop := context.WithCancel(context.Background())
			stops = append(stops, stop)
			crawlers.Go(func() {
				hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(gw)}, Timeout: 3 * time.Minute}
				defer hc.CloseIdleConnections()
				for ctx.Err() == nil {
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, site.URL+"/page", nil)
					resp, err := hc.Do(req)
					if ctx.Err() != nil {
						return // stopped mid-request: not the fleet's failure
					}
					if err != nil || resp.StatusCode != http.StatusOK {
						failed.Add(1)
						if err == nil {
							resp.Body.Close()
						}
						continue
					}
					resp.Body.Close()
					ok.Add(1)
					firstOK.CompareAndSwap(0, time.Now().UnixNano())
				}
			})
			if i < peak-1 {
				time.Sleep(step) // the ramp's own pace, not a wait for anything
			}
		}
		peakAt := time.Now()
		time.Sleep(hold) // the load held at its peak
		for _, stop := range stops {
			stop()
			time.Sleep(step / 2)
		}
		crawlers.Wait()
		quietAt := time.Now()
		require.Eventually(b, func() bool { return len(s.Daemon.List(map[string]string{})) == 0 }, delay+5*time.Minute, 200*time.Millisecond,
			"the idle pool gives its instances back")
		end := time.Now()
		stopSampling()
		<-sampled

		mu.Lock()
		used, reachedPeak := 0.0, time.Time{}
		for i := 1; i < len(samples); i++ {
			used += float64(samples[i-1].live) * samples[i].at.Sub(samples[i-1].at).Seconds()
			if reachedPeak.IsZero() && samples[i].live >= most {
				reachedPeak = samples[i].at
			}
		}
		mu.Unlock()
		static := float64(most) * end.Sub(start).Seconds()
		b.ReportMetric(time.Unix(0, firstOK.Load()).Sub(start).Seconds(), "s-first-200-from-zero")
		if !reachedPeak.IsZero() {
			b.ReportMetric(reachedPeak.Sub(start).Seconds(), "s-to-12-instances")
		}
		b.ReportMetric(peakAt.Sub(start).Seconds(), "s-ramp-up")
		b.ReportMetric(end.Sub(quietAt).Seconds(), "s-last-crawler-to-zero")
		b.ReportMetric(float64(ok.Load()), "pages")
		b.ReportMetric(float64(failed.Load()), "failed")
		b.ReportMetric(used, "instance-s")
		b.ReportMetric(static, "instance-s-static-12")
		b.ReportMetric(used/static, "used/static")
	}
}

type sample struct {
	at   time.Time
	live int
}
