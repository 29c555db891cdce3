package gcp

import (
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp/gcptest"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// internalSpec is a Proxy reached inside the VPC, under the VPC's own rules: no external
// IP, no ranges, so no rule.
func internalSpec() *v1alpha1.GCPSpec {
	g := minimalSpec()
	g.ExternalIP = proto.Bool(false)
	g.AllowedSourceRanges = nil
	return g
}

// ruleFor is the configuration of the rule req needs in the test project.
func ruleFor(t *testing.T, req provider.CreateRequest) ruleConfig {
	t.Helper()
	c, err := ruleConfigFor(req, testProject)
	require.NoError(t, err)
	require.NotNil(t, c)
	return *c
}

// minimalSharedRule is the rule gcpRequest(_, minimalSpec()) needs, as a person might
// find it in the console.
func minimalSharedRule(t *testing.T) *computepb.Firewall {
	return ruleFor(t, gcpRequest("px-a", minimalSpec())).firewall()
}

// ourRule is a per-instance rule as versions before shared rules made it for
// gcpRequest(name, minimalSpec()).
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

// addLegacyInstance stores an instance as versions before shared rules made it: tagged
// with its own name, no description, and its own rule beside it.
func addLegacyInstance(t *testing.T, srv *gcptest.Server, name, zone string) string {
	t.Helper()
	req := gcpRequest(name, minimalSpec())
	srv.AddInstance(testProject, zone, &computepb.Instance{
		Name:   proto.String(name),
		Labels: req.Labels(),
		Tags:   &computepb.Tags{Items: []string{name}},
		Status: proto.String("RUNNING"),
		NetworkInterfaces: []*computepb.NetworkInterface{{AccessConfigs: []*computepb.AccessConfig{{
			Name: proto.String("External NAT"), NatIP: proto.String("198.51.100.9"),
		}}}},
	})
	srv.AddFirewall(testProject, ourRule(name, zone))
	return "projects/" + testProject + "/zones/" + zone + "/instances/" + name
}

func onlyRule(t *testing.T, srv *gcptest.Server) gcptest.Firewall {
	t.Helper()
	rules := srv.Firewalls()
	require.Len(t, rules, 1)
	return rules[0]
}

func ruleNames(srv *gcptest.Server) []string {
	var names []string
	for _, fw := range srv.Firewalls() {
		names = append(names, fw.Name)
	}
	return names
}

// writes are the rule changes the provider made: inserts, updates and deletes.
func writes(srv *gcptest.Server) int {
	return srv.Requests(gcptest.MethodFirewallInsert) + srv.Requests(gcptest.MethodFirewallUpdate) + srv.Requests(gcptest.MethodFirewallDelete)
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
	name := ruleFor(t, req).name()

	fw := onlyRule(t, srv)
	assert.Equal(t, testProject, fw.Project)
	assert.Equal(t, name, fw.Name)
	assert.True(t, strings.HasPrefix(fw.Name, "proxyfleet-fw-"), fw.Name)
	assert.True(t, strings.HasSuffix(fw.Network, "/projects/proj-a/global/networks/crawl-net"), fw.Network)
	assert.Equal(t, "INGRESS", fw.Direction)
	assert.Equal(t, []string{"198.51.100.0/24", "203.0.113.7/32"}, fw.SourceRanges)
	assert.Equal(t, []string{"tcp:8080"}, fw.Allowed, "the proxy port and nothing else")
	assert.Equal(t, []string{name}, fw.TargetTags, "the instances of this configuration alone")
	assert.False(t, fw.Disabled)
	installation, ok := parseSharedRuleOwner(fw.Description)
	require.True(t, ok, fw.Description)
	assert.Equal(t, "prod-eu", installation)

	inst := srv.Instances()
	require.Len(t, inst, 1)
	assert.Equal(t, []string{"squid", name}, inst[0].Tags, "the instance carries the tag the rule targets")
	assert.Equal(t, name, inst[0].Labels[labelFirewall], "and says which rule it uses, for the sweep")
	got, ok := parseInstanceRule(inst[0].Resource, testProject)
	require.True(t, ok, "the instance records the rule's configuration: %s", inst[0].Resource.GetDescription())
	assert.Equal(t, ruleFor(t, req), got)
	assert.Equal(t, 1, srv.Requests(gcptest.MethodGetGlobalOperation), "the rule's operation is global, polled as such")
	assert.Equal(t, 1, srv.Requests(gcptest.MethodGetOperation))
}

// TestInstancesShareARulePerConfiguration: any number of instances with the same
// installation, network, ranges and port (whatever their Proxy or zone) make one rule;
// another port, other ranges, another network or another installation make another.
func TestInstancesShareARulePerConfiguration(t *testing.T) {
	p, srv := newTestProvider(t)
	var same []provider.CreateRequest
	for i, zone := range []string{"europe-west1-b", "europe-west1-c", "us-central1-a", "europe-west1-b"} {
		req := gcpRequest("px-same-"+string(rune('a'+i)), minimalSpec())
		req.Spec.GCP.Zone = zone
		req.ProxyUID = "0b6d1c1e-8a7e-4d0c-9d57-00000000000" + string(rune('0'+i))
		same = append(same, req)
	}
	for _, req := range same {
		create(t, p, req)
	}
	assert.Equal(t, []string{minimalRule}, ruleNames(srv), "four instances, one rule")
	for _, inst := range srv.Instances() {
		assert.Contains(t, inst.Tags, minimalRule, inst.Name)
	}

	port := gcpRequest("px-port", minimalSpec())
	port.Port = 8080
	ranges := gcpRequest("px-ranges", minimalSpec())
	ranges.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "192.0.2.0/24"}
	network := gcpRequest("px-network", minimalSpec())
	network.Spec.GCP.Network = "crawl-net"
	staging := gcpRequest("px-staging", minimalSpec())
	staging.Installation = "staging"
	for _, req := range []provider.CreateRequest{port, ranges, network, staging} {
		create(t, p, req)
		create(t, p, req) // again: still one rule each
	}
	assert.ElementsMatch(t, []string{
		minimalRule, ruleFor(t, port).name(), ruleFor(t, ranges).name(), ruleFor(t, network).name(), ruleFor(t, staging).name(),
	}, ruleNames(srv))
	var portRule gcptest.Firewall
	for _, fw := range srv.Firewalls() {
		if fw.Name == ruleFor(t, port).name() {
			portRule = fw
		}
	}
	assert.Equal(t, []string{"tcp:8080"}, portRule.Allowed)
	assert.Zero(t, srv.Requests(gcptest.MethodFirewallUpdate), "no rule was ever changed to suit another configuration")
}

