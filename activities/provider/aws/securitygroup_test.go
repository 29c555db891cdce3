package aws_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
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

// TestInstancesShareOneGroupPerConfiguration: instances with the same VPC, port and
// source ranges share one owned group that admits the port from those ranges alone;
// another port is another group; an instance is created in the group's VPC.
func TestInstancesShareOneGroupPerConfiguration(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	m := machine()
	m.AllowedSourceRanges = []string{"203.0.113.0/24", "198.51.100.7/32", "203.0.113.9/24"} // the last is the first, unmasked
	p := newProvider(t, s, m)
	for _, name := range []string{"px-a-1", "px-b-1", "px-c-1"} {
		_, err := p.Create(ctx, request(name, "uid-"+name))
		require.NoError(t, err)
	}
	groups := s.SecurityGroups()
	require.Len(t, groups, 1, "one group for one configuration")
	g := groups[0]
	assert.Equal(t, []string{"tcp:3128:198.51.100.7/32", "tcp:3128:203.0.113.0/24"}, g.Ingress)
	assert.Equal(t, "inst-a", g.Tags[provider.LabelInstallation])
	for _, in := range s.Instances() {
		assert.Equal(t, []string{g.ID}, in.SecurityGroupIDs)
	}

	other := request("px-d-1", "uid-d")
	other.Port = 8080
	_, err := p.Create(ctx, other)
	require.NoError(t, err)
	assert.Len(t, s.SecurityGroups(), 2, "another port, another group")

	s.AddSubnet("subnet-0fa4e00000000bbb2", "vpc-0fa4e00000000aaa2")
	m.SubnetID = "subnet-0fa4e00000000bbb2"
	pv := newProvider(t, s, m)
	_, err = pv.Create(ctx, request("px-e-1", "uid-e"))
	require.NoError(t, err, "the group is made in the subnet's VPC")
	assert.Len(t, s.SecurityGroups(), 3)
}

// TestTheGroupIsPutBackWhenItDrifts: a rule added by hand is revoked and a rule removed
// by hand is authorized again at the next create that uses the group.
func TestTheGroupIsPutBackWhenItDrifts(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	p := newProvider(t, s, machine())
	_, err := p.Create(ctx, request("px-a-1", "uid-a"))
	require.NoError(t, err)
	g := s.SecurityGroups()[0]
	s.SetIngress(g.ID, "tcp:3128:0.0.0.0/0", "tcp:22:0.0.0.0/0")
	_, err = p.Create(ctx, request("px-b-1", "uid-b"))
	require.NoError(t, err)
	assert.Equal(t, []string{"tcp:3128:203.0.113.0/24"}, s.SecurityGroups()[0].Ingress)
}

