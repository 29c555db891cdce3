package aws_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"testing"
	"time"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// review33bProxy forwards to the fake, first giving hook each call's decoded form: a hook
// that returns true has answered the call itself.
func review33bProxy(t *testing.T, s *ec2test.Server, hook func(form url.Values, w http.ResponseWriter) bool) *httptest.Server {
	t.Helper()
	target, err := url.Parse(s.URL)
	require.NoError(t, err)
	fwd := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		form, _ := url.ParseQuery(string(body))
		if hook(form, w) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		fwd.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// asksForTerminated reports whether a DescribeInstances form filters on the terminated
// state (the provider's look for an instance that is gone).
func asksForTerminated(form url.Values) bool {
	if form.Get("Action") != ec2test.ActionDescribeInstances {
		return false
	}
	for i := 1; ; i++ {
		p := "Filter." + strconv.Itoa(i)
		name, ok := form[p+".Name"]
		if !ok {
			return false
		}
		if name[0] != "instance-state-name" {
			continue
		}
		for j := 1; ; j++ {
			v, ok := form[p+".Value."+strconv.Itoa(j)]
			if !ok {
				break
			}
			if v[0] == "terminated" {
				return true
			}
		}
	}
}

// emptyDescribe answers a DescribeInstances with no reservations.
func emptyDescribe(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>r33b</requestId><reservationSet/></DescribeInstancesResponse>`)
}

// purgedTerminated forwards to the fake but, as EC2 does about an hour after a
// termination, lists no terminated instance any more (EC2 still holds the client token
// of such an instance for at least 24 hours).
func purgedTerminated(t *testing.T, s *ec2test.Server) *httptest.Server {
	return review33bProxy(t, s, func(form url.Values, w http.ResponseWriter) bool {
		if !asksForTerminated(form) {
			return false
		}
		emptyDescribe(w)
		return true
	})
}

// providerAt is providerVia with a clock of its own.
func providerAt(t *testing.T, s *ec2test.Server, srv *httptest.Server, m aws.Machine, now func() time.Time) *aws.Provider {
	t.Helper()
	cfg := s.Config()
	cfg.BaseEndpoint = awssdk.String(srv.URL)
	cfg.Retryer = func() awssdk.Retryer { return awssdk.NopRetryer{} }
	p, err := aws.New(aws.Config{AWS: cfg, Now: now, MachineOf: func(v1alpha1.ProxySpec) (aws.Machine, error) { return m, nil }})
	require.NoError(t, err)
	return p
}

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
	p := providerVia(t, s, purgedTerminated(t, s), machine())
	ctx := context.Background()
	req := request("px-purged-2", "uid-purged")

	first, err := p.Create(ctx, req)
	require.NoError(t, err)
	require.NoError(t, p.Delete(ctx, first.ProviderID))
	s.SetState(s.Instances()[0].ID, "terminated")
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
	assert.Len(t, live(s), 1, "one new instance, however often asked for")
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
		p := providerAt(t, s, srv, machine(), func() time.Time { return time.Now().Add(15 * time.Minute) })
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
		s := ec2test.NewServer(t)
		p := providerAt(t, s, purgedTerminated(t, s), machine(), func() time.Time { return time.Now().Add(-2 * time.Hour) })
		ctx := context.Background()
		in, err := p.Create(ctx, request("px-skew-2", "uid-skew"))
		require.NoError(t, err)
		s.SetState(live(s)[0].ID, "terminated") // terminated, and since dropped from EC2's lists
		_, err = p.Get(ctx, in.ProviderID)
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