// The rule comes first: without it nothing billable is made.
func TestCreateMakesNoInstanceWithoutItsRule(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.FailNext(gcptest.MethodFirewallInsert, http.StatusForbidden, "forbidden", "Required 'compute.firewalls.create' permission for 'projects/proj-a/global/firewalls/x'")
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

// sharedInsertID is the request ID of the first insert of the minimal spec's rule.
func sharedInsertID() string {
	return nameUUID(string(callFirewallInsert) + " " + firewallPath(testProject, minimalRule) + " prod-eu")
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
	assert.Equal(t, sharedInsertID(), ids[0])
	assert.Equal(t, ids[0], ids[1])
	assert.NotEqual(t, ids[1], ids[2])

	p2, srv2 := newTestProvider(t)
	srv2.FailNextOperation(gcptest.MethodFirewallInsert, 404, "RESOURCE_NOT_FOUND", "The resource 'projects/proj-a/global/networks/nope' was not found")
	_, err = p2.Create(t.Context(), req)
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

// The create path tolerates a rule that is already there: its own earlier attempt's,
// another instance's, or one a person (or a sweep on another worker) left as it should be.
func TestCreateTakesAnExistingRuleAsItIs(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())
	create(t, p, req)
	before := onlyRule(t, srv)
	create(t, p, req)
	other := gcpRequest("px-b", minimalSpec())
	other.ProxyUID = "ffffffff-0000-0000-0000-000000000000"
	create(t, p, other)

	after := onlyRule(t, srv)
	assert.True(t, proto.Equal(before.Resource, after.Resource), "nothing to correct")
	assert.Zero(t, srv.Requests(gcptest.MethodFirewallUpdate))
	id := sharedInsertID()
	assert.Equal(t, []string{id, id, id}, srv.RequestIDs(gcptest.MethodFirewallInsert),
		"every create of the configuration sends the same request ID, and GCE answers with the first insert")
	assert.Len(t, srv.Instances(), 2)

	p2, srv2 := newTestProvider(t)
	srv2.AddFirewall(testProject, minimalSharedRule(t))
	srv2.ForgetRequestIDs()
	create(t, p2, req)
	assert.Zero(t, srv2.Requests(gcptest.MethodFirewallUpdate))
	assert.Len(t, srv2.Instances(), 1)
}

// driftCases are edits that make a rule of ours admit more, or other, than it should.
var driftCases = []struct {
	name  string
	drift func(*computepb.Firewall)
}{
	{"ranges widened", func(fw *computepb.Firewall) { fw.SourceRanges = []string{"0.0.0.0/0"} }},
	{"a range added", func(fw *computepb.Firewall) { fw.SourceRanges = append(fw.SourceRanges, "192.0.2.0/24") }},
	{"another port", func(fw *computepb.Firewall) { fw.Allowed[0].Ports = []string{"3128", "22"} }},
	{"all protocols", func(fw *computepb.Firewall) { fw.Allowed = []*computepb.Allowed{{IPProtocol: proto.String("all")}} }},
	{"a source tag", func(fw *computepb.Firewall) { fw.SourceTags = []string{"anything"} }},
	{"every instance", func(fw *computepb.Firewall) { fw.TargetTags = nil }},
	{"another target", func(fw *computepb.Firewall) { fw.TargetTags = []string{"web"} }},
	{"disabled", func(fw *computepb.Firewall) { fw.Disabled = proto.Bool(true) }},
}

func assertRuleAsWanted(t *testing.T, srv *gcptest.Server) {
	t.Helper()
	fw := onlyRule(t, srv)
	assert.Equal(t, minimalRule, fw.Name)
	assert.Equal(t, []string{"203.0.113.0/24"}, fw.SourceRanges)
	assert.Equal(t, []string{"tcp:3128"}, fw.Allowed)
	assert.Empty(t, fw.SourceTags)
	assert.Equal(t, []string{minimalRule}, fw.TargetTags)
	assert.False(t, fw.Disabled)
}

// A rule of ours that admits more, or other, than it should is put back by a create.
func TestCreateCorrectsADriftedRule(t *testing.T) {
	for _, tc := range driftCases {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			drifted := minimalSharedRule(t)
			tc.drift(drifted)
			drifted.LogConfig = &computepb.FirewallLogConfig{Enable: proto.Bool(true)}
			srv.AddFirewall(testProject, drifted)

			create(t, p, gcpRequest("px-a", minimalSpec()))
			assertRuleAsWanted(t, srv)
			assert.True(t, onlyRule(t, srv).Resource.GetLogConfig().GetEnable(), "an operator's logging is kept")
			assert.Equal(t, 1, srv.Requests(gcptest.MethodFirewallUpdate))
			assert.Len(t, srv.Instances(), 1)

			create(t, p, gcpRequest("px-a", minimalSpec()))
			assert.Equal(t, 1, srv.Requests(gcptest.MethodFirewallUpdate), "corrected once")
		})
	}
}

