package activities_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Kube: true}))
}

type fixture struct {
	testsuite.WorkflowTestSuite
	env  *testsuite.TestActivityEnvironment
	acts *activities.Activities
	ns   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	k := testenv.Kube(t)
	f := &fixture{acts: &activities.Activities{Kube: k.Client, Installation: "test"}}
	f.env = f.NewTestActivityEnvironment()
	f.env.RegisterActivity(f.acts)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "acts-"}}
	require.NoError(t, k.Client.Create(context.Background(), ns))
	f.ns = ns.Name
	return f
}

func (f *fixture) proxy(t *testing.T, name string) *v1alpha1.Proxy {
	t.Helper()
	p := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Finalizers: []string{v1alpha1.Finalizer}},
		Spec: v1alpha1.ProxySpec{Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
			HealthCheck: v1alpha1.HealthCheck{URL: "http://127.0.0.1:1/"}},
	}
	require.NoError(t, testenv.Kube(t).Client.Create(context.Background(), p))
	return p
}

func cond(typ, status, reason string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: metav1.ConditionStatus(status), Reason: reason, Message: reason}
}

func TestPublishStatusKeepsTransitionTimes(t *testing.T) {
	f := newFixture(t)
	k := testenv.Kube(t)
	p := f.proxy(t, "pub")
	healthy := cond(v1alpha1.ConditionHealthy, "True", v1alpha1.ReasonProbeSucceeded)
	anHourAgo := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	healthy.LastTransitionTime = anHourAgo
	in := activities.PublishInput{Namespace: f.ns, Name: "pub", UID: string(p.UID), Status: v1alpha1.ProxyStatus{
		Phase: v1alpha1.PhaseReady, IP: "127.0.0.1", Port: 3128, ObservedGeneration: 1,
		Conditions: []metav1.Condition{healthy},
	}}
	_, err := f.env.ExecuteActivity(f.acts.PublishStatus, in)
	require.NoError(t, err)
	var got v1alpha1.Proxy
	require.NoError(t, k.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "pub"}, &got))
	assert.Equal(t, "127.0.0.1", got.Status.IP)
	first := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionHealthy)
	require.NotNil(t, first)
	assert.Equal(t, int64(1), first.ObservedGeneration)

	// The workflow sends conditions without times; an unchanged status keeps its time.
	in.Status.Conditions[0].LastTransitionTime = metav1.Time{}
	in.Status.LatencyMillis = 40
	_, err = f.env.ExecuteActivity(f.acts.PublishStatus, in)
	require.NoError(t, err)
	require.NoError(t, k.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "pub"}, &got))
	assert.Equal(t, int64(40), got.Status.LatencyMillis)
	assert.True(t, anHourAgo.Equal(&meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionHealthy).LastTransitionTime))

	// A changed status gets a new time.
	in.Status.Conditions[0].Status = metav1.ConditionFalse
	_, err = f.env.ExecuteActivity(f.acts.PublishStatus, in)
	require.NoError(t, err)
	require.NoError(t, k.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "pub"}, &got))
	assert.True(t, meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionHealthy).LastTransitionTime.After(anHourAgo.Time))
}

func TestPublishStatusSkipsOtherObjects(t *testing.T) {
	f := newFixture(t)
	k := testenv.Kube(t)
	f.proxy(t, "same-name")
	in := activities.PublishInput{Namespace: f.ns, Name: "same-name", UID: "uid-of-a-deleted-object",
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseFailed}}
	_, err := f.env.ExecuteActivity(f.acts.PublishStatus, in)
	require.NoError(t, err)
	var got v1alpha1.Proxy
	require.NoError(t, k.Client.Get(context.Background(), types.NamespacedName{Namespace: f.ns, Name: "same-name"}, &got))
	assert.Empty(t, got.Status.Phase, "a workflow must not write the status of another object with its name")

	in.Name = "missing"
	_, err = f.env.ExecuteActivity(f.acts.PublishStatus, in)
	require.NoError(t, err, "a deleted Proxy is not an error")
}

