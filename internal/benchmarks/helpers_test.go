// What the benchmarks on the test stack share: applying a fleet and waiting for it to be
// Ready, counting its history, and reading their settings from the environment.

package benchmarks

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// waitAllReady watches the namespace's Proxies until n of them are Ready and returns them.
// A watch costs the API server one event per change; listing 1,000 Proxies every few
// seconds instead made the benchmark itself a large share of the kube-apiserver's CPU.
func waitAllReady(tb testing.TB, s *stack.Stack, ns string, n int, within time.Duration) map[string]*v1alpha1.Proxy {
	tb.Helper()
	wc, err := client.NewWithWatch(s.Kube.Config, client.Options{Scheme: s.Kube.Scheme})
	require.NoError(tb, err)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		ready := map[string]*v1alpha1.Proxy{} // a fresh count each time the list is read
		var list v1alpha1.ProxyList
		require.NoError(tb, wc.List(ctx, &list, client.InNamespace(ns)))
		for i := range list.Items {
			if p := &list.Items[i]; stack.Ready(p) {
				ready[p.Name] = p
			}
		}
		if len(ready) >= n {
			return ready
		}
		w, err := wc.Watch(ctx, &v1alpha1.ProxyList{}, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.ResourceVersion}})
		require.NoError(tb, err)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*v1alpha1.Proxy)
			if !ok {
				continue
			}
			if ev.Type != watch.Deleted && stack.Ready(p) {
				ready[p.Name] = p
			} else {
				delete(ready, p.Name)
			}
			if len(ready) >= n {
				w.Stop()
				return ready
			}
		}
		// The watch ended (timeout or a compaction): list again, unless time is up.
		if ctx.Err() != nil {
			tb.Fatalf("only %d of %d Proxies Ready within %s; not Ready: %s", len(ready), n, within, notReady(s, ns, ready))
		}
	}
}

// notReady describes up to 5 of the namespace's Proxies missing from ready: their phase
// and conditions, so a fleet that never settles says why.
func notReady(s *stack.Stack, ns string, ready map[string]*v1alpha1.Proxy) string {
	var list v1alpha1.ProxyList
	if err := s.Kube.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	var out []string
	for i := range list.Items {
		p := &list.Items[i]
		if ready[p.Name] != nil || len(out) == 5 {
			continue
		}
		desc := fmt.Sprintf("%s phase %s", p.Name, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			good := metav1.ConditionTrue
			if c.Type == v1alpha1.ConditionQuotaExceeded {
				good = metav1.ConditionFalse
			}
			if c.Status != good {
				desc += fmt.Sprintf(" %s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
			}
		}
		out = append(out, desc)
	}
	return strings.Join(out, "; ")
}

// applyFleet creates n local Proxies named prefix-0000, prefix-0001…, 16 at a time, as a
// user applying a fleet would; shape adjusts each before it is created. It returns their
// names in order.
func applyFleet(tb testing.TB, s *stack.Stack, ns, prefix string, n int, shape func(i int, p *v1alpha1.Proxy)) []string {
	tb.Helper()
	names := make([]string, n)
	var g errgroup.Group
	g.SetLimit(16)
	for i := range n {
		names[i] = fmt.Sprintf("%s-%04d", prefix, i)
		g.Go(func() error {
			p := s.LocalProxy(ns, names[i])
			if shape != nil {
				shape(i, p)
			}
			return s.Kube.Client.Create(context.Background(), p)
		})
	}
	require.NoError(tb, g.Wait())
	return names
}

// fleetHistory sums the history events of the named Proxies' workflows.
func fleetHistory(b *testing.B, s *stack.Stack, ns string, names []string) int64 {
	b.Helper()
	var total int64
	for _, name := range names {
		total += historyLength(b, s.Temporal.Client, contract.ProxyWorkflowID(ns, name))
	}
	return total
}

// envInt is the benchmark setting in the environment variable name, or def when unset.
func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(tb, err, name)
	return n
}

// envDuration is the benchmark duration in the environment variable name, or def when unset.
func envDuration(tb testing.TB, name string, def time.Duration) time.Duration {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	require.NoError(tb, err, name)
	return d
}
