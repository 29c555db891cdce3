package aws_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws"
	"github.com/proxyfleet/proxyfleet/activities/provider/aws/ec2test"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// TestReview33UserSecurityGroupNotFoundIsPermanent
//
// Defect: Create treats every InvalidGroup.NotFound from RunInstances as "the sweep deleted
// the shared group meanwhile" (transient) whenever the instance has a shared group, which
// is always the case with a public IP. A typo in spec.aws.securityGroupIDs (a group that
// does not exist, or was deleted by its owner) is therefore retried forever: the Proxy
// never turns Failed and never shows EC2's message naming the missing group, though a
// retry can never succeed. The issue asks that refusals of the request be permanent with
// EC2's message.
func TestReview33UserSecurityGroupNotFoundIsPermanent(t *testing.T) {
	s := ec2test.NewServer(t)
	m := machine()
	m.SecurityGroupIDs = []string{"sg-0123456789abcdef0"} // the user's own group: it does not exist
	p := newProvider(t, s, m)
	ctx := context.Background()
	for attempt := range 3 {
		_, err := p.Create(ctx, request("px-usg-1", "uid-usg"))
		require.Error(t, err)
		assert.Equal(t, provider.KindPermanent, provider.Class(err),
			"attempt %d: a missing user group is a refusal no retry fixes: %v", attempt, err)
		assert.Contains(t, err.Error(), "sg-0123456789abcdef0", "EC2's message naming the group reaches the condition")
	}
	assert.Empty(t, s.Live())
}

// TestReview33ErrorCodesLeftTransient
//
// Defect: several EC2 refusals that retrying cannot fix fall through classify as
// transient, so the Proxy retries with backoff forever instead of waiting as
// QuotaExceeded or turning Failed with EC2's message:
//   - SecurityGroupLimitExceeded (CreateSecurityGroup: the VPC's group quota, 2,500 by
//     default, reached — every distinct port/ranges/VPC is a group) is a limit: quota.
//   - VPCIdNotSpecified (CreateSecurityGroup/RunInstances without a subnet in a region
//     whose default VPC was deleted — common in hardened accounts) is the request's fault:
//     permanent; the fix is spec.aws.subnetID.
//   - AuthFailure.ServiceLinkedRoleCreationNotPermitted (RunInstances with spot: true in an
//     account without AWSServiceRoleForEC2Spot, which EC2 creates with the caller's
//     permissions; the documented worker policy has no iam:CreateServiceLinkedRole) is an
//     authorization refusal like UnauthorizedOperation: permanent.
func TestReview33ErrorCodesLeftTransient(t *testing.T) {
	cases := []struct {
		name, action, code, message string
		spot                        bool
		want                        provider.Kind
	}{
		{"group quota", ec2test.ActionCreateSecurityGroup, "SecurityGroupLimitExceeded",
			"The maximum number of security groups for VPC 'vpc-0fa4e0000000000a1' has been reached.", false, provider.KindQuota},
		{"no default VPC", ec2test.ActionCreateSecurityGroup, "VPCIdNotSpecified",
			"No default VPC for this user. GroupName is only supported for EC2-Classic and default VPC.", false, provider.KindPermanent},
		{"no default VPC at launch", ec2test.ActionRunInstances, "VPCIdNotSpecified",
			"No default VPC for this user", false, provider.KindPermanent},
		{"spot service-linked role", ec2test.ActionRunInstances, "AuthFailure.ServiceLinkedRoleCreationNotPermitted",
			"The provided credentials do not have permission to create the service-linked role for EC2 Spot Instances.", true, provider.KindPermanent},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := ec2test.NewServer(t)
			m := machine()
			m.Spot = tc.spot
			p := newProvider(t, s, m)
			s.FailNext(tc.action, http.StatusBadRequest, tc.code, tc.message)
			_, err := p.Create(context.Background(), request("px-code-1", "uid-code"))
			require.Error(t, err)
			assert.Equal(t, tc.want, provider.Class(err), "%s: %v", tc.code, err)
			assert.Contains(t, err.Error(), tc.message)
		})
	}
}

// TestReview33PolicyAllowsSpotLaunches
//
// Defect: docs/aws-worker-policy.json cannot launch spec.aws.spot: true instances.
//  1. A Spot launch through RunInstances also creates a spot-instances-request resource, and
//     a policy that lists RunInstances' resources must list it (EC2 User Guide, "Tag Spot
//     Instance requests": "For Resource, specify spot-instances-request"). The policy lists
//     instance, volume, image, subnet, network-interface and security-group only, so IAM
//     denies every Spot launch: UnauthorizedOperation, and the Proxy is Failed.
//  2. EC2 needs the service-linked role AWSServiceRoleForEC2Spot and, through the API,
//     creates it with the caller's permissions ("If you use the AWS CLI or an API to
//     request a Spot Instance, you must first ensure that this role exists"). The policy
//     grants no iam:CreateServiceLinkedRole and docs/providers.md never says to create it.
//
// TestTheDocumentedPolicyCoversEveryCall misses both: it walks a non-Spot machine and
// compares action names only.
func TestReview33PolicyAllowsSpotLaunches(t *testing.T) {
	spotRequest := false
	var raw []byte
	for _, st := range workerPolicy(t) {
		raw = fmt.Append(raw, st.Actions, " ")
		if st.Effect != "Allow" || !slices.Contains(st.Actions, "ec2:RunInstances") {
			continue
		}
		for _, r := range st.Resources {
			if r == "*" || strings.Contains(r, ":spot-instances-request/") {
				spotRequest = true
			}
		}
	}
	assert.True(t, spotRequest, "no statement allows ec2:RunInstances on spot-instances-request: every Spot launch is denied")

	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	docs, err := os.ReadFile(filepath.Join(root, "docs", "providers.md"))
	require.NoError(t, err)
	assert.True(t, bytes.Contains(raw, []byte("iam:CreateServiceLinkedRole")) || bytes.Contains(docs, []byte("AWSServiceRoleForEC2Spot")),
		"neither does the worker policy allow creating the Spot service-linked role nor do the docs say to create it")
}

