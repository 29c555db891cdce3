package aws_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
)

// TestReview33bMismatchUnderPurgedTokenRetriesForever
//
// Defect: the IdempotentParameterMismatch fix only works while EC2 still LISTS the
// terminated instance under the token (DescribeInstances shows terminated instances for
// "usually less than one hour"), but EC2 holds a client token for at least 24 hours
// after its instance is terminated. Between the two, a create of a reused name with other
// parameters (its shared group swept and made again with a new ID — the sweep deletes
// an unused group past the 10-minute minimum age — or a spec edited since) gets
// IdempotentParameterMismatch, terminated() finds nothing, and the error is classified
// transient: every attempt fails the same way, the workflow keeps the same name (a
// transient create failure does not retire it), and the Proxy is wedged for up to a day.
// Names are reused in practice: see workflows' TestReview33bUnpublishedReplacementNameIsReused.
func TestReview33bMismatchUnderPurgedTokenRetriesForever(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	ctx := context.Background()
	req := request("px-purged-2", "uid-purged")
	s.Forget(terminatedAfterCreate(t, s, p, req).ID) // no longer listed; its token still held
	// The sweep: the group is unused now, and deleted.
	list, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	require.Len(t, list, 1, "the unused group")
	require.NoError(t, p.Delete(ctx, list[0].ProviderID))
	require.Empty(t, s.SecurityGroups())

	// Two hours later (the instance is no longer listed, its token still held), a later
	// run creates under the same name.
	// (Fixed: the token is the name and a hash of the request, so a request that differs
	// is a new instance, made once however often it is asked for.)
	for attempt := range 3 {
		again, err := p.Create(ctx, req)
		require.NoError(t, err, "attempt %d: the same transient error on every attempt for as long as EC2 keeps the token", attempt)
		_, err = p.Get(ctx, again.ProviderID)
		assert.NoError(t, err, "a new instance under the name")
	}
	assert.Len(t, s.Live(), 1, "one new instance, however often asked for")
}

// TestReview33bSkewedWorkerClock
//
// Defect: fresh() compares EC2's LaunchTime (EC2's clock) with the worker's local clock
// (p.now()). The AWS SDK corrects its request signing for clock skew, so a worker whose
// clock is off keeps working against EC2, but the provider's notion of "launched less
// than 10 minutes ago" does not:
//   - clock ahead by more than listLag: a just-launched instance EC2 does not list yet is
//     never fresh, so Get reports it gone and Delete returns success without
//     terminating it — the very leak the fix was for (TestReview33UnlistedNewInstance…);
//   - clock behind (or any launch time in the future): an instance that is gone and no
//     longer listed stays "not listed yet" for skew+10 minutes, so DeleteInstance (which
//     waits for ErrNotFound) and WaitRunning never conclude.
func TestReview33bSkewedWorkerClock(t *testing.T) {
	t.Run("ahead: a new instance is taken for gone and leaks", func(t *testing.T) {
		s := ec2test.NewServer(t)
		srv, lag := laggingEC2(t, s)
		p := providerAt(t, s, srv.URL, machine(), func() time.Time { return time.Now().Add(15 * time.Minute) })
		ctx := context.Background()
		in, err := p.Create(ctx, request("px-skew-1", "uid-skew"))
		require.NoError(t, err)
		lag.Store(true) // EC2 does not list the new instance yet
		_, err = p.Get(ctx, in.ProviderID)
		assert.NotErrorIs(t, err, provider.ErrNotFound, "an instance launched a moment ago is reported gone")
		err = p.Delete(ctx, in.ProviderID)
		lag.Store(false)
		if err == nil {
			for _, i := range s.Instances() {
				assert.Contains(t, []string{"shutting-down", "terminated"}, i.State,
					"Delete reported success, yet %s runs on, forgotten", i.ID)
			}
		}
	})
	t.Run("behind: a gone instance is never reported gone", func(t *testing.T) {
		// Launched two hours ago by EC2's clock, terminated and no longer listed; to a
		// worker two hours behind, the launch was a moment ago.
		s := ec2test.NewServer(t)
		p := providerAt(t, s, s.URL, machine(), func() time.Time { return time.Now().Add(-2 * time.Hour) })
		launched := time.Now().Add(-2 * time.Hour)
		id := s.AddInstance(ec2test.Instance{State: "terminated", LaunchTime: launched,
			Tags: map[string]string{"proxyfleet-instance": "px-skew-2", provider.LabelInstallation: "inst-a"}})
		s.Forget(id)
		_, err := p.Get(context.Background(), fmt.Sprintf("%s/px-skew-2/%s/%d", ec2test.Region, id, launched.Unix()))
		assert.ErrorIs(t, err, provider.ErrNotFound, "an instance gone from every list is reported 'not listed yet'")
	})
}

// TestReview33bSweepCannotDeleteWhatItLists
//
// Defect: ListOwned finds instances by their ownership tags and reports the short provider
// ID "<region>/<name>"; Delete of that ID looks the instance up again by CLIENT TOKEN (and
// the name tag), and an instance not found that way is "already gone": success. An
// instance that carries the tags but not the token — one made from a proxy with the
// console's "Launch more like this" or an AWS Backup restore, both of which copy tags —
// is therefore listed by every sweep, judged an orphan, "deleted" (counted in
// proxyfleet_gc_deleted_total) and left running, every sweep, forever. The EC2 ID the
// listing had in hand is thrown away.
func TestReview33bSweepCannotDeleteWhatItLists(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	ctx := context.Background()
	id := s.AddInstance(ec2test.Instance{PublicIP: "198.51.100.9", LaunchTime: time.Now().Add(-48 * time.Hour), Tags: map[string]string{
		provider.LabelInstallation: "inst-a", provider.LabelProxyUID: "uid-gone", provider.LabelManagedBy: provider.ManagedByValue,
		"proxyfleet-instance": "px-copied-1", "Name": "px-copied-1"}}) // tags copied; its client token is its own
	list, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.NoError(t, p.Delete(ctx, list[0].ProviderID), "the sweep is told it is deleted")
	for _, in := range s.Instances() {
		if in.ID == id {
			assert.Contains(t, []string{"shutting-down", "terminated"}, in.State, "the orphan the sweep 'deleted' runs on")
		}
	}
}
