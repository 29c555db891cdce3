package local_test

import (
	"testing"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/providertest"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestContract: the local provider passes the contract every provider passes, against a
// real local proxy daemon.
func TestContract(t *testing.T) {
	var d *localproxy.Daemon
	providertest.Run(t, providertest.Harness{
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}},
		New: func(t *testing.T) provider.Provider {
			var p provider.Provider
			d, p = newDaemon(t)
			return p
		},
		Instances: func(*testing.T) int { return len(d.List(nil)) },
	})
}
