package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// The API server runs without kubelet, scheduler or controller manager: the tests play the
// kubelet by writing pod status, and whatever else a controller would have done.
func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Kube: true}))
}

type fixture struct {
	t   *testing.T
	c   client.Client
	p   *Provider
	ns  string
	ctx context.Context
	// installation is unique per test, so ListOwned sees only this test's pods.
	installation string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	c := testenv.Kube(t).Client
	f := &fixture{t: t, c: c, p: &Provider{Client: c}, ctx: ctx, installation: "inst-" + strings.ToLower(rand.Text()[:10])}
	f.ns = f.namespace()
	return f
}

// namespace creates a namespace for this test. It is deleted at the end; without a namespace
// controller it only ever reaches Terminating, which is enough to keep tests apart.
func (f *fixture) namespace() string {
	f.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "kube-provider-"}}
	require.NoError(f.t, f.c.Create(f.ctx, ns))
	f.t.Cleanup(func() { _ = f.c.Delete(context.Background(), ns) })
	return ns.Name
}

func (f *fixture) request(name string) provider.CreateRequest {
	return provider.CreateRequest{
		Name:         name,
		ProxyUID:     strings.ToLower(rand.Text()),
		Installation: f.installation,
		Namespace:    f.ns,
		Port:         v1alpha1.DefaultManagedPort,
		Spec: v1alpha1.ProxySpec{
			Provider:   v1alpha1.ProviderKubernetes,
			Kubernetes: &v1alpha1.KubernetesSpec{},
		},
		Credentials: proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: "kube-canary-" + name},
		KeyID:       "0123abcd",
	}
}

func (f *fixture) create(req provider.CreateRequest) provider.Instance {
	f.t.Helper()
	inst, err := f.p.Create(f.ctx, req)
	require.NoError(f.t, err)
	return inst
}

func (f *fixture) get(id string) provider.Instance {
	f.t.Helper()
	inst, err := f.p.Get(f.ctx, id)
	require.NoError(f.t, err)
	return inst
}

func (f *fixture) pod(id string) *corev1.Pod {
	f.t.Helper()
	key, err := parseID(id)
	require.NoError(f.t, err)
	var pod corev1.Pod
	require.NoError(f.t, f.c.Get(f.ctx, key, &pod))
	return &pod
}

// setStatus plays the kubelet.
func (f *fixture) setStatus(id string, phase corev1.PodPhase, ip string, ready corev1.ConditionStatus) {
	f.t.Helper()
	pod := f.pod(id)
	pod.Status = corev1.PodStatus{Phase: phase, PodIP: ip}
	if ip != "" {
		pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	if ready != "" {
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()}}
	}
	require.NoError(f.t, f.c.Status().Update(f.ctx, pod))
}

func TestLifecycle(t *testing.T) {
	f := newFixture(t)
	req := f.request("px-life-0")
	req.Spec.Port, req.Port = 8080, 8080

	created := f.create(req)
	id := f.p.ProviderID(req)
	assert.Equal(t, f.ns+"/px-life-0", id)
	assert.Equal(t, id, created.ProviderID)
	assert.Equal(t, "px-life-0", created.Name)
	assert.Equal(t, provider.StateProvisioning, created.State)
	assert.Equal(t, req.ProxyUID, created.ProxyUID())
	assert.Equal(t, f.installation, created.Labels[provider.LabelInstallation])
	assert.False(t, created.CreatedAt.IsZero())

	inst := f.get(id)
	assert.Equal(t, provider.StateProvisioning, inst.State)
	assert.Empty(t, inst.IP)
	assert.True(t, created.CreatedAt.Equal(inst.CreatedAt))

	f.setStatus(id, corev1.PodRunning, "10.20.30.40", corev1.ConditionFalse)
	inst = f.get(id)
	assert.Equal(t, provider.StateProvisioning, inst.State, "running but not ready")
	assert.Empty(t, inst.IP)

	f.setStatus(id, corev1.PodRunning, "10.20.30.40", corev1.ConditionTrue)
	inst = f.get(id)
	assert.Equal(t, provider.StateRunning, inst.State)
	assert.Equal(t, "10.20.30.40", inst.IP)
	assert.Equal(t, int32(8080), inst.Port)

	f.setStatus(id, corev1.PodFailed, "", "")
	inst = f.get(id)
	assert.Equal(t, provider.StateStopped, inst.State)
	assert.Empty(t, inst.IP)
}

