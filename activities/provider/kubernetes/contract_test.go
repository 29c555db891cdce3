package kubernetes

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/providertest"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestContract: the kubernetes provider passes the contract every provider passes, on a
// real API server, with the harness playing the kubelet.
func TestContract(t *testing.T) {
	var f *fixture
	providertest.Run(t, providertest.Harness{
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderKubernetes, Kubernetes: &v1alpha1.KubernetesSpec{}},
		New: func(t *testing.T) provider.Provider {
			f = newFixture(t)
			return f.p
		},
		Shape: func(r *provider.CreateRequest) { r.Namespace = f.ns },
		Advance: func(t *testing.T, name string) {
			var pod corev1.Pod
			err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: name}, &pod)
			if apierrors.IsNotFound(err) {
				return
			}
			require.NoError(t, err)
			if pod.DeletionTimestamp == nil && pod.Status.Phase != corev1.PodRunning {
				f.setStatus(f.ns+"/"+name, corev1.PodRunning, "10.1.2.3", corev1.ConditionTrue)
			}
		},
		Instances: func(t *testing.T) int {
			var pods corev1.PodList
			require.NoError(t, f.c.List(f.ctx, &pods, client.InNamespace(f.ns)))
			n := 0
			for _, p := range pods.Items {
				if p.DeletionTimestamp == nil {
					n++
				}
			}
			return n
		},
	})
}
