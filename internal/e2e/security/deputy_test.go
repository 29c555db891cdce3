package security

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestWorkerRefusesNamespacesAndImagesOffItsAllowlist: a user who may create Proxies asks
// the worker, through the real controller and workflow, for a Squid pod in another
// namespace and for an image of their own. Both Proxies go Failed with a message naming
// the worker flag that would allow them, and no pod is created.
func TestWorkerRefusesNamespacesAndImagesOffItsAllowlist(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)
	other := s.Namespace(t)

	kube := func(name string, edit func(*v1alpha1.KubernetesSpec)) *v1alpha1.Proxy {
		p := s.LocalProxy(ns, name)
		p.Spec.Provider, p.Spec.Local = v1alpha1.ProviderKubernetes, nil
		p.Spec.Kubernetes = &v1alpha1.KubernetesSpec{Image: v1alpha1.DefaultSquidImage}
		edit(p.Spec.Kubernetes)
		require.NoError(t, s.Kube.Client.Create(ctx, p))
		return p
	}
	kube("elsewhere", func(k *v1alpha1.KubernetesSpec) { k.Namespace = other })
	kube("own-image", func(k *v1alpha1.KubernetesSpec) { k.Image = "registry.example.com/anything:latest" })

	for name, flag := range map[string]string{"elsewhere": "--kubernetes-allowed-namespaces", "own-image": "--kubernetes-allowed-images"} {
		p := s.WaitFor(t, ns, name, time.Minute, "Failed", func(p *v1alpha1.Proxy) bool {
			return p.Status.Phase == v1alpha1.PhaseFailed
		})
		var messages []string
		for _, c := range p.Status.Conditions {
			messages = append(messages, c.Message)
		}
		assert.Contains(t, strings.Join(messages, "\n"), flag, "%s: the status names the flag that allows it", name)
		ready := meta.FindStatusCondition(p.Status.Conditions, v1alpha1.ConditionReady)
		require.NotNil(t, ready)
		assert.Equal(t, "False", string(ready.Status))
	}
	for _, namespace := range []string{ns, other} {
		var pods corev1.PodList
		require.NoError(t, s.Kube.Client.List(ctx, &pods, client.InNamespace(namespace)))
		assert.Empty(t, pods.Items, "no pod was created in %s", namespace)
	}
}
