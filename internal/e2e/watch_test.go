package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/stack"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
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
		require.NoError(tb, ctx.Err(), "only %d of %d Proxies Ready within %s", len(ready), n, within)
	}
}
