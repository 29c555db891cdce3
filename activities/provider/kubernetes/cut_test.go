package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// errCut is the error of the call a create was cut short at.
var errCut = errors.New("cut short here")

// cut is a connection to the API server that is lost at one call, the at-th (from 0,
// reads counted too). With after false the call never reaches the server (the worker died
// before sending it); with after true the server carries it out and the answer is lost
// (the worker died before reading it). Every call after the cut fails too: the worker is
// gone.
type cut struct {
	client.Client
	at    int
	after bool

	mu    sync.Mutex
	calls []string
}

func (c *cut) call(verb string, obj any, do func() error) error {
	c.mu.Lock()
	n := len(c.calls)
	c.calls = append(c.calls, verb+" "+reflect.TypeOf(obj).Elem().Name())
	c.mu.Unlock()
	switch {
	case n < c.at:
		return do()
	case n == c.at && c.after:
		_ = do()
	}
	return fmt.Errorf("%s: %w", c.calls[n], errCut)
}

// made is how many calls were made, the cut one included.
func (c *cut) made() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

func (c *cut) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.call("get", obj, func() error { return c.Client.Get(ctx, key, obj, opts...) })
}

func (c *cut) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.call("list", list, func() error { return c.Client.List(ctx, list, opts...) })
}

func (c *cut) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	return c.call("create", obj, func() error { return c.Client.Create(ctx, obj, opts...) })
}

func (c *cut) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	return c.call("update", obj, func() error { return c.Client.Update(ctx, obj, opts...) })
}

func (c *cut) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.call("patch", obj, func() error { return c.Client.Patch(ctx, obj, patch, opts...) })
}

func (c *cut) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	return c.call("delete", obj, func() error { return c.Client.Delete(ctx, obj, opts...) })
}

// assertOnlyDependents checks that every Secret and NetworkPolicy labelled as req's
// instance is a dependent of the instance's pod as it exists now. The workflow and the
// sweeper find instances by listing pods; whatever is not the dependent of a pod they can
// find would be left behind forever once the run that made it lost its state, and
// whatever is, the garbage collector deletes with the pod.
func (f *fixture) assertOnlyDependents(req provider.CreateRequest, when string) {
	f.t.Helper()
	var pod corev1.Pod
	err := f.c.Get(f.ctx, client.ObjectKey{Namespace: podNamespace(req), Name: req.Name}, &pod)
	if !apierrors.IsNotFound(err) {
		require.NoError(f.t, err)
	}
	mine := client.MatchingLabels{provider.LabelProxyUID: req.ProxyUID, labelInstance: req.Name}
	var secrets corev1.SecretList
	require.NoError(f.t, f.c.List(f.ctx, &secrets, client.InNamespace(podNamespace(req)), mine))
	var policies networkingv1.NetworkPolicyList
	require.NoError(f.t, f.c.List(f.ctx, &policies, client.InNamespace(podNamespace(req)), mine))
	var deps []client.Object
	for i := range secrets.Items {
		deps = append(deps, &secrets.Items[i])
	}
	for i := range policies.Items {
		deps = append(deps, &policies.Items[i])
	}
	for _, dep := range deps {
		if assert.NoError(f.t, err, "%s: %T %s exists without a pod to go with", when, dep, dep.GetName()) {
			assert.True(f.t, dependentOf(dep, &pod), "%s: %T %s is not a dependent of its pod (owners %v, pod %s)",
				when, dep, dep.GetName(), dep.GetOwnerReferences(), pod.UID)
		}
	}
}

// TestCreateCutShortLeavesNothingWithoutItsPod cuts a Create short at every API call in
// turn, before the server carried it out and after. No cluster garbage collector runs
// here, so what the check after each cut finds is what the cut left. Then the workflow's
// retry follows, with the same fleet key or with one made primary since, and must make a
// working instance.
func TestCreateCutShortLeavesNothingWithoutItsPod(t *testing.T) {
	for _, rotated := range []bool{false, true} {
		for _, after := range []bool{false, true} {
			for at := 0; ; at++ {
				var done bool
				t.Run(fmt.Sprintf("rotated=%v/after=%v/call=%d", rotated, after, at), func(t *testing.T) {
					f := newFixture(t)
					f.p.ProbeFrom = WorkerPeer("fleet", map[string]string{"app": "worker"})
					req := f.request("px-cut-0")
					c := &cut{Client: f.c, at: at, after: after}
					p := *f.p
					p.Client = c
					_, err := p.Create(f.ctx, req)
					if done = c.made() <= at; done {
						require.NoError(t, err, "not cut: the create completes")
					} else {
						require.ErrorIs(t, err, errCut)
						t.Logf("cut at %q after %v", c.calls[at], c.calls[:at])
					}
					f.assertOnlyDependents(req, "after the cut")

					retry := req
					if rotated {
						retry.KeyID, retry.Credentials.Password = "fedc9876", "kube-canary-rotated"
					}
					inst := f.createRetrying(retry)
					f.assertOnlyDependents(req, "after the retry")
					f.assertWorking(inst, req, retry)
				})
				if done {
					break
				}
				require.Less(t, at, 20, "a create of three objects makes no more calls than that")
			}
		}
	}
}

