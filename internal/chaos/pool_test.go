//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestPoolSurvivesKillsDuringScaleAndRollout kills the operator and the worker with
// SIGKILL while a pool scales up, and again while it rolls a template change through its
// Proxies: once both are back the pool ends at its desired count, every Proxy Ready on the
// current template with exactly one instance, and no instance of the pool is left over or
// doubled.
func TestPoolSurvivesKillsDuringScaleAndRollout(t *testing.T) {
	cfg := loadConfig(t)
	n := max(cfg.proxies/2, 10)
	s := stack.Start(t, stack.Options{NoWorker: true, NoController: true, ProvisionDelay: 500 * time.Millisecond})
	sys := &system{s: s, ns: s.Namespace(t), cfg: cfg}
	sys.startControlPlane(t)
	ctx := context.Background()

	pool := &v1alpha1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: sys.ns, Name: "chaos"},
		Spec: v1alpha1.ProxyPoolSpec{
			Replicas: ptr.To(int32(2)),
			Template: v1alpha1.ProxyTemplate{Spec: stack.Tagged(s.LocalProxy(sys.ns, "template"), sys.ns).Spec},
			Strategy: v1alpha1.PoolStrategy{MaxSurge: ptr.To(intstr.FromInt32(2)), MaxUnavailable: ptr.To(intstr.FromInt32(0))},
		},
	}
	require.NoError(t, s.Kube.Client.Create(ctx, pool))
	settled(t, sys, pool, 2, 0)

	edit := func(change func(*v1alpha1.ProxyPool)) {
		require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
			if err := s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
				return err
			}
			change(pool)
			return s.Kube.Client.Update(ctx, pool)
		}))
	}
	killBoth := func(what string) {
		before := len(s.Events())
		waitFor(t, time.Minute, what+" to reach the provider", func() string {
			if len(s.Events()) == before {
				return "no provider call yet"
			}
			return ""
		})
		sys.operator.kill(t)
		sys.worker.kill(t)
		time.Sleep(cfg.outage) // the outage's length, not a wait for anything
		sys.worker.start(t)
		sys.operator.start(t)
	}

	// Scale-up.
	edit(func(p *v1alpha1.ProxyPool) { p.Spec.Replicas = ptr.To(int32(n)) })
	killBoth("the scale-up")
	settled(t, sys, pool, n, 0)

	// A rollout: every instance replaced, two at a time.
	edit(func(p *v1alpha1.ProxyPool) { p.Spec.Template.Spec.Port = 3129 })
	killBoth("the rollout")
	settled(t, sys, pool, n, 3129)
}

// settled waits until the pool has want Proxies, each Ready on the current template (port,
// when not 0) with one instance of its own, and the daemon holds exactly those instances
// for the pool's Proxies: none leaked, none doubled.
func settled(t *testing.T, sys *system, pool *v1alpha1.ProxyPool, want int, port int32) {
	t.Helper()
	s := sys.s
	ctx := context.Background()
	start := time.Now()
	waitFor(t, sys.cfg.settle, fmt.Sprintf("the pool at %d Proxies, one instance each", want), func() string {
		var p v1alpha1.ProxyPool
		if err := s.Kube.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
			return err.Error()
		}
		var list v1alpha1.ProxyList
		if err := s.Kube.Client.List(ctx, &list, client.InNamespace(sys.ns), client.MatchingLabels{v1alpha1.LabelPool: pool.Name}); err != nil {
			return err.Error()
		}
		if len(list.Items) != want {
			return fmt.Sprintf("%d Proxies", len(list.Items))
		}
		uids := map[string]bool{}
		for i := range list.Items {
			px := &list.Items[i]
			if !stack.Ready(px) || px.Status.ObservedGeneration != px.Generation || (port != 0 && px.Spec.Port != port) {
				return px.Name + " not Ready on the current template: " + string(px.Status.Phase)
			}
			if got := s.InstancesOf(px.UID); len(got) != 1 {
				return fmt.Sprintf("%s has %d instances", px.Name, len(got))
			}
			uids[string(px.UID)] = true
		}
		// Every instance of this installation belongs to a Proxy of the pool.
		for _, inst := range s.Daemon.List(map[string]string{provider.LabelInstallation: s.Installation}) {
			if !uids[inst.Labels[provider.LabelProxyUID]] {
				return "an instance of no Proxy of the pool: " + inst.Name
			}
		}
		if p.Status.ReadyReplicas != int32(want) {
			return fmt.Sprintf("the pool counts %d Ready", p.Status.ReadyReplicas)
		}
		return ""
	})
	t.Logf("pool at %d settled within %s of this check", want, time.Since(start).Round(100*time.Millisecond))
}
