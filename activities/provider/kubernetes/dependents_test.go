package kubernetes

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// The Secret and the NetworkPolicy each instance's pod depends on. No garbage collector
// runs beside this API server, so whatever is removed here was removed by the provider.

// dependents are req's Secret and NetworkPolicy as the API server has them.
func (f *fixture) dependents(req provider.CreateRequest) (*corev1.Secret, *networkingv1.NetworkPolicy) {
	f.t.Helper()
	ns := podNamespace(req)
	var secret corev1.Secret
	require.NoError(f.t, f.c.Get(f.ctx, client.ObjectKey{Namespace: ns, Name: req.Name + "-squid"}, &secret))
	var policy networkingv1.NetworkPolicy
	require.NoError(f.t, f.c.Get(f.ctx, client.ObjectKey{Namespace: ns, Name: req.Name}, &policy))
	return &secret, &policy
}

// assertNoDependents checks that req's Secret and NetworkPolicy do not exist.
func (f *fixture) assertNoDependents(req provider.CreateRequest) {
	f.t.Helper()
	ns := podNamespace(req)
	err := f.c.Get(f.ctx, client.ObjectKey{Namespace: ns, Name: req.Name + "-squid"}, &corev1.Secret{})
	assert.True(f.t, apierrors.IsNotFound(err), "the Secret: %v", err)
	err = f.c.Get(f.ctx, client.ObjectKey{Namespace: ns, Name: req.Name}, &networkingv1.NetworkPolicy{})
	assert.True(f.t, apierrors.IsNotFound(err), "the NetworkPolicy: %v", err)
}

// writes is a client that records every write the API server accepted, as "verb Kind".
type writes struct {
	client.Client
	mu  sync.Mutex
	log []string
}

func (w *writes) record(verb string, obj client.Object, err error) error {
	if err == nil {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.log = append(w.log, verb+" "+reflect.TypeOf(obj).Elem().Name())
	}
	return err
}

func (w *writes) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return w.record("create", obj, w.Client.Create(ctx, obj, opts...))
}

func (w *writes) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return w.record("update", obj, w.Client.Update(ctx, obj, opts...))
}

func (w *writes) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return w.record("patch", obj, w.Client.Patch(ctx, obj, patch, opts...))
}

func (w *writes) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return w.record("delete", obj, w.Client.Delete(ctx, obj, opts...))
}

func (w *writes) Writes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.log...)
}

// recordWrites makes f's provider write through a recorder, and returns it.
func (f *fixture) recordWrites() *writes {
	w := &writes{Client: f.c}
	f.p.Client = w
	return w
}

// assertNoPassword checks that password appears in none of objs, nor in a Secret's data.
func assertNoPassword(t *testing.T, password string, objs ...client.Object) {
	t.Helper()
	for _, obj := range objs {
		raw, err := json.Marshal(obj)
		require.NoError(t, err)
		assert.NotContains(t, string(raw), password, "%T %s", obj, obj.GetName())
		if s, ok := obj.(*corev1.Secret); ok {
			for k, v := range s.Data {
				assert.NotContains(t, string(v), password, "Secret key %s", k)
			}
		}
	}
}