// A live instance's rule is put back by Get, the call the workflow's wait and the
// monitor's drift checks make: a shared rule may see no create of its configuration for
// months.
func TestGetPutsBackADriftedRule(t *testing.T) {
	for _, tc := range driftCases {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			p.ruleRecheck = 0
			inst := create(t, p, gcpRequest("px-a", minimalSpec()))
			drifted := minimalSharedRule(t)
			tc.drift(drifted)
			srv.AddFirewall(testProject, drifted)

			got, err := p.Get(t.Context(), inst.ProviderID)
			require.NoError(t, err)
			assert.Equal(t, provider.StateProvisioning, got.State)
			assertRuleAsWanted(t, srv)
			assert.Equal(t, 1, srv.Requests(gcptest.MethodFirewallUpdate))
		})
	}
}

// A rule deleted while an instance uses it (by hand, or by a sweep that raced the
// instance's create) is made again by the next Get of a live instance; a stopped one, which
// the workflow replaces, does not bring it back.
func TestGetPutsBackADeletedRule(t *testing.T) {
	p, srv := newTestProvider(t)
	p.ruleRecheck = 0
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	srv.ForgetRequestIDs()
	srv.RemoveFirewall(testProject, minimalRule)

	srv.SetStatus("px-a", "TERMINATED")
	_, err := p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err)
	assert.Empty(t, srv.Firewalls(), "not for a stopped instance")

	srv.SetStatus("px-a", "RUNNING")
	srv.SetNatIP("px-a", "203.0.113.50")
	got, err := p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
	assertRuleAsWanted(t, srv)
}