func TestCreateIsIdempotent(t *testing.T) {
	f := newFixture(t)
	f.p.ProbeFrom = WorkerPeer("fleet", map[string]string{"app": "worker"})
	req := f.request("px-idem-0")
	first := f.create(req)
	secret, policy := f.dependents(req)
	pod := f.pod(first.ProviderID)

	again := f.create(req)
	assert.Equal(t, first, again)
	// The same objects, untouched: not recreated, not rewritten, not owned twice.
	secretAgain, policyAgain := f.dependents(req)
	assert.Equal(t, secret, secretAgain)
	assert.Equal(t, policy, policyAgain)
	assert.Equal(t, pod, f.pod(first.ProviderID))
	assert.Len(t, secretAgain.OwnerReferences, 1)
	assert.Len(t, policyAgain.OwnerReferences, 1)

	var pods corev1.PodList
	require.NoError(t, f.c.List(f.ctx, &pods, client.InNamespace(f.ns)))
	assert.Len(t, pods.Items, 1)
}

func TestCreateRefusesAnotherProxysPod(t *testing.T) {
	f := newFixture(t)
	mine := f.request("px-clash-0")
	f.create(mine)
	secret, policy := f.dependents(mine)

	theirs := f.request("px-clash-0")
	require.NotEqual(t, mine.ProxyUID, theirs.ProxyUID)
	_, err := f.p.Create(f.ctx, theirs)
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))

	assert.Equal(t, mine.ProxyUID, f.pod(f.p.ProviderID(mine)).Labels[provider.LabelProxyUID], "the pod is left alone")
	secretAfter, policyAfter := f.dependents(mine)
	assert.Equal(t, secret, secretAfter, "and so is its Secret")
	assert.Equal(t, policy, policyAfter, "and its policy")
}

func TestDelete(t *testing.T) {
	f := newFixture(t)
	req := f.request("px-del-0")
	id := f.create(req).ProviderID

	require.NoError(t, f.p.Delete(f.ctx, id))
	// An unscheduled pod has no kubelet to wait for, so the API server removes it at once;
	// Eventually only guards against that changing.
	require.Eventually(t, func() bool {
		_, err := f.p.Get(f.ctx, id)
		return errors.Is(err, provider.ErrNotFound)
	}, 10*time.Second, 50*time.Millisecond)
	// No garbage collector runs here: the Secret and the policy are gone because Delete
	// removed them.
	f.assertNoDependents(req)

	_, err := f.p.Get(f.ctx, id)
	assert.Equal(t, provider.KindTransient, provider.Class(err), "not found is reported, not classified permanent")

	assert.NoError(t, f.p.Delete(f.ctx, id), "deleting a missing pod succeeds")
	assert.NoError(t, f.p.Delete(f.ctx, f.ns+"/never-created"))
}

func TestDeleteOfScheduledPodReportsDeleting(t *testing.T) {
	f := newFixture(t)
	// A pod bound to a node keeps existing, with a deletion timestamp, until its kubelet
	// confirms Squid stopped; here no kubelet ever does.
	pod := buildPod(f.request("px-term-0"))
	pod.Spec.NodeName = "node-that-never-answers"
	require.NoError(t, f.c.Create(f.ctx, pod))
	id := f.ns + "/" + pod.Name

	require.NoError(t, f.p.Delete(f.ctx, id))
	assert.Equal(t, provider.StateDeleting, f.get(id).State)
	assert.NoError(t, f.p.Delete(f.ctx, id), "deleting again while terminating succeeds")
}

func TestMalformedIDs(t *testing.T) {
	f := newFixture(t)
	for _, id := range []string{"px-a-0", "zones/us-central1-a/instances/px-a-0", ""} {
		_, err := f.p.Get(f.ctx, id)
		assert.Equal(t, provider.KindPermanent, provider.Class(err), "get %q", id)
		assert.Equal(t, provider.KindPermanent, provider.Class(f.p.Delete(f.ctx, id)), "delete %q", id)
	}
}