func TestCreateMakesSecretPolicyAndPod(t *testing.T) {
	crawlers := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "crawl"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "crawler"}},
	}
	tests := []struct {
		name    string
		clients []networkingv1.NetworkPolicyPeer // spec.kubernetes.allowedClients
		// from are the peers admitted besides the worker's, given the Proxy's namespace.
		from func(ns string) []networkingv1.NetworkPolicyPeer
	}{
		{
			name: "default clients: the pods of the Proxy's namespace",
			from: func(ns string) []networkingv1.NetworkPolicyPeer {
				return []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
					PodSelector:       &metav1.LabelSelector{},
				}}
			},
		},
		{
			name:    "the Proxy's allowed clients",
			clients: []networkingv1.NetworkPolicyPeer{crawlers},
			from:    func(string) []networkingv1.NetworkPolicyPeer { return []networkingv1.NetworkPolicyPeer{crawlers} },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			worker := WorkerPeer("fleet", map[string]string{"app": "proxyfleet-worker"})
			f.p.ProbeFrom = worker
			w := f.recordWrites()
			req := f.request("px-deps-0")
			req.Spec.Port, req.Port = 8080, 8080
			req.Spec.Kubernetes.AllowedClients = tc.clients
			// A second pod of the same Proxy, as during a replacement: the policy must not
			// select it.
			sibling := f.request("px-deps-1")
			sibling.ProxyUID = req.ProxyUID

			inst := f.create(req)
			assert.Equal(t, []string{
				// The pod first, so that nothing of the instance exists without a pod to be
				// deleted with; the policy before the Secret, so that Squid, which waits for
				// its configuration, never serves unprotected.
				"create Pod", "create NetworkPolicy", "create Secret",
			}, w.Writes())
			f.create(sibling)
			pod := f.pod(inst.ProviderID)
			secret, policy := f.dependents(req)

			// The Secret: squid.conf for this port with the closed proxy's rules, and a
			// passwd line holding a hash of the password.
			conf := string(secret.Data["squid.conf"])
			for _, l := range []string{
				"http_port 8080",
				"auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/passwd",
				"http_access deny !proxyfleet_users",
				"http_access deny !proxyfleet_ports",
				"http_access deny proxyfleet_denied",
				"http_access deny all",
			} {
				assert.Contains(t, conf, "\n"+l+"\n")
			}
			assert.Len(t, secret.Data, 2, "squid.conf and passwd")
			passwd := string(secret.Data["passwd"])
			assert.True(t, strings.HasPrefix(passwd, proxyauth.ManagedUsername+":$1$"), "an MD5-crypt line: %q", passwd)
			assert.Equal(t, 1, strings.Count(passwd, "\n"))
			assertNoPassword(t, req.Credentials.Password, secret, policy, pod)
			for _, obj := range []client.Object{secret, policy} {
				assert.Equal(t, req.ProxyUID, obj.GetLabels()[provider.LabelProxyUID], "%T", obj)
				assert.Equal(t, f.installation, obj.GetLabels()[provider.LabelInstallation], "%T", obj)
				assert.Equal(t, req.KeyID, obj.GetLabels()[provider.LabelKeyID], "%T", obj)
				assert.Equal(t, req.Name, obj.GetLabels()["proxyfleet-instance"], "%T", obj)
			}

			// The policy: ingress to the proxy port of this pod alone, from the clients and
			// the worker.
			sel, err := metav1.LabelSelectorAsSelector(&policy.Spec.PodSelector)
			require.NoError(t, err)
			var selected corev1.PodList
			require.NoError(t, f.c.List(f.ctx, &selected, client.InNamespace(f.ns), client.MatchingLabelsSelector{Selector: sel}))
			require.Len(t, selected.Items, 1)
			assert.Equal(t, pod.UID, selected.Items[0].UID)
			assert.Equal(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, policy.Spec.PolicyTypes)
			assert.Empty(t, policy.Spec.Egress)
			require.Len(t, policy.Spec.Ingress, 1)
			tcp, port := corev1.ProtocolTCP, intstr.FromInt32(8080)
			assert.Equal(t, []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}, policy.Spec.Ingress[0].Ports)
			assert.Equal(t, append(tc.from(f.ns), worker...), policy.Spec.Ingress[0].From)

			// The pod reads its configuration from the Secret.
			require.NotEmpty(t, pod.Spec.Volumes)
			require.NotNil(t, pod.Spec.Volumes[0].Secret)
			assert.Equal(t, secret.Name, pod.Spec.Volumes[0].Secret.SecretName)
			assert.Equal(t, []corev1.VolumeMount{
				{Name: pod.Spec.Volumes[0].Name, MountPath: "/etc/squid/squid.conf", SubPath: "squid.conf", ReadOnly: true},
				{Name: pod.Spec.Volumes[0].Name, MountPath: "/etc/squid/passwd", SubPath: "passwd", ReadOnly: true},
			}, pod.Spec.Containers[0].VolumeMounts)

			// Both are the pod's dependents, so the cluster removes them with it.
			owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
			assert.Equal(t, owner, secret.OwnerReferences)
			assert.Equal(t, owner, policy.OwnerReferences)
		})
	}
}

