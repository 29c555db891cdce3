package recovery

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// startWorkerProcess runs cmd/worker against the stack, as a process the test can kill -9.
func startWorkerProcess(t *testing.T, s *stack.Stack, kubeconfig string) *testenv.Process {
	t.Helper()
	w := testenv.LoggedProcess(t, "worker", testenv.Command(t, "worker"), []string{"KUBECONFIG=" + kubeconfig, "PROXYFLEET_FLEET_KEY=" + s.FleetKey},
		"--temporal-address", s.Temporal.HostPort,
		"--temporal-namespace", s.Temporal.Namespace,
		"--task-queue", s.TaskQueue,
		"--installation", s.Installation,
		"--providers", "local",
		"--local-daemon", s.DaemonURL,
		"--http-address", "127.0.0.1:0",
		// The proxy-gc schedule is one per Temporal namespace; the GC test owns it here.
		"--gc-interval", "0",
	)
	require.NoError(t, w.Start())
	return w
}

// TestWorkerCrashDuringCreates kills the worker with SIGKILL while 20 Proxies are being
// created, restarts it, and checks that exactly 20 instances exist: none duplicated, none
// leaked.
func TestWorkerCrashDuringCreates(t *testing.T) {
	const n = 20
	s := stack.Start(t, stack.Options{NoWorker: true, ProvisionDelay: 1500 * time.Millisecond})
	kubeconfig := s.Kube.Kubeconfig(t)
	w := startWorkerProcess(t, s, kubeconfig)

	ctx := context.Background()
	ns := s.Namespace(t)
	uids := map[string]bool{}
	var names []string
	for i := range n {
		p := s.LocalProxy(ns, fmt.Sprintf("crash-%02d", i))
		require.NoError(t, s.Kube.Client.Create(ctx, p))
		uids[string(p.UID)] = true
		names = append(names, p.Name)
	}

	// Kill once some instances exist and others are still being created.
	require.Eventually(t, func() bool {
		c := 0
		for _, e := range s.Events() {
			if e.Op == "create" {
				c++
			}
		}
		return c >= 5
	}, time.Minute, 10*time.Millisecond, "creates never started")
	require.NoError(t, w.Kill())
	createdBeforeRestart := len(s.Daemon.List(map[string]string{provider.LabelInstallation: s.Installation}))
	t.Logf("killed the worker with %d of %d instances created", createdBeforeRestart, n)
	startWorkerProcess(t, s, kubeconfig)

	for _, name := range names {
		s.WaitFor(t, ns, name, 3*time.Minute, "Ready after the worker restart", stack.Ready)
	}
	instances := s.Daemon.List(map[string]string{provider.LabelInstallation: s.Installation})
	assert.Len(t, instances, n, "exactly one instance per Proxy")
	seen := map[string]bool{}
	for _, inst := range instances {
		uid := inst.Labels[provider.LabelProxyUID]
		assert.True(t, uids[uid], "instance %s belongs to no Proxy", inst.Name)
		assert.False(t, seen[uid], "two instances for Proxy UID %s", uid)
		seen[uid] = true
	}
	creates := 0
	for _, e := range s.Events() {
		if e.Op == "create" {
			creates++
		}
		assert.NotEqual(t, "delete", e.Op, "nothing should have been deleted: %+v", e)
	}
	assert.Equal(t, n, creates, "each instance created exactly once")

	// Every Proxy still goes away cleanly after the crash.
	for _, name := range names {
		require.NoError(t, s.Kube.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: s.LocalProxy(ns, name).ObjectMeta}))
	}
	for _, name := range names {
		s.WaitGone(t, ns, name, 2*time.Minute)
	}
	assert.Empty(t, s.Daemon.List(map[string]string{provider.LabelInstallation: s.Installation}), "instances leaked")
}