func TestReleaseFinalizerOnlyWhenDeleting(t *testing.T) {
	f := newFixture(t)
	k := testenv.Kube(t)
	ctx := context.Background()
	p := f.proxy(t, "rel")
	ref := activities.ObjectRef{Namespace: f.ns, Name: "rel", UID: string(p.UID)}
	_, err := f.env.ExecuteActivity(f.acts.ReleaseFinalizer, ref)
	require.NoError(t, err)
	var got v1alpha1.Proxy
	require.NoError(t, k.Client.Get(ctx, types.NamespacedName{Namespace: f.ns, Name: "rel"}, &got))
	assert.Contains(t, got.Finalizers, v1alpha1.Finalizer, "not deleting: finalizer kept")

	require.NoError(t, k.Client.Delete(ctx, p))
	_, err = f.env.ExecuteActivity(f.acts.ReleaseFinalizer, activities.ObjectRef{Namespace: f.ns, Name: "rel", UID: "other"})
	require.NoError(t, err)
	require.NoError(t, k.Client.Get(ctx, types.NamespacedName{Namespace: f.ns, Name: "rel"}, &got), "other UID: finalizer kept")

	_, err = f.env.ExecuteActivity(f.acts.ReleaseFinalizer, ref)
	require.NoError(t, err)
	err = k.Client.Get(ctx, types.NamespacedName{Namespace: f.ns, Name: "rel"}, &got)
	assert.True(t, err != nil, "object should be gone once released")
}

func TestHashCloudInit(t *testing.T) {
	f := newFixture(t)
	k := testenv.Kube(t)
	ctx := context.Background()
	labelled := map[string]string{v1alpha1.LabelCloudInit: "true"}
	require.NoError(t, k.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "ok", Labels: labelled},
		Data: map[string][]byte{"script": []byte("secret-value-1")}}))
	require.NoError(t, k.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "unlabelled"},
		Data: map[string][]byte{"script": []byte("x")}}))

	hash := func(name, key string) (string, error) {
		v, err := f.env.ExecuteActivity(f.acts.HashCloudInit, activities.HashInput{Namespace: f.ns, Ref: v1alpha1.SecretKeyRef{Name: name, Key: key}})
		if err != nil {
			return "", err
		}
		var h string
		require.NoError(t, v.Get(&h))
		return h, nil
	}
	h1, err := hash("ok", "script")
	require.NoError(t, err)
	assert.Len(t, h1, 16)
	assert.NotContains(t, h1, "secret-value")

	for _, tc := range []struct{ name, secret, key, want string }{
		{"missing secret", "nope", "script", "not found"},
		{"missing label", "unlabelled", "script", "lacks the label"},
		{"missing key", "ok", "other", `has no key "other"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := hash(tc.secret, tc.key)
			require.Error(t, err)
			var appErr *temporal.ApplicationError
			require.ErrorAs(t, err, &appErr)
			assert.Equal(t, activities.ErrTypeCloudInit, appErr.Type())
			assert.Contains(t, appErr.Message(), tc.want)
		})
	}
}

// TestFindInstancesReadsTheReplacementCount: a run that starts without state learns how
// many replacements earlier runs published, only from its own object.
func TestFindInstancesReadsTheReplacementCount(t *testing.T) {
	f := newFixture(t)
	p := f.proxy(t, "counted")
	_, err := f.env.ExecuteActivity(f.acts.PublishStatus, activities.PublishInput{Namespace: f.ns, Name: "counted", UID: string(p.UID),
		Status: v1alpha1.ProxyStatus{Phase: v1alpha1.PhaseReady, Replacements: 7}})
	require.NoError(t, err)
	f.acts.Providers = provider.Registry{}
	find := func(uid string) activities.FindResult {
		t.Helper()
		v, err := f.env.ExecuteActivity(f.acts.FindInstances, activities.FindInput{ProxyUID: uid, Namespace: f.ns, Name: "counted"})
		require.NoError(t, err)
		var res activities.FindResult
		require.NoError(t, v.Get(&res))
		return res
	}
	assert.Equal(t, int32(7), find(string(p.UID)).Replacements)
	assert.Zero(t, find("another-object").Replacements, "another object's count is not ours")
}