// Get reads a shared rule at most once per ruleRecheck: thousands of instances share a
// few rules, and each is asked about every few minutes.
func TestGetChecksARuleOncePerInterval(t *testing.T) {
	p, srv := newTestProvider(t)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	p.now = func() time.Time { return now }
	a := create(t, p, gcpRequest("px-a", minimalSpec()))
	b := create(t, p, gcpRequest("px-b", minimalSpec()))
	gets := srv.Requests(gcptest.MethodFirewallGet)

	for range 3 {
		for _, id := range []string{a.ProviderID, b.ProviderID} {
			_, err := p.Get(t.Context(), id)
			require.NoError(t, err)
		}
	}
	assert.Equal(t, gets, srv.Requests(gcptest.MethodFirewallGet), "the create has just checked the rule")

	now = now.Add(ruleRecheck)
	srv.RemoveFirewall(testProject, minimalRule)
	_, err := p.Get(t.Context(), a.ProviderID)
	require.NoError(t, err)
	assert.Greater(t, srv.Requests(gcptest.MethodFirewallGet), gets, "read again once the interval is over")
	assertRuleAsWanted(t, srv)
	gets = srv.Requests(gcptest.MethodFirewallGet)
	_, err = p.Get(t.Context(), b.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, gets, srv.Requests(gcptest.MethodFirewallGet), "and then not again for the other instance")
}

// A rule Get cannot put back does not make Get fail: its answer (running, stopped,
// preempted) matters to the caller all the same. It is logged, and tried again.
func TestGetReportsTheInstanceWhenItsRuleCannotBePutBack(t *testing.T) {
	p, srv := newTestProvider(t)
	p.ruleRecheck = 0
	var logs testenv.LogBuffer
	p.log = slog.New(slog.NewTextHandler(&logs, nil))
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	srv.RemoveFirewall(testProject, minimalRule)
	srv.SetStatus("px-a", "RUNNING")
	srv.FailNext(gcptest.MethodFirewallGet, http.StatusForbidden, "forbidden", "Required 'compute.firewalls.get' permission")

	got, err := p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, "px-a", got.Name)
	assert.Contains(t, logs.String(), "could not be put back")
	assert.Contains(t, logs.String(), minimalRule)
	assert.Empty(t, srv.Firewalls())

	_, err = p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err)
	assertRuleAsWanted(t, srv)
}

