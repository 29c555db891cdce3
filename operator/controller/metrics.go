package controller

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// workflowRestarts counts workflows the resync found stopped and started again. It is
// process-wide, like controller-runtime's own metrics, and registered by Run alone, so
// tests that build several managers in one process never register it twice. Any increase
// deserves a look: a run should never stop while its Proxy lives.
var workflowRestarts = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "proxyfleet_operator_workflow_restarts_total",
	Help: "ProxyWorkflows the operator's resync found not running while their Proxy lived, and started again.",
})

// ProxyCollector reads the Proxies from the manager's cache at scrape time. Counting at
// scrape time cannot drift the way counters updated by reconciles do, and a deleted Proxy's
// series simply stops being reported.
type ProxyCollector struct {
	Reader ctrlclient.Reader
}

var (
	proxiesDesc = prometheus.NewDesc("proxyfleet_proxies", "Proxies by phase.", []string{"phase"}, nil)
	infoDesc    = prometheus.NewDesc("proxyfleet_proxy_info", "One series per Proxy (value 1) with its phase and provider.",
		[]string{"namespace", "name", "phase", "provider"}, nil)
	quotaDesc = prometheus.NewDesc("proxyfleet_proxies_quota_exceeded", "Proxies whose provider refuses for quota (condition QuotaExceeded=True).", nil, nil)
	phases    = []v1alpha1.Phase{v1alpha1.PhasePending, v1alpha1.PhaseProvisioning, v1alpha1.PhaseReady, v1alpha1.PhaseUnhealthy,
		v1alpha1.PhaseReplacing, v1alpha1.PhaseDeleting, v1alpha1.PhaseFailed}
)

// Describe implements prometheus.Collector.
func (c ProxyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- proxiesDesc
	ch <- infoDesc
	ch <- quotaDesc
}

// Collect implements prometheus.Collector.
func (c ProxyCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var list v1alpha1.ProxyList
	if err := c.Reader.List(ctx, &list); err != nil {
		ch <- prometheus.NewInvalidMetric(proxiesDesc, err)
		return
	}
	counts := map[v1alpha1.Phase]int{}
	quota := 0
	for _, p := range list.Items {
		phase := p.Status.Phase
		if phase == "" {
			phase = v1alpha1.PhasePending
		}
		counts[phase]++
		ch <- prometheus.MustNewConstMetric(infoDesc, prometheus.GaugeValue, 1, p.Namespace, p.Name, string(phase), p.Spec.ProviderLabel())
		if meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionQuotaExceeded) {
			quota++
		}
	}
	for _, ph := range phases {
		ch <- prometheus.MustNewConstMetric(proxiesDesc, prometheus.GaugeValue, float64(counts[ph]), string(ph))
	}
	ch <- prometheus.MustNewConstMetric(quotaDesc, prometheus.GaugeValue, float64(quota))
}