// TestGetPutsADriftedGroupBack: a running fleet's shared group that someone opened is put
// back by the next Get of an instance that uses it (the monitor's drift checks), with no
// create of that configuration needed; each group is read at most once a minute per
// worker; a group whose configuration tags were edited by hand is not trusted, left as
// it is, and said so in the log. Fifty ranges, more than one tag holds, are put back too.
func TestGetPutsADriftedGroupBack(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	m := machine()
	m.AllowedSourceRanges = nil
	for i := range 50 {
		m.AllowedSourceRanges = append(m.AllowedSourceRanges, fmt.Sprintf("203.0.%d.0/24", i))
	}
	now := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	cfg := s.Config()
	cfg.Retryer = func() awssdk.Retryer { return awssdk.NopRetryer{} }
	p, err := aws.New(aws.Config{AWS: cfg, MachineOf: func(v1alpha1.ProxySpec) (aws.Machine, error) { return m, nil },
		Now: func() time.Time { return now }, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	in, err := p.Create(ctx, request("px-a-1", "uid-a"))
	require.NoError(t, err)
	g := s.SecurityGroups()[0]
	want := g.Ingress
	require.Len(t, want, 50)

	s.SetIngress(g.ID, "tcp:3128:0.0.0.0/0", "tcp:22:0.0.0.0/0")
	_, err = p.Get(ctx, in.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, want, s.SecurityGroups()[0].Ingress, "put back by Get")

	s.SetIngress(g.ID, "tcp:3128:0.0.0.0/0")
	reads := s.Requests(ec2test.ActionDescribeSecurityGroups)
	_, err = p.Get(ctx, in.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, reads, s.Requests(ec2test.ActionDescribeSecurityGroups), "read once a minute at most")
	now = now.Add(time.Minute)
	_, err = p.Get(ctx, in.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, want, s.SecurityGroups()[0].Ingress, "put back a minute later")

	// Tags edited to make the group admit everyone: the name no longer matches them.
	s.SetTags(g.ID, map[string]string{"proxyfleet-ranges-0": "0.0.0.0/0"})
	s.SetIngress(g.ID, "tcp:3128:198.51.100.0/24")
	now = now.Add(time.Minute)
	_, err = p.Get(ctx, in.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, []string{"tcp:3128:198.51.100.0/24"}, s.SecurityGroups()[0].Ingress, "nothing done on edited tags")
	assert.Contains(t, logs.String(), "configuration tags were edited")
}

// TestAPublicInstanceNeedsSourceRanges: a public address without allowed source ranges
// would be an instance any host can try; it is refused as the request's own fault, and
// one in the VPC alone needs no group of its own; a range that is no CIDR is refused.
func TestAPublicInstanceNeedsSourceRanges(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	open := machine()
	open.AllowedSourceRanges = nil
	_, err := newProvider(t, s, open).Create(ctx, request("px-a-1", "uid-a"))
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
	assert.Empty(t, s.Instances())

	private := open
	private.PublicIP = false
	_, err = newProvider(t, s, private).Create(ctx, request("px-b-1", "uid-b"))
	require.NoError(t, err)
	assert.Empty(t, s.SecurityGroups())

	bad := machine()
	bad.AllowedSourceRanges = []string{"203.0.113.0/33"}
	_, err = newProvider(t, s, bad).Create(ctx, request("px-c-1", "uid-c"))
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

// TestIPv6SourceRangesAreAdmitted: IPv6 ranges become IPv6 rules of the same group, and a
// rule by hand of either family is put back.
func TestIPv6SourceRangesAreAdmitted(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	m := machine()
	m.AllowedSourceRanges = []string{"2001:db8::/32", "203.0.113.0/24"}
	p := newProvider(t, s, m)
	_, err := p.Create(ctx, request("px-a-1", "uid-a"))
	require.NoError(t, err)
	g := s.SecurityGroups()[0]
	assert.Equal(t, []string{"tcp:3128:2001:db8::/32", "tcp:3128:203.0.113.0/24"}, g.Ingress)
	s.SetIngress(g.ID, "tcp:3128:::/0", "tcp:3128:203.0.113.0/24")
	_, err = p.Create(ctx, request("px-b-1", "uid-b"))
	require.NoError(t, err)
	assert.Equal(t, []string{"tcp:3128:2001:db8::/32", "tcp:3128:203.0.113.0/24"}, s.SecurityGroups()[0].Ingress)
}

// TestTheSweepDeletesGroupsNoInstanceUses: listing the installation (as the sweeper does)
// reports a shared group no instance uses as an instance of no Proxy, being deleted, as
// old as its creation tag; deleting it through its provider ID deletes it, unless an
// instance made since uses it (kept: provider.ErrInUse). One Proxy's list never shows it.
func TestTheSweepDeletesGroupsNoInstanceUses(t *testing.T) {
	s := ec2test.NewServer(t)
	ctx := context.Background()
	p := newProvider(t, s, machine())
	owner := provider.Owner{Installation: "inst-a"}
	a, err := p.Create(ctx, request("px-a-1", "uid-a"))
	require.NoError(t, err)
	list, err := p.ListOwned(ctx, owner)
	require.NoError(t, err)
	require.Len(t, list, 1, "a used group is not reported")

	require.NoError(t, p.Delete(ctx, a.ProviderID))
	list, err = p.ListOwned(ctx, owner)
	require.NoError(t, err)
	var group *provider.Instance
	for i := range list {
		if list[i].ProxyUID() == "shared-security-group" {
			group = &list[i]
		}
	}
	require.NotNil(t, group, "the unused group is reported to the sweep: %+v", list)
	assert.Equal(t, provider.StateDeleting, group.State)
	assert.False(t, group.CreatedAt.IsZero(), "its age comes from its creation tag")
	one, err := p.ListOwned(ctx, provider.Owner{Installation: "inst-a", ProxyUID: "uid-a"})
	require.NoError(t, err)
	for _, in := range one {
		assert.NotEqual(t, "shared-security-group", in.ProxyUID())
	}

	// An instance made since the list uses the group again: the sweep keeps it.
	_, err = p.Create(ctx, request("px-b-1", "uid-b"))
	require.NoError(t, err)
	err = p.Delete(ctx, group.ProviderID)
	assert.ErrorIs(t, err, provider.ErrInUse)
	require.Len(t, s.SecurityGroups(), 1)

	for _, in := range s.Instances() {
		s.SetState(in.ID, "terminated")
	}
	require.NoError(t, p.Delete(ctx, group.ProviderID))
	assert.Empty(t, s.SecurityGroups())
	_, err = p.Get(ctx, group.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	require.NoError(t, p.Delete(ctx, group.ProviderID), "deleting it again is done")
}