// racingProvider is a provider whose requests pass through before on their way to srv:
// a test's chance to change the fake between two of the provider's calls, as another
// worker would. The transport has no proxy, so nothing leaves the loopback interface.
func racingProvider(t *testing.T, srv *gcptest.Server, before func(*http.Request)) *Provider {
	t.Helper()
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		before(r)
		return inner.RoundTrip(r)
	})}
	p, err := New(t.Context(), Config{DefaultProject: testProject, ClientOptions: []option.ClientOption{
		option.WithEndpoint(srv.URL), option.WithoutAuthentication(), option.WithHTTPClient(client),
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	p.pollFirst, p.pollMax = time.Millisecond, 5*time.Millisecond
	return p
}

// A sweep that found the rule unused and deleted it just before this create's instance was
// inserted: the create checks the rule again after the insert and makes it again.
func TestCreateAfterASweepRaceMakesTheRuleAgain(t *testing.T) {
	srv := gcptest.NewServer(t)
	srv.AddFirewall(testProject, minimalSharedRule(t))
	var raced bool
	p := racingProvider(t, srv, func(r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/instances") && !raced {
			raced = true
			srv.RemoveFirewall(testProject, minimalRule)
		}
	})
	create(t, p, gcpRequest("px-a", minimalSpec()))
	require.True(t, raced)
	assertRuleAsWanted(t, srv)
}

// A rule of the shared rule's name that is not a shared rule of this installation is
// neither taken over nor changed.
func TestCreateRefusesAnotherOwnersRule(t *testing.T) {
	tests := []struct {
		name string
		edit func(*computepb.Firewall)
	}{
		{"made by hand", func(fw *computepb.Firewall) { fw.Description = proto.String("squid for the office") }},
		{"no description", func(fw *computepb.Firewall) { fw.Description = nil }},
		{"another installation's", func(fw *computepb.Firewall) { fw.Description = proto.String(sharedRuleDescription("staging")) }},
		{"a per-instance rule's description", func(fw *computepb.Firewall) {
			fw.Description = proto.String(ruleOwner{installation: "prod-eu", uid: testUID, zone: "europe-west1-b"}.description())
		}},
		{"our prefix with something after it", func(fw *computepb.Firewall) {
			fw.Description = proto.String(sharedRuleDescription("prod-eu") + " extra=1")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			fw := minimalSharedRule(t)
			fw.SourceRanges = []string{"0.0.0.0/0"} // a change, were the rule ours
			tc.edit(fw)
			srv.AddFirewall(testProject, fw)
			before := onlyRule(t, srv)

			_, err := p.Create(t.Context(), gcpRequest("px-a", minimalSpec()))
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), "not made by this installation")
			assert.Zero(t, srv.Requests(gcptest.MethodFirewallUpdate))
			assert.Zero(t, srv.Requests(gcptest.MethodInsert), "no instance behind a rule that is not ours")
			assert.True(t, proto.Equal(before.Resource, onlyRule(t, srv).Resource), "the rule is untouched")
		})
	}
}

