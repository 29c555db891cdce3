package kubernetes

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func TestAllowCheck(t *testing.T) {
	tests := []struct {
		name      string
		allow     Allow
		namespace string // spec.kubernetes.namespace; the Proxy's is "proxies"
		image     string // spec.kubernetes.image
		// flag is the flag a refusal names; empty when allowed.
		flag string
	}{
		{name: "defaults"},
		{name: "the Proxy's own namespace, named", namespace: "proxies"},
		{name: "the default image, named", image: v1alpha1.DefaultSquidImage},
		{name: "another namespace", namespace: "egress", flag: FlagAllowedNamespaces},
		{name: "another namespace, others listed", allow: Allow{Namespaces: []string{"crawl", "egressive"}}, namespace: "egress", flag: FlagAllowedNamespaces},
		{name: "another namespace, listed", allow: Allow{Namespaces: []string{"crawl", "egress"}}, namespace: "egress"},
		{name: "another namespace, any", allow: Allow{Namespaces: []string{"*"}}, namespace: "egress"},
		{name: "another image", image: "registry.example/squid:7", flag: FlagAllowedImages},
		{
			// Listing images replaces the default rather than adding to it.
			name: "the default image, others listed", allow: Allow{Images: []string{"registry.example/squid:7"}},
			flag: FlagAllowedImages,
		},
		{name: "image listed exactly", allow: Allow{Images: []string{"registry.example/squid:6", "registry.example/squid:7"}}, image: "registry.example/squid:7"},
		{name: "image not listed exactly", allow: Allow{Images: []string{"registry.example/squid:7"}}, image: "registry.example/squid:77", flag: FlagAllowedImages},
		{name: "image under a prefix", allow: Allow{Images: []string{"registry.example/squid:*"}}, image: "registry.example/squid:7"},
		{name: "image beside a prefix", allow: Allow{Images: []string{"registry.example/squid:*"}}, image: "registry.example/squid-debug:7", flag: FlagAllowedImages},
		{
			// "*" only counts at the end; elsewhere it is part of an exact reference.
			name: "star inside an entry", allow: Allow{Images: []string{"registry.example/*:7"}}, image: "registry.example/squid:7",
			flag: FlagAllowedImages,
		},
		{name: "any image", allow: Allow{Images: []string{"*"}}, image: "registry.example/squid:7"},
		{
			// The namespace is refused first: both flags would have to change.
			name: "another namespace and image", namespace: "egress", image: "registry.example/squid:7",
			flag: FlagAllowedNamespaces,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := baseRequest()
			req.Spec.Kubernetes.Namespace, req.Spec.Kubernetes.Image = tc.namespace, tc.image
			err := tc.allow.check(req)
			if tc.flag == "" {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err), "the worker's settings or the spec must change")
			assert.Contains(t, err.Error(), tc.flag)
		})
	}
}

// TestCreateHonoursTheAllowlists: a refusal is permanent, names the flag that would allow
// it, and leaves nothing in the cluster.
func TestCreateHonoursTheAllowlists(t *testing.T) {
	tests := []struct {
		name string
		// allow is the worker's setting, given the namespace the pod goes to; nil is none.
		allow func(podNamespace string) Allow
		// otherNamespace puts the pod in a namespace of its own, not the Proxy's.
		otherNamespace bool
		image          string
		flag           string // empty when allowed
	}{
		{name: "defaults"},
		{name: "another namespace", otherNamespace: true, flag: FlagAllowedNamespaces},
		{
			name: "another namespace, listed", otherNamespace: true,
			allow: func(ns string) Allow { return Allow{Namespaces: []string{"crawl", ns}} },
		},
		{
			name: "another namespace, any", otherNamespace: true,
			allow: func(string) Allow { return Allow{Namespaces: []string{"*"}} },
		},
		{name: "another image", image: "registry.example/squid:7", flag: FlagAllowedImages},
		{
			name: "image listed exactly", image: "registry.example/squid:7",
			allow: func(string) Allow { return Allow{Images: []string{"registry.example/squid:7"}} },
		},
		{
			name: "image under a prefix", image: "registry.example/squid:7",
			allow: func(string) Allow { return Allow{Images: []string{"registry.example/*"}} },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			req := f.request("px-allow-0")
			ns := f.ns
			if tc.otherNamespace {
				ns = f.namespace()
				req.Spec.Kubernetes.Namespace = ns
			}
			req.Spec.Kubernetes.Image = tc.image
			if tc.allow != nil {
				f.p.Allow = tc.allow(ns)
			}

			inst, err := f.p.Create(f.ctx, req)
			if tc.flag == "" {
				require.NoError(t, err)
				assert.Equal(t, ns+"/px-allow-0", inst.ProviderID)
				assert.Equal(t, podImage(req), f.pod(inst.ProviderID).Spec.Containers[0].Image)
				return
			}
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), tc.flag)
			f.assertNothingIn(ns)
		})
	}
}

// assertNothingIn checks that namespace holds no pod, Secret or NetworkPolicy.
func (f *fixture) assertNothingIn(namespace string) {
	f.t.Helper()
	var pods corev1.PodList
	require.NoError(f.t, f.c.List(f.ctx, &pods, client.InNamespace(namespace)))
	assert.Empty(f.t, pods.Items)
	var secrets corev1.SecretList
	require.NoError(f.t, f.c.List(f.ctx, &secrets, client.InNamespace(namespace)))
	assert.Empty(f.t, secrets.Items)
	var policies networkingv1.NetworkPolicyList
	require.NoError(f.t, f.c.List(f.ctx, &policies, client.InNamespace(namespace)))
	assert.Empty(f.t, policies.Items)
}