// TestReview33NameReusedAfterTerminationGetsTheDeadInstance
//
// Defect: an instance name is its RunInstances ClientToken, and EC2 keeps a token bound to
// its instance for at least 24 hours after that instance is terminated ("You should not
// reuse a client token"). A workflow run that starts without state (after a terminate or
// a reset) counts instance numbers from what ListOwned still sees, and ListOwned leaves
// terminated instances out: so a Proxy whose instance was deleted or taken back gets the
// same name again (px-…-1). Create then finds no live instance, asks EC2 again with the
// old token, and reports EC2's replay — the terminated instance — as a successful create
// (state Deleting). No instance runs; the workflow only learns so on its next Get and
// goes round again.
func TestReview33NameReusedAfterTerminationGetsTheDeadInstance(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	ctx := context.Background()
	req := request("px-reuse-1", "uid-reuse")
	terminatedAfterCreate(t, s, p, req)

	// A later run allocates the same name (its counter restarted from what it found).
	// (Fixed two ways: the workflow's counter now also moves past the instance the Proxy
	// last published, and the provider says what EC2 answers: the name's instance, being
	// gone, which the workflow takes for lost and so moves on to a new name.)
	again, err := p.Create(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, provider.StateDeleting, again.State, "the name's instance is reported as it is: gone, not running")
	_, err = p.Get(ctx, again.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound, "and Get says it is gone, at once, though it was launched moments ago: the workflow moves on")
}

// TestReview33NameReusedAfterGroupSweepRetriesForever
//
// Defect: as above, but the usual sequel: once the Proxy's last instance is terminated its
// shared group is unused, and the sweep deletes it. The next create under the reused name
// makes the group again (a new ID), so RunInstances carries the old token with other
// parameters, and EC2 answers IdempotentParameterMismatch. The provider deliberately
// classifies that as transient ("a later attempt gets past by finding it"), but no attempt
// ever finds it: the instance under that token is terminated, and find() skips terminated
// instances. The Proxy is wedged retrying for as long as EC2 remembers the token.
func TestReview33NameReusedAfterGroupSweepRetriesForever(t *testing.T) {
	s := ec2test.NewServer(t)
	p := newProvider(t, s, machine())
	ctx := context.Background()
	req := request("px-reuse-1", "uid-reuse")
	terminatedAfterCreate(t, s, p, req)
	// The sweep: the group is now unused, and deleted.
	list, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	require.Len(t, list, 1, "the unused group")
	require.NoError(t, p.Delete(ctx, list[0].ProviderID))
	require.Empty(t, s.SecurityGroups())

	// (Fixed: the token is the name and a hash of the request: this one differs (its
	// group is new), so it is a new instance, not a refusal retried for a day.)
	again, err := p.Create(ctx, req)
	require.NoError(t, err, "not a transient error retried for as long as EC2 keeps the token")
	_, err = p.Create(ctx, req)
	require.NoError(t, err)
	_, err = p.Get(ctx, again.ProviderID)
	require.NoError(t, err)
	assert.Len(t, s.Live(), 1, "one new instance")
}