func TestCreateRendersEgress(t *testing.T) {
	f := newFixture(t)
	req := f.request("px-egress-0")
	req.Spec.Egress = &v1alpha1.Egress{
		Ports:               []v1alpha1.PortNumber{443, 8443},
		AllowedDestinations: []v1alpha1.CIDR{"10.20.0.0/16"},
	}
	f.create(req)
	secret, _ := f.dependents(req)
	conf := string(secret.Data["squid.conf"])
	assert.Contains(t, conf, "\nacl proxyfleet_ports port 443 8443\n")
	assert.Contains(t, conf, "\nacl proxyfleet_allowed dst 10.20.0.0/16\n")
	assert.Contains(t, conf, "\nhttp_access deny proxyfleet_denied !proxyfleet_allowed\n")
	assert.NotContains(t, conf, "port 80 ", "only the ports the spec lists")

	// A destination Squid cannot be told about is refused before anything is created (the
	// schema refuses it first; Proxies built in code may not have gone through it).
	bad := f.request("px-egress-1")
	bad.Spec.Egress = &v1alpha1.Egress{AllowedDestinations: []v1alpha1.CIDR{"10.20.0.0"}}
	_, err := f.p.Create(f.ctx, bad)
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
	f.assertNoDependents(bad)
}

func TestCreateWithoutCredentials(t *testing.T) {
	for _, creds := range []proxyauth.Credentials{{}, {Username: proxyauth.ManagedUsername}} {
		t.Run(strconv.Quote(creds.Username), func(t *testing.T) {
			f := newFixture(t)
			req := f.request("px-open-0")
			req.Credentials = creds
			_, err := f.p.Create(f.ctx, req)
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err), "an open proxy is never the fix")
			f.assertNothingIn(f.ns)
		})
	}
}

// A Secret or policy of the instance's name that is not this Proxy's is never taken over:
// the pod would run with someone else's configuration or protection.
func TestCreateRefusesDependentsNotItsOwn(t *testing.T) {
	tests := []struct {
		name string
		// plant creates the object in the way, given the request and another Proxy's.
		plant func(f *fixture, req, theirs provider.CreateRequest) client.Object
	}{
		{
			name: "another Proxy's Secret",
			plant: func(f *fixture, _, theirs provider.CreateRequest) client.Object {
				files, err := renderConfig(theirs)
				require.NoError(f.t, err)
				return buildConfigSecret(theirs, files)
			},
		},
		{
			name: "a Secret of nobody's",
			plant: func(_ *fixture, req, _ provider.CreateRequest) client.Object {
				return &corev1.Secret{
					ObjectMeta: metav1.ObjectMeta{Name: req.Name + "-squid", Namespace: req.Namespace},
					Data:       map[string][]byte{"squid.conf": []byte("http_access allow all\n")},
				}
			},
		},
		{
			name: "another Proxy's NetworkPolicy",
			plant: func(_ *fixture, _, theirs provider.CreateRequest) client.Object {
				return buildNetworkPolicy(theirs, nil)
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			req := f.request("px-taken-0")
			theirs := f.request("px-taken-0")
			planted := tc.plant(f, req, theirs)
			require.NoError(t, f.c.Create(f.ctx, planted))
			before := planted.DeepCopyObject().(client.Object)
			require.NoError(t, f.c.Get(f.ctx, client.ObjectKeyFromObject(planted), before))

			_, err := f.p.Create(f.ctx, req)
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), "is not this Proxy's")

			var pods corev1.PodList
			require.NoError(t, f.c.List(f.ctx, &pods, client.InNamespace(f.ns)))
			assert.Empty(t, pods.Items, "no pod without its own configuration and protection")
			after := planted.DeepCopyObject().(client.Object)
			require.NoError(t, f.c.Get(f.ctx, client.ObjectKeyFromObject(planted), after))
			assert.Equal(t, before.GetResourceVersion(), after.GetResourceVersion(), "left as it was")
			assert.Empty(t, after.GetOwnerReferences())
		})
	}
}

