package controller_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// TestReview32cLeavingThePoolReachesTheRun: a Proxy's membership travels in the spec
// signal (SpecSignal.Pool, from its controller owner reference), and workflows/transitions.go
// relies on "a duplicate spec (every reconcile sends one)" to tell a run its Proxy left
// its pool, so that what waited for the pool's grant starts. But the Proxy controller
// reconciles only on generation changes and deletions: removing the owner reference (a
// metadata change) sends nothing. The run keeps Pool, keeps waiting
// (ReplacementPending=True), and no pool will ever grant it — the pool it names no longer
// lists it (IsControlledBy). The same gap leaves a run that took a pool-less spec (a v5
// run at the upgrade, see workflows' TestReview32cUpgradedMemberAsksAfterContinueAsNew)
// without its pool until the spec changes or the operator restarts.
func TestReview32cLeavingThePoolReachesTheRun(t *testing.T) {
	k := testenv.Kube(t)
	tc := &flakyTemporal{real: testenv.Temporal(t).Client}
	startController(t, tc)
	ctx := context.Background()
	ns := namespace(t)

	pl := pool(ns, "eu", 1)
	require.NoError(t, k.Client.Create(ctx, pl))
	t.Cleanup(func() {
		_ = k.Client.Patch(ctx, pl, ctrlclient.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
		_ = k.Client.Delete(ctx, pl)
	})
	p := proxy(ns, "eu-0")
	p.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "ProxyPool", Name: pl.Name, UID: pl.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	require.NoError(t, k.Client.Create(ctx, p))
	id := contract.ProxyWorkflowID(ns, "eu-0")
	require.Eventually(t, func() bool {
		s := tc.signals(id)
		return len(s) > 0 && s[len(s)-1].Pool == "eu"
	}, 30*time.Second, 50*time.Millisecond, "the member's run is told its pool")

	// The Proxy leaves the pool (kubectl edit, or an orphaning delete of the pool).
	require.NoError(t, k.Client.Patch(ctx, p, ctrlclient.RawPatch(types.MergePatchType, []byte(`{"metadata":{"ownerReferences":null}}`))))
	var got v1alpha1.Proxy
	require.NoError(t, k.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "eu-0"}, &got))
	require.Empty(t, got.OwnerReferences)

	ok := assert.Eventually(t, func() bool {
		s := tc.signals(id)
		return s[len(s)-1].Pool == ""
	}, 10*time.Second, 50*time.Millisecond, "the run is never told its Proxy left the pool: what waits for a grant waits for ever")
	if !ok {
		t.Logf("spec signals sent: %d, the last naming pool %q", len(tc.signals(id)), tc.signals(id)[len(tc.signals(id))-1].Pool)
	}
}