func TestListOwned(t *testing.T) {
	f := newFixture(t)
	other := f.namespace()

	a := f.request("px-list-a")
	b := f.request("px-list-b")
	b.Spec.Kubernetes.Namespace = other // same installation, pod in another namespace
	c := f.request("px-list-c")
	c.Installation = f.installation + "-other"
	f.p.Allow.Namespaces = []string{other}
	for _, req := range []provider.CreateRequest{a, b, c} {
		f.create(req)
	}

	// Pages of one pod exercise the continue loop.
	for _, p := range []*Provider{f.p, {Client: f.c, pageSize: 1}} {
		list, err := p.ListOwned(f.ctx, provider.Owner{Installation: f.installation})
		require.NoError(t, err)
		var ids []string
		for _, inst := range list {
			ids = append(ids, inst.ProviderID)
			assert.Equal(t, f.installation, inst.Labels[provider.LabelInstallation])
			assert.Equal(t, provider.ManagedByValue, inst.Labels[provider.LabelManagedBy])
		}
		assert.ElementsMatch(t, []string{f.ns + "/px-list-a", other + "/px-list-b"}, ids)
	}

	list, err := f.p.ListOwned(f.ctx, provider.Owner{Installation: c.Installation})
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, f.ns+"/px-list-c", list[0].ProviderID)

	_, err = f.p.ListOwned(f.ctx, provider.Owner{})
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

func TestListOwnedByProxy(t *testing.T) {
	f := newFixture(t)
	other := f.namespace()

	a0 := f.request("px-own-a-0")
	a1 := f.request("px-own-a-1") // the same Proxy's second instance, in another namespace
	a1.ProxyUID = a0.ProxyUID
	a1.Spec.Kubernetes.Namespace = other
	sibling := f.request("px-own-b-0")   // same installation, another Proxy
	elsewhere := f.request("px-own-a-x") // the same UID in another installation
	elsewhere.ProxyUID = a0.ProxyUID
	elsewhere.Installation = f.installation + "-other"
	f.p.Allow.Namespaces = []string{other}
	for _, req := range []provider.CreateRequest{a0, a1, sibling, elsewhere} {
		f.create(req)
	}

	mine := provider.Owner{Installation: f.installation, ProxyUID: a0.ProxyUID}
	// Pages of one pod exercise the continue loop with both labels selected.
	for _, p := range []*Provider{f.p, {Client: f.c, pageSize: 1}} {
		list, err := p.ListOwned(f.ctx, mine)
		require.NoError(t, err)
		var ids []string
		for _, inst := range list {
			ids = append(ids, inst.ProviderID)
			assert.Equal(t, a0.ProxyUID, inst.ProxyUID())
			assert.Equal(t, f.installation, inst.Labels[provider.LabelInstallation])
		}
		assert.ElementsMatch(t, []string{f.ns + "/px-own-a-0", other + "/px-own-a-1"}, ids)
	}

	all, err := f.p.ListOwned(f.ctx, provider.Owner{Installation: f.installation})
	require.NoError(t, err)
	assert.Len(t, all, 3, "without a UID the whole installation is listed")

	none, err := f.p.ListOwned(f.ctx, provider.Owner{Installation: f.installation, ProxyUID: "no-such-uid"})
	require.NoError(t, err)
	assert.Empty(t, none)

	for _, owner := range []provider.Owner{
		{ProxyUID: a0.ProxyUID},
		{Installation: f.installation, ProxyUID: a0.ProxyUID + ",proxyfleet-managed-by!=proxyfleet"},
		{Installation: "not a label value", ProxyUID: a0.ProxyUID},
	} {
		_, err := f.p.ListOwned(f.ctx, owner)
		assert.Equal(t, provider.KindPermanent, provider.Class(err), "%+v", owner)
	}
}

// ignoreSelector is an API server that answers a List as if no label selector were given.
type ignoreSelector struct{ client.Client }

func (c ignoreSelector) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	o.LabelSelector = nil
	return c.Client.List(ctx, list, o)
}

// The sweeper deletes what a list returns, so an answer wider than the selector asked for
// must not get through.
func TestListOwnedChecksLabelsItself(t *testing.T) {
	f := newFixture(t)
	mine := f.request("px-check-a")
	sibling := f.request("px-check-b")
	elsewhere := f.request("px-check-c")
	elsewhere.ProxyUID = mine.ProxyUID
	elsewhere.Installation = f.installation + "-other"
	for _, req := range []provider.CreateRequest{mine, sibling, elsewhere} {
		f.create(req)
	}
	p := &Provider{Client: ignoreSelector{f.c}}

	list, err := p.ListOwned(f.ctx, provider.Owner{Installation: f.installation, ProxyUID: mine.ProxyUID})
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, f.ns+"/px-check-a", list[0].ProviderID)

	list, err = p.ListOwned(f.ctx, provider.Owner{Installation: f.installation})
	require.NoError(t, err)
	var ids []string
	for _, inst := range list {
		ids = append(ids, inst.ProviderID)
	}
	assert.ElementsMatch(t, []string{f.ns + "/px-check-a", f.ns + "/px-check-b"}, ids)
}

