package gcp

import (
	"net/http"
	"strings"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp/gcptest"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// internalSpec is a Proxy reached inside the VPC, under the VPC's own rules: no external
// IP, no ranges, so no rule of its own.
func internalSpec() *v1alpha1.GCPSpec {
	g := minimalSpec()
	g.ExternalIP = proto.Bool(false)
	g.AllowedSourceRanges = nil
	return g
}

// ourRule is the rule the provider makes for gcpRequest(name, minimalSpec()), as a person
// might find it in the console.
func ourRule(name, zone string) *computepb.Firewall {
	return &computepb.Firewall{
		Name:         proto.String(name),
		Description:  proto.String(ruleOwner{installation: "prod-eu", uid: testUID, zone: zone}.description()),
		Network:      proto.String("global/networks/default"),
		SourceRanges: []string{"203.0.113.0/24"},
		Allowed:      []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: []string{"3128"}}},
		TargetTags:   []string{name},
	}
}

func onlyRule(t *testing.T, srv *gcptest.Server) gcptest.Firewall {
	t.Helper()
	rules := srv.Firewalls()
	require.Len(t, rules, 1)
	return rules[0]
}

func TestCreateMakesTheFirewallRule(t *testing.T) {
	p, srv := newTestProvider(t)
	g := minimalSpec()
	g.Network = "crawl-net"
	g.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.7/32", "198.51.100.0/24"}
	g.Tags = []v1alpha1.NetworkTag{"squid"}
	req := gcpRequest("px-a", g)
	req.Port = 8080
	create(t, p, req)

	fw := onlyRule(t, srv)
	assert.Equal(t, testProject, fw.Project)
	assert.Equal(t, "px-a", fw.Name, "named like the instance")
	assert.True(t, strings.HasSuffix(fw.Network, "/projects/proj-a/global/networks/crawl-net"), fw.Network)
	assert.Equal(t, "INGRESS", fw.Direction)
	assert.Equal(t, []string{"198.51.100.0/24", "203.0.113.7/32"}, fw.SourceRanges)
	assert.Equal(t, []string{"tcp:8080"}, fw.Allowed, "the proxy port and nothing else")
	assert.Equal(t, []string{"px-a"}, fw.TargetTags, "this instance alone")
	assert.False(t, fw.Disabled)
	owner, ok := parseRuleOwner(fw.Description)
	require.True(t, ok, fw.Description)
	assert.Equal(t, ruleOwner{installation: "prod-eu", uid: req.ProxyUID, zone: "europe-west1-b"}, owner)

	inst := srv.Instances()
	require.Len(t, inst, 1)
	assert.Equal(t, []string{"squid", "px-a"}, inst[0].Tags, "the instance carries the tag the rule targets")
	assert.Equal(t, 1, srv.Requests(gcptest.MethodGetGlobalOperation), "the rule's operation is global, polled as such")
	assert.Equal(t, 1, srv.Requests(gcptest.MethodGetOperation))
}

// The rule comes first: without it nothing billable is made.
func TestCreateMakesNoInstanceWithoutItsRule(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.FailNext(gcptest.MethodFirewallInsert, http.StatusForbidden, "forbidden", "Required 'compute.firewalls.create' permission for 'projects/proj-a/global/firewalls/px-a'")
	_, err := p.Create(t.Context(), gcpRequest("px-a", minimalSpec()))
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
	assert.Contains(t, err.Error(), "compute.firewalls.create")
	assert.Zero(t, srv.Requests(gcptest.MethodInsert))
	assert.Empty(t, srv.Instances())
}

func TestCreateWaitsForTheFirewallOperation(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.HoldNextOperation(gcptest.MethodFirewallInsert, 2)
	create(t, p, gcpRequest("px-a", minimalSpec()))
	assert.Equal(t, 3, srv.Requests(gcptest.MethodGetGlobalOperation), "two RUNNING answers, then DONE")
	assert.Equal(t, 1, srv.Requests(gcptest.MethodInsert))
}