// interceptEC2 forwards to the fake, first giving hook each call's action: a hook that
// returns true has answered the call itself.
func interceptEC2(t *testing.T, s *ec2test.Server, hook func(action string, w http.ResponseWriter) bool) *httptest.Server {
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
		if hook(form.Get("Action"), w) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		fwd.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// laggingEC2 forwards to the fake, but while lag is set answers DescribeInstances with
// nothing, as EC2 does for a few seconds after RunInstances (its describe calls are
// eventually consistent; AWS documents that a new instance may not be listed yet).
func laggingEC2(t *testing.T, s *ec2test.Server) (*httptest.Server, *atomic.Bool) {
	t.Helper()
	var lag atomic.Bool
	srv := interceptEC2(t, s, func(action string, w http.ResponseWriter) bool {
		if !lag.Load() || action != ec2test.ActionDescribeInstances {
			return false
		}
		w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
		_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>lag</requestId><reservationSet/></DescribeInstancesResponse>`)
		return true
	})
	return srv, &lag
}

// TestReview33PartlyRevokedDriftIsLeftOpen
//
// Defect: keepIngress revokes every unwanted rule in one RevokeSecurityGroupIngress call
// and counts InvalidPermission.NotFound as success. EC2 applies that call all or nothing:
// if one of the rules is already gone (another worker's concurrent repair, a create racing
// a Get's check, an admin tidying up) the call fails and revokes none of the others. The
// provider then reports the group put back while it still admits, say, 0.0.0.0/0 on the
// proxy port; nothing looks again until the next create of that configuration or the
// next per-worker check a minute later. (InvalidPermission.Duplicate on the authorize
// side has the same shape.)
func TestReview33PartlyRevokedDriftIsLeftOpen(t *testing.T) {
	s := ec2test.NewServer(t)
	var group atomic.Value // the shared group's ID, once made
	var raced atomic.Bool
	srv := interceptEC2(t, s, func(action string, _ http.ResponseWriter) bool {
		id, _ := group.Load().(string)
		if action == ec2test.ActionRevokeSecurityGroupIngress && id != "" && raced.CompareAndSwap(false, true) {
			// Another worker, which saw only the port-22 rule, revoked it a moment ago.
			s.SetIngress(id, "tcp:3128:203.0.113.0/24", "tcp:3128:0.0.0.0/0")
		}
		return false
	})
	p := providerAt(t, s, srv.URL, machine(), nil)
	ctx := context.Background()
	_, err := p.Create(ctx, request("px-a-1", "uid-a"))
	require.NoError(t, err)
	id := s.SecurityGroups()[0].ID
	group.Store(id)
	s.SetIngress(id, "tcp:3128:203.0.113.0/24", "tcp:3128:0.0.0.0/0", "tcp:22:0.0.0.0/0") // opened by hand

	_, err = p.Create(ctx, request("px-b-1", "uid-b")) // puts the group back, it says
	require.NoError(t, err)
	require.True(t, raced.Load())
	assert.Equal(t, []string{"tcp:3128:203.0.113.0/24"}, s.SecurityGroups()[0].Ingress,
		"the create reported the group put back, yet it still admits the world")
}

// TestReview33UnlistedNewInstanceIsReportedGoneAndLeaks
//
// Defect: Get and Delete find an instance only through DescribeInstances filters, which
// EC2 serves eventually consistently: right after RunInstances the new instance may not
// be listed. The workflow's WaitRunning calls Get at once after Create; Get then answers
// ErrNotFound ("gone"), the workflow retires the instance as "disappeared while
// provisioning" and deletes it; Delete finds nothing and reports success, so the workflow
// forgets it and makes another. The first instance keeps running — billed, and a proxy
// nobody watches — and the sweep spares it for as long as its Proxy exists. Across a fleet
// of 10,000 creates this is a steady leak, and a second instance for one create.
func TestReview33UnlistedNewInstanceIsReportedGoneAndLeaks(t *testing.T) {
	s := ec2test.NewServer(t)
	proxy, lag := laggingEC2(t, s)
	p := providerAt(t, s, proxy.URL, machine(), nil)
	ctx := context.Background()

	in, err := p.Create(ctx, request("px-lag-1", "uid-lag"))
	require.NoError(t, err)
	lag.Store(true) // EC2 has not yet propagated the new instance to its describe calls

	_, err = p.Get(ctx, in.ProviderID)
	assert.NotErrorIs(t, err, provider.ErrNotFound, "an instance RunInstances just made is reported gone")

	err = p.Delete(ctx, in.ProviderID)
	lag.Store(false)
	if err == nil {
		for _, i := range s.Instances() {
			assert.NotEqual(t, "running", i.State, "Delete reported success, yet %s runs on, forgotten", i.ID)
			assert.NotEqual(t, "pending", i.State, "Delete reported success, yet %s runs on, forgotten", i.ID)
		}
	}
}

// TestReview33SweepRegionsListedOnce
//
// Defect: Config.Regions (the worker's --aws-sweep-regions, split on commas without
// de-duplication) is used as given, so a region named twice (a careless
// "us-east-1,us-east-1", or an overlay and an env var both naming it) is listed twice:
// ListOwned returns every instance of that region twice. The sweep then judges, counts
// and deletes each orphan twice, and FindInstances-style callers see duplicates. New
// already avoids adding the default region twice; other regions are not de-duplicated.
func TestReview33SweepRegionsListedOnce(t *testing.T) {
	s := ec2test.NewServer(t)
	cfg := s.Config()
	cfg.Retryer = func() awssdk.Retryer { return awssdk.NopRetryer{} }
	p, err := aws.New(aws.Config{AWS: cfg, Regions: []string{"us-east-1", "us-east-1"}})
	require.NoError(t, err)
	s.InRegion("us-east-1").AddInstance(ec2test.Instance{Tags: map[string]string{
		provider.LabelInstallation: "inst-a", provider.LabelProxyUID: "uid-1", "proxyfleet-instance": "px-dup-1"}})
	list, err := p.ListOwned(context.Background(), provider.Owner{Installation: "inst-a"})
	require.NoError(t, err)
	assert.Len(t, list, 1, "one instance, listed once: %v", list)
}