func TestCreateLabelsTheSpecHash(t *testing.T) {
	f := newFixture(t)
	withHash := f.request("px-hash-0")
	withHash.SpecHash = "0123456789abcdef"
	created := f.create(withHash)
	assert.Equal(t, "0123456789abcdef", created.Labels[provider.LabelSpecHash])
	assert.Equal(t, "0123456789abcdef", f.pod(created.ProviderID).Labels[provider.LabelSpecHash])

	list, err := f.p.ListOwned(f.ctx, provider.Owner{Installation: f.installation, ProxyUID: withHash.ProxyUID})
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "0123456789abcdef", list[0].Labels[provider.LabelSpecHash], "a run without state reads it back from the list")

	without := f.create(f.request("px-hash-1"))
	assert.NotContains(t, f.pod(without.ProviderID).Labels, provider.LabelSpecHash, "no hash, no label")
}

func TestCloudInitSecretIsMounted(t *testing.T) {
	f := newFixture(t)
	const conf = "http_port 3128\nauth_param basic program /secret/helper token=s3cr3t-value\n"
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: "squid-conf", Namespace: f.ns,
			Labels: map[string]string{v1alpha1.LabelCloudInit: "true"},
		},
		Data: map[string][]byte{"squid": []byte(conf)},
	}
	require.NoError(t, f.c.Create(f.ctx, secret))

	req := f.request("px-conf-0")
	req.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "squid-conf", Key: "squid"}}
	req.CloudInit = []byte(conf) // what the activity read; the provider must not use it
	id := f.create(req).ProviderID

	pod := f.pod(id)
	// The rendered configuration first, then the user's Secret as the file it includes.
	require.Len(t, pod.Spec.Volumes, 2)
	vol := pod.Spec.Volumes[1]
	require.NotNil(t, vol.Secret)
	assert.Equal(t, "squid-conf", vol.Secret.SecretName)
	assert.Equal(t, []corev1.KeyToPath{{Key: "squid", Path: "proxyfleet-user.conf"}}, vol.Secret.Items)
	require.Len(t, pod.Spec.Containers[0].VolumeMounts, 3)
	mount := pod.Spec.Containers[0].VolumeMounts[2]
	assert.Equal(t, vol.Name, mount.Name)
	assert.Equal(t, "/etc/squid/proxyfleet-user.conf", mount.MountPath)
	assert.Equal(t, "proxyfleet-user.conf", mount.SubPath)
	assert.True(t, mount.ReadOnly)

	rendered, _ := f.dependents(req)
	assert.Contains(t, string(rendered.Data["squid.conf"]), "\ninclude /etc/squid/proxyfleet-user.conf\n")

	raw, err := json.Marshal(pod)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "s3cr3t-value", "Secret data must not be in the pod")
	assert.NotContains(t, string(raw), "auth_param")
	// Nor in the rendered configuration: the kubelet mounts the user's file, the provider
	// never copies it.
	for k, v := range rendered.Data {
		assert.NotContains(t, string(v), "s3cr3t-value", k)
	}
}

func TestCreateUnderResourceQuota(t *testing.T) {
	// The quota admission plugin enforces only what the quota controller has counted into
	// the quota's status. No controller manager runs here, so each case writes the status the
	// controller would (or would not yet) have written.
	tests := []struct {
		name string
		// status is what the quota controller has written so far.
		status corev1.ResourceQuotaStatus
		// kind is the class of the Create error; nil error when admitted.
		admitted bool
		kind     provider.Kind
	}{
		{
			// Not counted at all: admission ignores the quota until the controller has
			// filled in status.hard. Recorded so the cases below are understood.
			name:     "never counted",
			admitted: true,
		},
		{
			// 403 "status unknown for quota": the controller knows the limit but not the
			// usage yet. It catches up within seconds, so this is a retry, not a failure.
			name: "limit known, usage not yet",
			status: corev1.ResourceQuotaStatus{
				Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
			},
			kind: provider.KindTransient,
		},
		{
			// 403 "exceeded quota": a wait for capacity, shown as QuotaExceeded.
			name: "full",
			status: corev1.ResourceQuotaStatus{
				Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
				Used: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")},
			},
			kind: provider.KindQuota,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			quota := &corev1.ResourceQuota{
				ObjectMeta: metav1.ObjectMeta{Name: "no-pods", Namespace: f.ns},
				Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
			}
			require.NoError(t, f.c.Create(f.ctx, quota))
			if len(tc.status.Hard) > 0 {
				quota.Status = tc.status
				require.NoError(t, f.c.Status().Update(f.ctx, quota))
			}
			req := f.request("px-quota-0")
			if tc.admitted {
				_, err := f.p.Create(f.ctx, req)
				require.NoError(t, err)
				return
			}
			// Admission reads quotas through an informer, which may not have seen the status
			// yet and then admits the pod. Such a pod is removed and Create asked again,
			// until admission judges by the status written above.
			var err error
			require.Eventually(t, func() bool {
				var inst provider.Instance
				inst, err = f.p.Create(f.ctx, req)
				if err == nil {
					assert.NoError(t, f.p.Delete(f.ctx, inst.ProviderID))
					return false
				}
				return apierrors.IsForbidden(err)
			}, 10*time.Second, 50*time.Millisecond)
			t.Logf("API server said: %v", err)
			assert.Contains(t, err.Error(), "quota")
			assert.Equal(t, tc.kind, provider.Class(err))
		})
	}
}