func TestCreateRefusesItsRuleOnAnotherNetwork(t *testing.T) {
	p, srv := newTestProvider(t)
	fw := minimalSharedRule(t)
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
	assert.Empty(t, inst[0].Tags, "no rule to be selected by")
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

	require.NoError(t, p.Delete(t.Context(), created.ProviderID))
	assert.Zero(t, writes(srv), "no rule was ever made, changed or deleted")
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

// sweep is what the orphan sweeper does with one installation-wide list: delete every
// instance whose Proxy is not live (here: none is) and that is old enough (here: all).
func sweep(t *testing.T, p *Provider, live ...string) []provider.Instance {
	t.Helper()
	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	var swept []provider.Instance
	for _, inst := range listed {
		if !slices.Contains(live, inst.ProxyUID()) {
			require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
			swept = append(swept, inst)
		}
	}
	return swept
}

// Deleting one of two users keeps the rule; once the last is gone the sweep finds the rule
// unused and deletes it. A rule in use is never reported, and one Proxy's list never
// shows a shared rule.
func TestTheSweepDeletesARuleOnceUnused(t *testing.T) {
	p, srv := newTestProvider(t)
	a := create(t, p, gcpRequest("px-a", minimalSpec()))
	bReq := gcpRequest("px-b", minimalSpec())
	bReq.ProxyUID = "ffffffff-0000-0000-0000-000000000000"
	b := create(t, p, bReq)

	require.NoError(t, p.Delete(t.Context(), a.ProviderID))
	assert.Equal(t, []string{minimalRule}, ruleNames(srv), "px-b still uses it")
	_, err := p.Get(t.Context(), a.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound, "a deleted instance is gone; the shared rule is not its to wait for")
	assert.Empty(t, sweep(t, p, bReq.ProxyUID), "nothing to sweep while px-b lives")
	assert.Equal(t, []string{minimalRule}, ruleNames(srv))

	require.NoError(t, p.Delete(t.Context(), b.ProviderID))
	assert.Equal(t, []string{minimalRule}, ruleNames(srv), "the delete leaves the rule to the sweep")
	_, err = p.Get(t.Context(), b.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound)

	mine, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu", ProxyUID: bReq.ProxyUID})
	require.NoError(t, err)
	assert.Empty(t, mine, "a shared rule is no Proxy's")

	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	unused := listed[0]
	assert.Equal(t, minimalRule, unused.Name)
	assert.Equal(t, firewallPath(testProject, minimalRule), unused.ProviderID)
	assert.Equal(t, provider.StateDeleting, unused.State)
	assert.Equal(t, sharedRuleUID, unused.ProxyUID(), "no live Proxy's")
	assert.Equal(t, "prod-eu", unused.Labels[provider.LabelInstallation])
	assert.False(t, unused.CreatedAt.IsZero(), "the rule's age, for the sweep's minimum age")
	got, err := p.Get(t.Context(), unused.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, unused, got)

	swept := sweep(t, p)
	require.Len(t, swept, 1)
	assert.Empty(t, srv.Firewalls())
	_, err = p.Get(t.Context(), unused.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	require.NoError(t, p.Delete(t.Context(), unused.ProviderID), "deleting what is gone succeeds")
	assert.Equal(t, 1, srv.Requests(gcptest.MethodFirewallDelete))
}

// The sweep decides on a list; a create of the same configuration may come between the
// list and the delete. The delete checks for users again (asking the server for them by
// label) and keeps a rule that has one.
func TestTheSweepKeepsARuleThatFoundAUserMeanwhile(t *testing.T) {
	p, srv := newTestProvider(t)
	a := create(t, p, gcpRequest("px-a", minimalSpec()))
	require.NoError(t, p.Delete(t.Context(), a.ProviderID))
	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	require.Len(t, listed, 1)

	create(t, p, gcpRequest("px-b", minimalSpec()))
	// Declined as in use, so the sweep counts it kept, not deleted.
	require.ErrorIs(t, p.Delete(t.Context(), listed[0].ProviderID), provider.ErrInUse)
	assert.Equal(t, []string{minimalRule}, ruleNames(srv))
	assert.Zero(t, srv.Requests(gcptest.MethodFirewallDelete))
	assert.Contains(t, srv.Filters(gcptest.MethodAggregatedList),
		`(labels.proxyfleet-installation = "prod-eu") (labels.proxyfleet-firewall = "`+minimalRule+`")`)
}

// A provider ID naming a rule deletes only a shared rule of ours: never a rule made by
// hand, another installation's, or a per-instance one.
func TestDeletingARuleByIDDeletesOnlyOurSharedRules(t *testing.T) {
	p, srv := newTestProvider(t)
	hand := minimalSharedRule(t)
	hand.Name = proto.String("proxyfleet-fw-0000000000000000")
	hand.Description = proto.String("by hand")
	srv.AddFirewall(testProject, hand)
	legacy := ourRule("px-a", "europe-west1-b")
	srv.AddFirewall(testProject, legacy)

	require.NoError(t, p.Delete(t.Context(), firewallPath(testProject, "proxyfleet-fw-0000000000000000")))
	_, err := p.Get(t.Context(), firewallPath(testProject, "proxyfleet-fw-0000000000000000"))
	assert.ErrorIs(t, err, provider.ErrNotFound)
	err = p.Delete(t.Context(), firewallPath(testProject, "px-a"))
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err), "not a provider ID at all")
	assert.Len(t, srv.Firewalls(), 2)
	assert.Zero(t, srv.Requests(gcptest.MethodFirewallDelete))
}

