package life

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// surgeWatch is what watchSurge saw of a pool while every member was replaced.
type surgeWatch struct {
	// replacing and instances are the most members replacing and instances seen at once;
	// asked counts the looks that saw a member waiting for the pool's grant.
	replacing, instances, asked int
}

// poolMembers lists pool's Proxies.
func poolMembers(t *testing.T, s *stack.Stack, ns, pool string) []v1alpha1.Proxy {
	t.Helper()
	var list v1alpha1.ProxyList
	require.NoError(t, s.Kube.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelPool: pool}))
	return list.Items
}

// watchSurge looks at pool's n members until each serves from another instance than the
// one first[name] names and is Ready, failing the test at the first look that sees more
// than surge members replacing (phase Replacing, or an instance given up and not deleted)
// or more than n+surge instances at the provider.
func watchSurge(t *testing.T, s *stack.Stack, ns, pool string, n, surge int, first map[string]string) surgeWatch {
	t.Helper()
	var seen surgeWatch
	deadline := time.Now().Add(5 * time.Minute)
	for {
		ms := poolMembers(t, s, ns, pool)
		replacing, instances, done := 0, 0, len(ms) == n
		for i := range ms {
			m := &ms[i]
			if m.Status.Phase == v1alpha1.PhaseReplacing || m.Status.RetiringInstances > 0 {
				replacing++
			}
			if c := findCondition(m.Status.Conditions, v1alpha1.ConditionReplacementPending); c != nil && c.Status == metav1.ConditionTrue {
				seen.asked++
			}
			instances += len(s.InstancesOf(m.UID))
			done = done && stack.Ready(m) && m.Status.Phase == v1alpha1.PhaseReady &&
				m.Status.InstanceName != "" && m.Status.InstanceName != first[m.Name]
		}
		seen.replacing, seen.instances = max(seen.replacing, replacing), max(seen.instances, instances)
		require.LessOrEqual(t, replacing, surge, "more members replacing at once than maxSurge allows")
		require.LessOrEqual(t, instances, n+surge, "more instances than replicas + maxSurge")
		if done {
			return seen
		}
		require.True(t, time.Now().Before(deadline), "not every member was replaced")
		time.Sleep(100 * time.Millisecond) // polling the stack, not synchronising
	}
}

// instanceNames maps pool's members to the instance each serves from now.
func instanceNames(t *testing.T, s *stack.Stack, ns, pool string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range poolMembers(t, s, ns, pool) {
		out[m.Name] = m.Status.InstanceName
	}
	return out
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}