func TestCreateInvalidPod(t *testing.T) {
	tests := []struct {
		name string
		edit func(*v1alpha1.KubernetesSpec)
		// byServer is true when the API server refuses the pod, false when the provider
		// refuses it first.
		byServer bool
	}{
		{
			// Spaces inside an image pass the API server (it checks only the ends), so the
			// provider refuses them itself.
			name: "image with spaces",
			edit: func(k *v1alpha1.KubernetesSpec) { k.Image = "ubuntu/squid: latest and greatest" },
		},
		{name: "image with a leading space", edit: func(k *v1alpha1.KubernetesSpec) { k.Image = " ubuntu/squid" }},
		{
			name: "negative memory request",
			edit: func(k *v1alpha1.KubernetesSpec) {
				k.Resources = corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("-1Mi")},
				}
			},
			byServer: true,
		},
		{
			name: "requests above limits",
			edit: func(k *v1alpha1.KubernetesSpec) {
				k.Resources = corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
				}
			},
			byServer: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			req := f.request("px-bad-0")
			tc.edit(req.Spec.Kubernetes)
			_, err := f.p.Create(f.ctx, req)
			require.Error(t, err)
			assert.Equal(t, tc.byServer, apierrors.IsInvalid(err), "refused by the API server: %v", err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))

			var pods corev1.PodList
			require.NoError(t, f.c.List(f.ctx, &pods, client.InNamespace(f.ns)))
			assert.Empty(t, pods.Items)
		})
	}
}

func TestCreateInMissingNamespaceIsTransient(t *testing.T) {
	f := newFixture(t)
	req := f.request("px-nons-0")
	req.Spec.Kubernetes.Namespace = "no-such-namespace-" + strings.ToLower(rand.Text()[:8])
	f.p.Allow.Namespaces = []string{req.Spec.Kubernetes.Namespace}
	_, err := f.p.Create(f.ctx, req)
	require.Error(t, err)
	assert.NotErrorIs(t, err, provider.ErrNotFound, "the instance is not gone; its namespace is missing")
	assert.Equal(t, provider.KindTransient, provider.Class(err), "creating the namespace fixes it")
}

// createScheduled creates req's pod as if bound to a node whose kubelet never answers (there
// is no kubelet here), with finalizers if given, and returns its provider ID. Finalizers are
// removed when the test ends, so the namespace can go.
func (f *fixture) createScheduled(req provider.CreateRequest, finalizers ...string) string {
	f.t.Helper()
	pod := buildPod(req)
	pod.Spec.NodeName = "node-that-is-lost"
	pod.Finalizers = finalizers
	require.NoError(f.t, f.c.Create(f.ctx, pod))
	if len(finalizers) > 0 {
		f.t.Cleanup(func() {
			var p corev1.Pod
			if err := f.c.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); err != nil {
				return
			}
			p.Finalizers = nil
			assert.NoError(f.t, f.c.Update(context.Background(), &p), "remove the test's finalizer")
		})
	}
	return f.ns + "/" + pod.Name
}

// at is a Provider on f's client whose clock reads the time t returns.
func (f *fixture) at(t func() time.Time) *Provider {
	return &Provider{Client: f.c, now: t}
}