// A refusal reported only in the rule's operation is classified like the instance's.
func TestCreateReportsFirewallOperationErrors(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())
	srv.FailNextOperation(gcptest.MethodFirewallInsert, 403, "QUOTA_EXCEEDED", "Quota 'FIREWALLS' exceeded.  Limit: 200.0 globally.")

	_, err := p.Create(t.Context(), req)
	require.Error(t, err)
	assert.Equal(t, provider.KindQuota, provider.Class(err))
	assert.Contains(t, err.Error(), "FIREWALLS")
	assert.Contains(t, err.Error(), "failed in global")
	assert.Zero(t, srv.Requests(gcptest.MethodInsert))
	assert.Empty(t, srv.Firewalls(), "a failed insert leaves no rule")

	// The retry is a new attempt, not the failed one fetched again.
	create(t, p, req)
	onlyRule(t, srv)
	ids := srv.RequestIDs(gcptest.MethodFirewallInsert)
	require.Len(t, ids, 3)
	assert.Equal(t, requestID(callFirewallInsert, testRef, testUID), ids[0])
	assert.Equal(t, ids[0], ids[1])
	assert.NotEqual(t, ids[1], ids[2])

	p2, srv2 := newTestProvider(t)
	srv2.FailNextOperation(gcptest.MethodFirewallInsert, 404, "RESOURCE_NOT_FOUND", "The resource 'projects/proj-a/global/networks/nope' was not found")
	_, err = p2.Create(t.Context(), req)
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

func TestCreateAgainKeepsTheRule(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())
	create(t, p, req)
	before := onlyRule(t, srv)
	create(t, p, req)

	after := onlyRule(t, srv)
	assert.True(t, proto.Equal(before.Resource, after.Resource), "nothing to correct")
	assert.Zero(t, srv.Requests(gcptest.MethodFirewallUpdate))
	id := requestID(callFirewallInsert, testRef, testUID)
	assert.Equal(t, []string{id, id}, srv.RequestIDs(gcptest.MethodFirewallInsert), "a retry sends the same request ID")
}

// A rule of ours that admits more, or other, than the spec says is put back.
func TestCreateCorrectsADriftedRule(t *testing.T) {
	tests := []struct {
		name  string
		drift func(*computepb.Firewall)
	}{
		{"ranges widened", func(fw *computepb.Firewall) { fw.SourceRanges = []string{"0.0.0.0/0"} }},
		{"a range added", func(fw *computepb.Firewall) { fw.SourceRanges = append(fw.SourceRanges, "192.0.2.0/24") }},
		{"another port", func(fw *computepb.Firewall) { fw.Allowed[0].Ports = []string{"3128", "22"} }},
		{"all protocols", func(fw *computepb.Firewall) { fw.Allowed = []*computepb.Allowed{{IPProtocol: proto.String("all")}} }},
		{"a source tag", func(fw *computepb.Firewall) { fw.SourceTags = []string{"anything"} }},
		{"every instance", func(fw *computepb.Firewall) { fw.TargetTags = nil }},
		{"disabled", func(fw *computepb.Firewall) { fw.Disabled = proto.Bool(true) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			drifted := ourRule("px-a", "europe-west1-b")
			tc.drift(drifted)
			drifted.LogConfig = &computepb.FirewallLogConfig{Enable: proto.Bool(true)}
			srv.AddFirewall(testProject, drifted)

			create(t, p, gcpRequest("px-a", minimalSpec()))
			fw := onlyRule(t, srv)
			assert.Equal(t, []string{"203.0.113.0/24"}, fw.SourceRanges)
			assert.Equal(t, []string{"tcp:3128"}, fw.Allowed)
			assert.Empty(t, fw.SourceTags)
			assert.Equal(t, []string{"px-a"}, fw.TargetTags)
			assert.False(t, fw.Disabled)
			assert.True(t, fw.Resource.GetLogConfig().GetEnable(), "an operator's logging is kept")
			assert.Equal(t, 1, srv.Requests(gcptest.MethodFirewallUpdate))
			assert.Len(t, srv.Instances(), 1)

			create(t, p, gcpRequest("px-a", minimalSpec()))
			assert.Equal(t, 1, srv.Requests(gcptest.MethodFirewallUpdate), "corrected once")
		})
	}
}