// createRetrying runs Create as the workflow would: again after each transient error.
func (f *fixture) createRetrying(req provider.CreateRequest) provider.Instance {
	f.t.Helper()
	for try := 1; ; try++ {
		inst, err := f.p.Create(f.ctx, req)
		if err == nil {
			return inst
		}
		require.Equal(f.t, provider.KindTransient, provider.Class(err), "%v", err)
		require.Less(f.t, try, 3, "still failing: %v", err)
		f.t.Logf("attempt %d: %v", try, err)
	}
}

// assertWorking checks that inst is a complete instance: its pod, its policy as this
// worker makes it, and its Secret holding the configuration for the credentials of the key
// the pod's label names (the one the workflow learns from inst), whichever of the
// requests reqs made it.
func (f *fixture) assertWorking(inst provider.Instance, reqs ...provider.CreateRequest) {
	f.t.Helper()
	pod := f.pod(inst.ProviderID)
	assert.Equal(f.t, pod.Labels[provider.LabelKeyID], inst.Labels[provider.LabelKeyID])
	var made *provider.CreateRequest
	for i := range reqs {
		if reqs[i].KeyID == pod.Labels[provider.LabelKeyID] {
			made = &reqs[i]
		}
	}
	require.NotNil(f.t, made, "the pod's key %q is none of the requests'", pod.Labels[provider.LabelKeyID])
	secret, policy := f.dependents(*made)
	files, err := renderConfig(*made)
	require.NoError(f.t, err)
	assert.Equal(f.t, buildConfigSecret(*made, files).Data, secret.Data, "the configuration for the pod's credentials")
	assert.Equal(f.t, pod.Labels[provider.LabelKeyID], secret.Labels[provider.LabelKeyID])
	assert.Equal(f.t, buildNetworkPolicy(*made, f.p.ProbeFrom).Spec, policy.Spec)
	for _, dep := range []client.Object{secret, policy} {
		assert.True(f.t, dependentOf(dep, pod), "%T is the pod's dependent", dep)
	}
}

// dependentOf reports whether dep names pod as an owner, so the garbage collector deletes
// it with the pod.
func dependentOf(dep client.Object, pod *corev1.Pod) bool {
	for _, ref := range dep.GetOwnerReferences() {
		if ref.APIVersion == "v1" && ref.Kind == "Pod" && ref.Name == pod.Name && ref.UID == pod.UID {
			return true
		}
	}
	return false
}

// A pod whose create was cut short before its Secret waits for it. The retry gives it the
// Secret when it renders the configuration the pod was made for; otherwise (the fleet key
// rotated, the spec changed) the pod, which never ran, is deleted and made anew, so that
// its key label never names other credentials than Squid requires.
func TestCreateCompletesOrRemakesAPodWithoutItsSecret(t *testing.T) {
	tests := []struct {
		name string
		// earlier edits the request the pod was made from.
		earlier func(*provider.CreateRequest)
		// remade is whether the pod is deleted and made anew.
		remade bool
	}{
		{name: "the same request", earlier: func(*provider.CreateRequest) {}},
		{
			name:    "another fleet key",
			earlier: func(r *provider.CreateRequest) { r.KeyID, r.Credentials.Password = "fedc9876", "kube-canary-old-key" },
			remade:  true,
		},
		{
			name:    "another spec",
			earlier: func(r *provider.CreateRequest) { r.SpecHash = "00000000000000aa" },
			remade:  true,
		},
		{
			name:    "another port, before spec hashes",
			earlier: func(r *provider.CreateRequest) { r.SpecHash, r.Port = "", 8080 },
			remade:  true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			req := f.request("px-nosecret-0")
			req.SpecHash = "00000000000000bb"
			earlier := req
			tc.earlier(&earlier)
			before := buildPod(earlier)
			require.NoError(t, f.c.Create(f.ctx, before))

			inst, err := f.p.Create(f.ctx, req)
			if tc.remade {
				require.Error(t, err)
				assert.Equal(t, provider.KindTransient, provider.Class(err), "the next attempt makes it: %v", err)
				_, err = f.p.Get(f.ctx, f.p.ProviderID(req))
				require.ErrorIs(t, err, provider.ErrNotFound, "the pod is deleted")
				f.assertNoDependents(req)
				inst = f.create(req)
			} else {
				require.NoError(t, err)
			}
			pod := f.pod(inst.ProviderID)
			assert.Equal(t, tc.remade, pod.UID != before.UID, "remade")
			assert.Equal(t, req.KeyID, pod.Labels[provider.LabelKeyID])
			f.assertWorking(inst, req)
			f.assertOnlyDependents(req, "after the create")
		})
	}
}