// A pod whose node is lost stays Terminating: its kubelet never confirms. Past its grace
// period (and the margin) it counts as gone, so neither a Proxy's deletion nor its
// replacement waits for a node that is not coming back, and Delete removes it by force.
func TestLostPodCountsAsGoneAndIsDeletedByForce(t *testing.T) {
	f := newFixture(t)
	id := f.createScheduled(f.request("px-lost-0"))

	require.NoError(t, f.p.Delete(f.ctx, id))
	pod := f.pod(id)
	require.NotNil(t, pod.DeletionTimestamp, "terminating: no kubelet confirms")
	deadline := pod.DeletionTimestamp.Time // deletion time plus the grace period
	assert.Equal(t, provider.StateDeleting, f.get(id).State)

	justBefore := f.at(func() time.Time { return deadline.Add(lostMargin - time.Second) })
	inst, err := justBefore.Get(f.ctx, id)
	require.NoError(t, err, "within the margin the kubelet may still confirm")
	assert.Equal(t, provider.StateDeleting, inst.State)
	require.NoError(t, justBefore.Delete(f.ctx, id))
	assert.NotNil(t, f.pod(id), "a plain delete again: the pod is still waited for")

	later := f.at(func() time.Time { return deadline.Add(lostMargin + time.Second) })
	_, err = later.Get(f.ctx, id)
	require.ErrorIs(t, err, provider.ErrNotFound)
	assert.Equal(t, provider.KindTransient, provider.Class(err))
	assert.Contains(t, err.Error(), "its node is lost")

	require.NoError(t, later.Delete(f.ctx, id))
	var gone corev1.Pod
	err = f.c.Get(f.ctx, client.ObjectKeyFromObject(pod), &gone)
	assert.True(t, apierrors.IsNotFound(err), "the force delete removed the object: %v", err)
	assert.NoError(t, later.Delete(f.ctx, id), "and deleting it again succeeds")
}

// With a finalizer of someone else's the object outlives even a force delete; it still
// counts as gone, and deleting it again is not an error.
func TestLostPodWithAFinalizer(t *testing.T) {
	f := newFixture(t)
	id := f.createScheduled(f.request("px-lost-1"), "proxyfleet.test/hold")

	require.NoError(t, f.p.Delete(f.ctx, id))
	pod := f.pod(id)
	require.NotNil(t, pod.DeletionTimestamp)
	require.NotNil(t, pod.DeletionGracePeriodSeconds)
	assert.Equal(t, terminationGrace, *pod.DeletionGracePeriodSeconds)
	assert.Equal(t, provider.StateDeleting, f.get(id).State)

	later := f.at(func() time.Time { return pod.DeletionTimestamp.Add(lostMargin + time.Minute) })
	_, err := later.Get(f.ctx, id)
	require.ErrorIs(t, err, provider.ErrNotFound)

	require.NoError(t, later.Delete(f.ctx, id))
	forced := f.pod(id)
	require.NotNil(t, forced.DeletionGracePeriodSeconds)
	assert.Zero(t, *forced.DeletionGracePeriodSeconds, "deleted by force")
	_, err = later.Get(f.ctx, id)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	require.NoError(t, later.Delete(f.ctx, id))
}

// The force is for the pod judged lost only: a pod created since under the same name is
// deleted gracefully.
func TestLostPodForceNeedsTheSameUID(t *testing.T) {
	f := newFixture(t)
	req := f.request("px-lost-2")
	id := f.createScheduled(req)
	require.NoError(t, f.p.Delete(f.ctx, id))
	old := f.pod(id)

	stale := &Provider{Client: staleGet{Client: f.c, pod: old}, now: func() time.Time { return old.DeletionTimestamp.Add(time.Hour) }}
	// The old pod goes by force; a new one takes its name.
	require.NoError(t, stale.Delete(f.ctx, id))
	id = f.createScheduled(req)
	fresh := f.pod(id)
	require.NotEqual(t, old.UID, fresh.UID)

	// A Delete that still sees the old pod (a stale read) must not force the new one.
	err := stale.Delete(f.ctx, id)
	require.Error(t, err)
	assert.True(t, apierrors.IsConflict(err), "the UID precondition refused it: %v", err)
	assert.Equal(t, provider.KindTransient, provider.Class(err), "the next attempt reads the pod again")
	assert.Nil(t, f.pod(id).DeletionTimestamp, "the new pod is untouched")
}

// staleGet answers every Get of pod with the copy it holds.
type staleGet struct {
	client.Client
	pod *corev1.Pod
}

func (c staleGet) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if p, ok := obj.(*corev1.Pod); ok && key == client.ObjectKeyFromObject(c.pod) {
		c.pod.DeepCopyInto(p)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}