// A rule of the instance's name that was not made for it is neither taken over nor changed.
func TestCreateRefusesAnotherOwnersRule(t *testing.T) {
	tests := []struct {
		name string
		rule func() *computepb.Firewall
	}{
		{"made by hand", func() *computepb.Firewall {
			fw := ourRule("px-a", "europe-west1-b")
			fw.Description = proto.String("squid for the office")
			return fw
		}},
		{"no description", func() *computepb.Firewall {
			fw := ourRule("px-a", "europe-west1-b")
			fw.Description = nil
			return fw
		}},
		{"another Proxy's", func() *computepb.Firewall {
			fw := ourRule("px-a", "europe-west1-b")
			fw.Description = proto.String(ruleOwner{installation: "prod-eu", uid: "ffffffff-0000-0000-0000-000000000000", zone: "europe-west1-b"}.description())
			return fw
		}},
		{"another installation's", func() *computepb.Firewall {
			fw := ourRule("px-a", "europe-west1-b")
			fw.Description = proto.String(ruleOwner{installation: "staging", uid: testUID, zone: "europe-west1-b"}.description())
			return fw
		}},
		{"for an instance in another zone", func() *computepb.Firewall { return ourRule("px-a", "us-central1-a") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			srv.AddFirewall(testProject, tc.rule())
			before := onlyRule(t, srv)

			g := minimalSpec()
			g.AllowedSourceRanges = []v1alpha1.CIDR{"0.0.0.0/0"} // a change, were the rule ours
			_, err := p.Create(t.Context(), gcpRequest("px-a", g))
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), "not made for this instance")
			assert.Zero(t, srv.Requests(gcptest.MethodFirewallUpdate))
			assert.Zero(t, srv.Requests(gcptest.MethodInsert), "no instance behind a rule that is not its own")
			assert.True(t, proto.Equal(before.Resource, onlyRule(t, srv).Resource), "the rule is untouched")
		})
	}
}

func TestCreateRefusesItsRuleOnAnotherNetwork(t *testing.T) {
	p, srv := newTestProvider(t)
	fw := ourRule("px-a", "europe-west1-b")
	fw.Network = proto.String("global/networks/elsewhere")
	srv.AddFirewall(testProject, fw)
	_, err := p.Create(t.Context(), gcpRequest("px-a", minimalSpec()))
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
	assert.Contains(t, err.Error(), "elsewhere")
	assert.Zero(t, srv.Requests(gcptest.MethodFirewallUpdate))
}

// TestCreateRefusesARuleItCannotPlace: a subnetwork alone does not say which network the
// instance joins, and a Shared VPC's subnetwork keeps its rules in the host project; a rule
// on the default network, or in this project, would admit no one.
func TestCreateRefusesARuleItCannotPlace(t *testing.T) {
	for name, tc := range map[string]struct{ network, subnetwork, want string }{
		"subnetwork without network": {"", "crawl-sub", "spec.gcp.network is required with spec.gcp.subnetwork"},
		"shared VPC subnetwork":      {"crawl-net", "projects/host-project/regions/europe-west1/subnetworks/shared", "is in project host-project"},
	} {
		t.Run(name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			g := minimalSpec()
			g.Network, g.Subnetwork = tc.network, tc.subnetwork
			_, err := p.Create(t.Context(), gcpRequest("px-a", g))
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), tc.want)
			assert.Zero(t, srv.TotalRequests(), "nothing is created")
		})
	}
}

func TestCreateRefusesAnExternalIPWithoutRanges(t *testing.T) {
	for name, externalIP := range map[string]*bool{"unset": nil, "true": proto.Bool(true)} {
		t.Run(name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			g := minimalSpec()
			g.ExternalIP = externalIP
			g.AllowedSourceRanges = nil
			_, err := p.Create(t.Context(), gcpRequest("px-a", g))
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), "spec.gcp.allowedSourceRanges")
			assert.Zero(t, srv.TotalRequests())
		})
	}
}