// What an earlier attempt left without a pod (an older version made the Secret and the
// policy first; a pod deleted leaves its dependents until the garbage collector comes) is
// removed before the pod is made, and made anew after it: a Secret there before the pod
// would let Squid start before its policy exists, and one owned by the deleted pod could
// be collected under the new one.
func TestCreateReplacesDependentsLeftWithoutAPod(t *testing.T) {
	tests := []struct {
		name string
		// stale edits the request the earlier attempt made.
		stale func(*provider.CreateRequest)
		// provider edits the earlier attempt's provider.
		provider func(*Provider)
		// ownerGone makes the objects a deleted pod's dependents.
		ownerGone bool
	}{
		{
			name: "another fleet key",
			stale: func(r *provider.CreateRequest) {
				r.KeyID, r.Credentials.Password = "fedc9876", "kube-canary-old-key"
			},
		},
		{
			// The same key ID with other data: say, a Secret rendered by an older worker.
			name:  "other data",
			stale: func(r *provider.CreateRequest) { r.Credentials.Password = "kube-canary-other-data" },
		},
		{
			name:  "the worker's peer changed",
			stale: func(*provider.CreateRequest) {},
			provider: func(p *Provider) {
				p.ProbeFrom = WorkerPeer("old-fleet", map[string]string{"app": "worker"})
			},
		},
		{
			name:      "the dependents of a pod deleted since",
			stale:     func(*provider.CreateRequest) {},
			ownerGone: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.p.ProbeFrom = WorkerPeer("fleet", map[string]string{"app": "worker"})
			req := f.request("px-stale-0")

			// The earlier attempt: everything but the pod.
			earlier := req
			tc.stale(&earlier)
			old := *f.p
			if tc.provider != nil {
				tc.provider(&old)
			}
			files, err := renderConfig(earlier)
			require.NoError(t, err)
			leftovers := []client.Object{buildConfigSecret(earlier, files), buildNetworkPolicy(earlier, old.ProbeFrom)}
			for _, obj := range leftovers {
				if tc.ownerGone {
					obj.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: req.Name, UID: "0e3c1d5e-6d8c-4c4b-9d59-6f1f0c9c1d2a"}})
				}
				require.NoError(t, f.c.Create(f.ctx, obj))
			}

			w := f.recordWrites()
			inst := f.create(req)
			assert.Equal(t, []string{
				"delete Secret", "delete NetworkPolicy", "create Pod", "create NetworkPolicy", "create Secret",
			}, w.Writes(), "removed before the pod is created, made anew after")

			secret, policy := f.dependents(req)
			for i, obj := range []client.Object{secret, policy} {
				assert.NotEqual(t, leftovers[i].GetUID(), obj.GetUID(), "%T made anew", obj)
			}
			files, err = renderConfig(req)
			require.NoError(t, err)
			assert.Equal(t, buildConfigSecret(req, files).Data, secret.Data)
			assert.Equal(t, req.KeyID, secret.Labels[provider.LabelKeyID])
			assert.Equal(t, buildNetworkPolicy(req, f.p.ProbeFrom).Spec, policy.Spec)
			assert.Equal(t, req.KeyID, inst.Labels[provider.LabelKeyID])
			assertNoPassword(t, earlier.Credentials.Password, secret)
			f.assertOnlyDependents(req, "after the create")
		})
	}
}

// A retry that finds the pod of an earlier attempt adopts it with the Secret it reads: the
// pod's key label tells the workflow which credentials Squid requires, and a Secret
// rewritten under it (say, after the fleet key rotated) would change them at Squid's next
// restart.
func TestCreateKeepsTheSecretOfAnExistingPod(t *testing.T) {
	f := newFixture(t)
	earlier := f.request("px-adopt-0")
	earlier.KeyID, earlier.Credentials.Password = "fedc9876", "kube-canary-old-key"
	f.create(earlier)
	secretBefore, _ := f.dependents(earlier)

	req := earlier
	req.KeyID, req.Credentials = "0123abcd", f.request("px-adopt-0").Credentials
	inst := f.create(req)
	assert.Equal(t, "fedc9876", inst.Labels[provider.LabelKeyID], "the workflow learns the key the pod runs with")
	secret, policy := f.dependents(req)
	assert.Equal(t, secretBefore, secret)
	pod := f.pod(inst.ProviderID)
	assert.Equal(t, pod.UID, policy.OwnerReferences[0].UID)
}

