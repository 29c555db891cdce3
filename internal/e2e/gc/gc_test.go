package gc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	kubeprovider "github.com/proxyfleet/proxyfleet/activities/provider/kubernetes"
	"github.com/proxyfleet/proxyfleet/activities/provider/local"
	"github.com/proxyfleet/proxyfleet/internal/e2e"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/internal/schedules"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestScheduledGCDeletesExactlyTheOrphans plants instances outside any Proxy, with the
// local and kubernetes providers, then runs the real "proxy-gc" schedule: only this
// installation's orphans go; live proxies, other installations and unlabelled instances
// stay; two triggers at once make one sweep.
func TestScheduledGCDeletesExactlyTheOrphans(t *testing.T) {
	s := stack.Start(t, stack.Options{})
	ctx := context.Background()
	ns := s.Namespace(t)

	// A live Proxy, whose instance must survive.
	require.NoError(t, s.Kube.Client.Create(ctx, s.LocalProxy(ns, "keep")))
	live := s.WaitFor(t, ns, "keep", time.Minute, "Ready", stack.Ready)

	hoursAgo := time.Now().Add(-2 * time.Hour)
	labels := func(uid, installation string) map[string]string {
		return map[string]string{provider.LabelProxyUID: uid, provider.LabelInstallation: installation, provider.LabelManagedBy: provider.ManagedByValue}
	}
	plant := func(name string, l map[string]string) {
		_, err := s.Local.CreateRaw(ctx, name, local.CreateRequest{Labels: l, CreatedAt: &hoursAgo,
			Auth: local.NewAuth(proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: "planted-" + name})})
		require.NoError(t, err)
	}
	plant("orphan-local", labels("gone-uid-1", s.Installation))
	plant("other-installation", labels("gone-uid-2", "someone-else"))
	plant("unlabelled", nil)
	plant("live-uid", labels(string(live.UID), s.Installation))

	pods := &kubeprovider.Provider{Client: s.Kube.Client}
	podReq := func(name, uid, installation string) provider.CreateRequest {
		return provider.CreateRequest{Name: name, ProxyUID: uid, Installation: installation, Namespace: ns, Port: 3128,
			Spec:        v1alpha1.ProxySpec{Provider: v1alpha1.ProviderKubernetes, Kubernetes: &v1alpha1.KubernetesSpec{}},
			Credentials: proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: "planted-" + name}}
	}
	_, err := pods.Create(ctx, podReq("orphan-pod", "gone-uid-3", s.Installation))
	require.NoError(t, err)
	_, err = pods.Create(ctx, podReq("other-pod", "gone-uid-4", "someone-else"))
	require.NoError(t, err)
	// Pods cannot be back-dated: wait until they are older than the minimum age.
	const minAge = 3 * time.Second
	require.Eventually(t, func() bool {
		var p corev1.Pod
		err := s.Kube.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "orphan-pod"}, &p)
		return err == nil && time.Since(p.CreationTimestamp.Time) > minAge+time.Second
	}, time.Minute, 100*time.Millisecond)

	// The schedule's runs go to a queue nobody polls yet, so the first run is still running
	// when the second trigger comes.
	gcQueue := s.TaskQueue + "-gc"
	sc := s.Temporal.Client.ScheduleClient()
	opts := schedules.GCOptions{Every: time.Hour, TaskQueue: gcQueue, Input: workflows.GCInput{
		Installation: s.Installation, MinAge: minAge,
		Providers: []v1alpha1.Provider{v1alpha1.ProviderKubernetes, v1alpha1.ProviderLocal},
	}}
	// The schedule is one per namespace: start from none, whatever earlier tests left.
	_ = sc.GetHandle(ctx, contract.GCScheduleID).Delete(ctx)
	require.NoError(t, schedules.EnsureGC(ctx, sc, opts))
	require.NoError(t, schedules.EnsureGC(ctx, sc, opts), "creating the schedule again is an update")
	h := sc.GetHandle(ctx, contract.GCScheduleID)
	t.Cleanup(func() { _ = h.Delete(context.Background()) })
	for range 2 {
		require.NoError(t, h.Trigger(ctx, client.ScheduleTriggerOptions{Overlap: enums.SCHEDULE_OVERLAP_POLICY_SKIP}))
	}
	var run string
	require.Eventually(t, func() bool {
		d, err := h.Describe(ctx)
		if err != nil || d.Info.NumActions < 1 || len(d.Info.RecentActions) == 0 {
			return false
		}
		run = d.Info.RecentActions[0].StartWorkflowResult.WorkflowID
		return true
	}, 30*time.Second, 100*time.Millisecond, "the schedule never started a sweep")

	w := s.NewWorker(t, gcQueue)
	defer w.Stop()
	require.NoError(t, w.Start(ctx))
	var res workflows.GCResult
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	require.NoError(t, s.Temporal.Client.GetWorkflow(wctx, run, "").Get(wctx, &res), "the sweep did not finish")
	e2e.RecordHistory(t, s, run, "gc-sweep.json")

	d, err := h.Describe(ctx)
	require.NoError(t, err)
	// The second trigger is skipped for overlap (or coalesced with the first by the
	// scheduler); either way there was one sweep.
	assert.Equal(t, 1, d.Info.NumActions, "two triggers at once must run one sweep")

	var deleted []string
	for _, it := range res.Deleted {
		deleted = append(deleted, it.Name)
	}
	assert.ElementsMatch(t, []string{"orphan-local", "orphan-pod"}, deleted, "result: %+v", res)
	assert.Empty(t, res.Errors)
	_, ok := s.Daemon.Get("orphan-local")
	assert.False(t, ok, "orphan local instance still there")
	for _, name := range []string{"other-installation", "unlabelled", "live-uid", live.Status.InstanceName} {
		_, ok := s.Daemon.Get(name)
		assert.True(t, ok, "%s was deleted but is not an orphan", name)
	}
	_, err = pods.Get(ctx, ns+"/orphan-pod")
	if err == nil {
		// A pod may linger in Terminating; it must at least be on its way out.
		inst, _ := pods.Get(ctx, ns+"/orphan-pod")
		assert.Equal(t, provider.StateDeleting, inst.State)
	}
	_, err = pods.Get(ctx, ns+"/other-pod")
	assert.NoError(t, err, "another installation's pod was deleted")
	spared := map[string]string{}
	for _, it := range res.Spared {
		spared[it.Name] = it.Reason
	}
	_, listed := spared["other-installation"]
	assert.False(t, listed, "providers list only this installation's instances")
	assert.Equal(t, workflows.GCReasonLiveProxy, spared["live-uid"])
	assert.Equal(t, workflows.GCReasonLiveProxy, spared[live.Status.InstanceName])
	s.WaitFor(t, ns, "keep", 10*time.Second, "still Ready", stack.Ready)
}