// An instance made before rules were shared keeps working after the upgrade: Get reports
// it as it is and touches no rule, Delete removes it and its own rule.
func TestAnOldInstanceKeepsItsOwnRule(t *testing.T) {
	p, srv := newTestProvider(t)
	p.ruleRecheck = 0
	id := addLegacyInstance(t, srv, "px-old", "europe-west1-b")

	got, err := p.Get(t.Context(), id)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
	assert.Equal(t, "198.51.100.9", got.IP)
	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	require.Len(t, listed, 1, "the old rule is its instance's, not an unused shared rule")
	assert.Equal(t, id, listed[0].ProviderID)
	assert.Zero(t, writes(srv), "nothing of the old instance is changed")

	// A replacement after the upgrade gets the shared rule; the old instance keeps its own.
	create(t, p, gcpRequest("px-new", minimalSpec()))
	assert.ElementsMatch(t, []string{"px-old", minimalRule}, ruleNames(srv))

	require.NoError(t, p.Delete(t.Context(), id))
	assert.Equal(t, []string{minimalRule}, ruleNames(srv), "deleted with its instance")
	_, err = p.Get(t.Context(), id)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	assert.Equal(t, []string{requestID(callFirewallDelete, ref{testProject, "europe-west1-b", "px-old"}, "")},
		srv.RequestIDs(gcptest.MethodFirewallDelete), "the request ID the old version sent, so an old delete in flight is recognised")
}

// A per-instance rule whose instance's rule is not its own is left alone, and does not
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

// An old instance's delete cut short between the instance and its rule: the instance is
// reported as deleting until a later Delete removes the rule, and the sweeper's list shows
// it.
func TestAnOldRuleLeftBehindKeepsTheInstanceDeleting(t *testing.T) {
	p, srv := newTestProvider(t)
	id := addLegacyInstance(t, srv, "px-a", "europe-west1-b")
	srv.FailNext(gcptest.MethodFirewallDelete, http.StatusServiceUnavailable, "backendError", "Service Unavailable")

	err := p.Delete(t.Context(), id)
	require.Error(t, err)
	assert.Equal(t, provider.KindTransient, provider.Class(err))
	assert.Empty(t, srv.Instances())
	require.Len(t, srv.Firewalls(), 1)

	got, err := p.Get(t.Context(), id)
	require.NoError(t, err, "not gone while its rule is there")
	assert.Equal(t, provider.StateDeleting, got.State)
	assert.Equal(t, id, got.ProviderID)
	assert.Equal(t, "px-a", got.Name)
	assert.Empty(t, got.IP)
	assert.Equal(t, testUID, got.ProxyUID())
	assert.Equal(t, "prod-eu", got.Labels[provider.LabelInstallation])
	assert.False(t, got.CreatedAt.IsZero(), "the rule's age, for the sweeper's minimum age")

	for _, owner := range []provider.Owner{{Installation: "prod-eu"}, {Installation: "prod-eu", ProxyUID: testUID}} {
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

	assert.Len(t, sweep(t, p), 1)
	assert.Empty(t, srv.Firewalls())
	_, err = p.Get(t.Context(), id)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	assert.Empty(t, listed)
}

// The sweeper deletes what ListOwned returns: an old rule whose instance is gone is
// reported under its instance's provider ID (zone included), and one whose name is used by
// an instance that is not the owner's is not reported at all.
func TestListOwnedReportsLeakedOldRules(t *testing.T) {
	p, srv := newTestProvider(t)
	addLegacyInstance(t, srv, "px-a", "europe-west1-b")
	addLegacyInstance(t, srv, "px-b", "us-central1-a")
	addLegacyInstance(t, srv, "px-c", "europe-west1-b")
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
		"projects/proj-a/zones/europe-west1-b/instances/px-a": provider.StateRunning,
		"projects/proj-a/zones/us-central1-a/instances/px-b":  provider.StateDeleting,
	}, byID)

	require.NoError(t, p.Delete(t.Context(), "projects/proj-a/zones/us-central1-a/instances/px-b"))
	assert.Equal(t, []string{"px-a", "px-c"}, ruleNames(srv))
}

