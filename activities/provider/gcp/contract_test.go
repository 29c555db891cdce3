package gcp

import (
	"testing"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp/gcptest"
	"github.com/proxyfleet/proxyfleet/activities/provider/providertest"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestContract: the gcp provider passes the contract every provider passes, against the
// fake Compute Engine API; a VM boots when the harness moves it to RUNNING with an address.
func TestContract(t *testing.T) {
	var srv *gcptest.Server
	providertest.Run(t, providertest.Harness{
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderGCP, GCP: minimalSpec()},
		New: func(t *testing.T) provider.Provider {
			var p *Provider
			p, srv = newTestProvider(t)
			return p
		},
		Advance: func(t *testing.T, name string) {
			for _, in := range srv.Instances() {
				if in.Name == name && in.Status != "RUNNING" && in.Status != "STOPPING" && in.Status != "TERMINATED" {
					srv.SetStatus(name, "RUNNING")
					srv.SetNatIP(name, "203.0.113.9")
				}
			}
		},
		Instances: func(*testing.T) int { return len(srv.Instances()) },
	})
}