// An older version made the Secret and the policy first and owned them once the pod
// existed; an attempt of it cut short between the two left a pod whose dependents are not
// owned. The retry adopts the pod and owns them, keeping the Secret as it is (the pod
// reads it) and bringing the policy up to date in the same write.
func TestCreateOwnsWhatAnOlderVersionLeftUnowned(t *testing.T) {
	f := newFixture(t)
	f.p.ProbeFrom = WorkerPeer("fleet", map[string]string{"app": "worker"})
	earlier := f.request("px-older-0")
	earlier.KeyID, earlier.Credentials.Password = "fedc9876", "kube-canary-old-key"
	files, err := renderConfig(earlier)
	require.NoError(t, err)
	require.NoError(t, f.c.Create(f.ctx, buildConfigSecret(earlier, files)))
	require.NoError(t, f.c.Create(f.ctx, buildNetworkPolicy(earlier, WorkerPeer("old-fleet", map[string]string{"app": "worker"}))))
	require.NoError(t, f.c.Create(f.ctx, buildPod(earlier)))
	secretBefore, _ := f.dependents(earlier)

	req := earlier
	req.KeyID, req.Credentials = "0123abcd", f.request("px-older-0").Credentials
	w := f.recordWrites()
	inst := f.create(req)
	assert.Equal(t, []string{"update NetworkPolicy", "patch Secret"}, w.Writes())
	assert.Equal(t, "fedc9876", inst.Labels[provider.LabelKeyID], "adopted with the key it was made with")
	secret, policy := f.dependents(req)
	assert.Equal(t, secretBefore.Data, secret.Data, "the Secret the pod reads is kept")
	assert.Equal(t, buildNetworkPolicy(req, f.p.ProbeFrom).Spec, policy.Spec)
	f.assertOnlyDependents(req, "after the retry")
}

// A pod of ours never runs beside a Secret or policy of its name that is not this
// Proxy's: it would mount someone else's configuration, or run without its own policy. If
// one turns up after the pod exists, the pod is deleted and the create refused.
func TestCreateDiscardsItsPodBesideObjectsNotItsOwn(t *testing.T) {
	nobodys := func(req provider.CreateRequest) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: configSecretName(req.Name), Namespace: req.Namespace},
			Data:       map[string][]byte{"squid.conf": []byte("http_access allow all\n")},
		}
	}
	t.Run("found by a retry", func(t *testing.T) {
		f := newFixture(t)
		req := f.request("px-foreign-0")
		id := f.create(req).ProviderID
		secret, _ := f.dependents(req)
		require.NoError(t, f.c.Delete(f.ctx, secret))
		planted := nobodys(req)
		require.NoError(t, f.c.Create(f.ctx, planted))

		_, err := f.p.Create(f.ctx, req)
		require.Error(t, err)
		assert.Equal(t, provider.KindPermanent, provider.Class(err))
		assert.Contains(t, err.Error(), "is not this Proxy's")
		_, err = f.p.Get(f.ctx, id)
		assert.ErrorIs(t, err, provider.ErrNotFound, "the pod is deleted")
		var still corev1.Secret
		require.NoError(t, f.c.Get(f.ctx, client.ObjectKeyFromObject(planted), &still))
		assert.Equal(t, planted.Data, still.Data, "and the Secret left alone")
	})
	t.Run("made while the pod was", func(t *testing.T) {
		f := newFixture(t)
		req := f.request("px-foreign-1")
		planted := nobodys(req)
		f.p.Client = plantAfterPod{Client: f.c, plant: planted}

		_, err := f.p.Create(f.ctx, req)
		require.Error(t, err)
		assert.Equal(t, provider.KindPermanent, provider.Class(err))
		assert.Contains(t, err.Error(), "is not this Proxy's")
		var pods corev1.PodList
		require.NoError(t, f.c.List(f.ctx, &pods, client.InNamespace(f.ns)))
		assert.Empty(t, pods.Items, "the pod is deleted")
		var still corev1.Secret
		require.NoError(t, f.c.Get(f.ctx, client.ObjectKeyFromObject(planted), &still))
		assert.Empty(t, still.OwnerReferences, "the Secret is left alone")
		// The policy made before the Secret was found goes with the deleted pod.
		var policy networkingv1.NetworkPolicy
		require.NoError(t, f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: req.Name}, &policy))
		require.Len(t, policy.OwnerReferences, 1)
		assert.Equal(t, "Pod", policy.OwnerReferences[0].Kind)
		assert.Equal(t, req.Name, policy.OwnerReferences[0].Name)
	})
}