// Listing one Proxy's instances asks the server for that Proxy's alone, instances by label
// and old rules by description, and never lists shared rules; listing the installation asks
// for the installation's. Nothing is read unfiltered.
func TestListOwnedAsksTheServerForItsOwn(t *testing.T) {
	p, srv := newTestProvider(t)
	_, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu", ProxyUID: testUID})
	require.NoError(t, err)
	assert.Equal(t, []string{
		`(labels.proxyfleet-installation = "prod-eu") (labels.proxyfleet-uid = "` + testUID + `")`,
	}, srv.Filters(gcptest.MethodAggregatedList))
	assert.Equal(t, []string{
		`description eq "` + ruleDescriptionPrefix + ` proxyfleet-installation=prod-eu proxyfleet-uid=` + testUID + ` .*"`,
	}, srv.Filters(gcptest.MethodFirewallList))

	p2, srv2 := newTestProvider(t)
	_, err = p2.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	assert.Equal(t, []string{`labels.proxyfleet-installation = "prod-eu"`}, srv2.Filters(gcptest.MethodAggregatedList))
	assert.Equal(t, []string{
		`description eq "` + ruleDescriptionPrefix + ` proxyfleet-installation=prod-eu .*"`,
		`description eq "` + sharedRuleDescriptionPrefix + ` proxyfleet-installation=prod-eu"`,
	}, srv2.Filters(gcptest.MethodFirewallList))
}

// What the server answers is what the filters select: another Proxy's instances and old
// rules, other installations' shared rules and rules of nobody's never reach the provider.
func TestListOwnedReadsOnlyItsOwn(t *testing.T) {
	p, srv := newTestProvider(t)
	other := gcpRequest("px-other", minimalSpec())
	other.ProxyUID = "ffffffff-0000-0000-0000-000000000000"
	create(t, p, other)
	staging := gcpRequest("px-staging", minimalSpec())
	staging.Installation = "staging"
	create(t, p, staging)
	addLegacyInstance(t, srv, "px-old", "europe-west1-b")
	theirs := ourRule("px-theirs", "europe-west1-b")
	theirs.Description = proto.String(ruleOwner{installation: "prod-eu", uid: other.ProxyUID, zone: "europe-west1-b"}.description())
	srv.AddFirewall(testProject, theirs)

	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu", ProxyUID: testUID})
	require.NoError(t, err)
	require.Len(t, listed, 1)
	assert.Equal(t, "px-old", listed[0].Name)
	assert.Zero(t, srv.Requests(gcptest.MethodGet), "no rule of another Proxy's was read, so none needed checking")
}

// Rules are checked by their descriptions here, whatever the server's filter let through.
func TestListOwnedChecksRulesItself(t *testing.T) {
	srv := gcptest.NewServer(t)
	srv.AddFirewall(testProject, ourRule("px-mine", "europe-west1-b"))
	theirs := ourRule("px-theirs", "europe-west1-b")
	theirs.Description = proto.String(ruleOwner{installation: "staging", uid: testUID, zone: "europe-west1-b"}.description())
	srv.AddFirewall(testProject, theirs)
	stagingShared := minimalSharedRule(t)
	stagingShared.Name = proto.String("proxyfleet-fw-1111111111111111")
	stagingShared.Description = proto.String(sharedRuleDescription("staging"))
	srv.AddFirewall(testProject, stagingShared)
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