// Without an external IP the instance is reached at its internal address; without ranges
// too, the VPC's rules decide who reaches it and the provider makes none.
func TestCreateWithoutExternalIP(t *testing.T) {
	p, srv := newTestProvider(t)
	created := create(t, p, gcpRequest("px-a", internalSpec()))
	assert.Empty(t, srv.Firewalls())
	assert.Zero(t, srv.Requests(gcptest.MethodFirewallInsert))
	inst := srv.Instances()
	require.Len(t, inst, 1)
	assert.Empty(t, inst[0].Resource.GetNetworkInterfaces()[0].GetAccessConfigs(), "no external address")
	require.NotEmpty(t, inst[0].NetworkIP)

	got, err := p.Get(t.Context(), created.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateProvisioning, got.State)
	assert.Empty(t, got.IP, "an address only once running")

	srv.SetStatus("px-a", "RUNNING")
	got, err = p.Get(t.Context(), created.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
	assert.Equal(t, inst[0].NetworkIP, got.IP)
	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Equal(t, inst[0].NetworkIP, listed[0].IP)

	// Deleting an instance without a rule looks for none to delete.
	require.NoError(t, p.Delete(t.Context(), created.ProviderID))
	assert.Zero(t, srv.Requests(gcptest.MethodFirewallDelete))
}

func TestCreateWithoutExternalIPWithRanges(t *testing.T) {
	p, srv := newTestProvider(t)
	g := internalSpec()
	g.AllowedSourceRanges = []v1alpha1.CIDR{"10.8.0.0/14"}
	created := create(t, p, gcpRequest("px-a", g))
	assert.Equal(t, []string{"10.8.0.0/14"}, onlyRule(t, srv).SourceRanges)

	srv.SetStatus("px-a", "RUNNING")
	got, err := p.Get(t.Context(), created.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
	assert.Equal(t, srv.Instances()[0].NetworkIP, got.IP)
}

func TestDeleteRemovesTheInstanceAndItsRule(t *testing.T) {
	p, srv := newTestProvider(t)
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	require.Len(t, srv.Firewalls(), 1)

	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	assert.Empty(t, srv.Instances())
	assert.Empty(t, srv.Firewalls())
	_, err := p.Get(t.Context(), inst.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound)

	require.NoError(t, p.Delete(t.Context(), inst.ProviderID), "deleting what is gone succeeds")
	assert.Equal(t, 1, srv.Requests(gcptest.MethodFirewallDelete))
	assert.Equal(t, []string{requestID(callFirewallDelete, testRef, "")}, srv.RequestIDs(gcptest.MethodFirewallDelete))
}

// A rule of the instance's name that is not the instance's is left alone, and does not
// keep the instance from being gone.
func TestDeleteLeavesARuleThatIsNotTheInstances(t *testing.T) {
	for name, rule := range map[string]*computepb.Firewall{
		"made by hand":     {Name: proto.String("px-a"), Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp")}}},
		"for another zone": ourRule("px-a", "us-central1-a"),
	} {
		t.Run(name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			inst := create(t, p, gcpRequest("px-a", internalSpec()))
			srv.AddFirewall(testProject, rule)

			require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
			assert.Len(t, srv.Firewalls(), 1)
			assert.Zero(t, srv.Requests(gcptest.MethodFirewallDelete))
			_, err := p.Get(t.Context(), inst.ProviderID)
			assert.ErrorIs(t, err, provider.ErrNotFound)
		})
	}
}

// A delete cut short between the instance and its rule: the instance is reported as
// deleting until a later Delete removes the rule, and the sweeper's list shows it.
func TestARuleLeftBehindKeepsTheInstanceDeleting(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())
	inst := create(t, p, req)
	srv.FailNext(gcptest.MethodFirewallDelete, http.StatusServiceUnavailable, "backendError", "Service Unavailable")

	err := p.Delete(t.Context(), inst.ProviderID)
	require.Error(t, err)
	assert.Equal(t, provider.KindTransient, provider.Class(err))
	assert.Empty(t, srv.Instances())
	require.Len(t, srv.Firewalls(), 1)

	got, err := p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err, "not gone while its rule is there")
	assert.Equal(t, provider.StateDeleting, got.State)
	assert.Equal(t, inst.ProviderID, got.ProviderID)
	assert.Equal(t, "px-a", got.Name)
	assert.Empty(t, got.IP)
	assert.Equal(t, req.ProxyUID, got.ProxyUID())
	assert.Equal(t, "prod-eu", got.Labels[provider.LabelInstallation])
	assert.False(t, got.CreatedAt.IsZero(), "the rule's age, for the sweeper's minimum age")

	for _, owner := range []provider.Owner{{Installation: "prod-eu"}, {Installation: "prod-eu", ProxyUID: req.ProxyUID}} {
		listed, err := p.ListOwned(t.Context(), owner)
		require.NoError(t, err)
		require.Len(t, listed, 1, owner)
		assert.Equal(t, got, listed[0], owner)
	}
	for _, owner := range []provider.Owner{{Installation: "staging"}, {Installation: "prod-eu", ProxyUID: "ffffffff-0000-0000-0000-000000000000"}} {
		listed, err := p.ListOwned(t.Context(), owner)
		require.NoError(t, err)
		assert.Empty(t, listed, owner)
	}

	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	assert.Empty(t, srv.Firewalls())
	_, err = p.Get(t.Context(), inst.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	assert.Empty(t, listed)
}

// The sweeper deletes what ListOwned returns: a rule whose instance is gone is reported
// under its instance's provider ID (zone included), and one whose name is used by an
// instance that is not the owner's is not reported at all.
func TestListOwnedReportsLeakedRules(t *testing.T) {
	p, srv := newTestProvider(t)
	a := gcpRequest("px-a", minimalSpec())
	b := gcpRequest("px-b", minimalSpec())
	b.Spec.GCP.Zone = "us-central1-a"
	c := gcpRequest("px-c", minimalSpec())
	for _, req := range []provider.CreateRequest{a, b, c} {
		create(t, p, req)
	}
	srv.RemoveInstance(testProject, "us-central1-a", "px-b")
	// px-c's instance replaced by one of someone else's: its rule is no leftover.
	srv.RemoveInstance(testProject, "europe-west1-b", "px-c")
	srv.AddInstance(testProject, "europe-west1-b", &computepb.Instance{Name: proto.String("px-c")})

	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	byID := map[string]provider.State{}
	for _, inst := range listed {
		byID[inst.ProviderID] = inst.State
	}
	assert.Equal(t, map[string]provider.State{
		"projects/proj-a/zones/europe-west1-b/instances/px-a": provider.StateProvisioning,
		"projects/proj-a/zones/us-central1-a/instances/px-b":  provider.StateDeleting,
	}, byID)

	require.NoError(t, p.Delete(t.Context(), "projects/proj-a/zones/us-central1-a/instances/px-b"))
	var names []string
	for _, fw := range srv.Firewalls() {
		names = append(names, fw.Name)
	}
	assert.Equal(t, []string{"px-a", "px-c"}, names)
}

// Rules are checked by their descriptions here, whatever the server's filter let through.
func TestListOwnedChecksRulesItself(t *testing.T) {
	srv := gcptest.NewServer(t)
	srv.AddFirewall(testProject, ourRule("px-mine", "europe-west1-b"))
	theirs := ourRule("px-theirs", "europe-west1-b")
	theirs.Description = proto.String(ruleOwner{installation: "staging", uid: testUID, zone: "europe-west1-b"}.description())
	srv.AddFirewall(testProject, theirs)
	srv.AddFirewall(testProject, &computepb.Firewall{Name: proto.String("allow-ssh"), Allowed: []*computepb.Allowed{{IPProtocol: proto.String("tcp"), Ports: []string{"22"}}}})

	p := filterIgnoringProvider(t, srv)

	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Equal(t, "px-mine", listed[0].Name)
	assert.Equal(t, provider.StateDeleting, listed[0].State)
}

func TestListOwnedRuleErrorsAreClassified(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.FailNext(gcptest.MethodFirewallList, http.StatusForbidden, "forbidden", "Required 'compute.firewalls.list' permission")
	_, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

// Whether a rule is left cannot be told when it cannot be read: Get says so rather than
// guess that the instance is gone.
func TestGetWhenTheRuleCannotBeRead(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.FailNext(gcptest.MethodFirewallGet, http.StatusForbidden, "forbidden", "Required 'compute.firewalls.get' permission")
	_, err := p.Get(t.Context(), "projects/proj-a/zones/europe-west1-b/instances/px-a")
	require.Error(t, err)
	assert.NotErrorIs(t, err, provider.ErrNotFound)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}