// plantAfterPod creates plant right after a pod is created: another party taking the
// instance's Secret name in the moment before the provider makes it.
type plantAfterPod struct {
	client.Client
	plant client.Object
}

func (c plantAfterPod) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.Client.Create(ctx, obj, opts...); err != nil {
		return err
	}
	if _, ok := obj.(*corev1.Pod); ok {
		return c.Client.Create(ctx, c.plant)
	}
	return nil
}

func TestDeleteRemovesWhatIsLeft(t *testing.T) {
	t.Run("the Secret and the policy of a pod already gone", func(t *testing.T) {
		f := newFixture(t)
		req := f.request("px-left-0")
		id := f.create(req).ProviderID
		require.NoError(t, f.c.Delete(f.ctx, f.pod(id)))

		require.NoError(t, f.p.Delete(f.ctx, id))
		f.assertNoDependents(req)
	})
	t.Run("nothing of a pod the API server refused", func(t *testing.T) {
		f := newFixture(t)
		req := f.request("px-left-1")
		req.Spec.Kubernetes.Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
		}
		_, err := f.p.Create(f.ctx, req)
		require.True(t, apierrors.IsInvalid(err), "the pod is refused: %v", err)
		f.assertNoDependents(req) // the pod comes first: without it, nothing was made

		require.NoError(t, f.p.Delete(f.ctx, f.p.ProviderID(req)))
		f.assertNoDependents(req)
	})
	t.Run("the Secret and the policy an older version left without a pod", func(t *testing.T) {
		// Older versions made them before the pod, and owned them only once it existed.
		f := newFixture(t)
		req := f.request("px-left-4")
		files, err := renderConfig(req)
		require.NoError(t, err)
		require.NoError(t, f.c.Create(f.ctx, buildConfigSecret(req, files)))
		require.NoError(t, f.c.Create(f.ctx, buildNetworkPolicy(req, nil)))

		require.NoError(t, f.p.Delete(f.ctx, f.p.ProviderID(req)))
		f.assertNoDependents(req)
	})
	t.Run("nothing", func(t *testing.T) {
		f := newFixture(t)
		w := f.recordWrites()
		require.NoError(t, f.p.Delete(f.ctx, f.ns+"/px-left-2"))
		assert.Empty(t, w.Writes())
	})
	t.Run("in another namespace", func(t *testing.T) {
		f := newFixture(t)
		req := f.request("px-left-3")
		req.Spec.Kubernetes.Namespace = f.namespace()
		f.p.Allow.Namespaces = []string{req.Spec.Kubernetes.Namespace}
		id := f.create(req).ProviderID
		f.dependents(req)

		require.NoError(t, f.p.Delete(f.ctx, id))
		_, err := f.p.Get(f.ctx, id)
		assert.ErrorIs(t, err, provider.ErrNotFound)
		f.assertNoDependents(req)
	})
}

// TestDeleteSparesObjectsNotOfTheInstance: a Secret that happens to have the name of an
// instance's configuration, but is not one (a user's), survives the instance's delete, as
// it survived the create that refused to take it over.
func TestDeleteSparesObjectsNotOfTheInstance(t *testing.T) {
	f := newFixture(t)
	req := f.request("px-spare-0")
	users := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: configSecretName(req.Name), Namespace: req.Namespace},
		Data:       map[string][]byte{"note": []byte("mine")},
	}
	require.NoError(t, f.c.Create(f.ctx, users))
	_, err := f.p.Create(f.ctx, req)
	require.Error(t, err)
	require.NoError(t, f.p.Delete(f.ctx, f.p.ProviderID(req)))
	var still corev1.Secret
	require.NoError(t, f.c.Get(f.ctx, client.ObjectKeyFromObject(users), &still), "the user's Secret was deleted")
	assert.Equal(t, []byte("mine"), still.Data["note"])
}
