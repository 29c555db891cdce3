package gcp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"strings"
	"testing"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/gcp/gcptest"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

const testProject = "proj-a"

// newTestProvider runs the real client against a fresh fake.
func newTestProvider(t *testing.T) (*Provider, *gcptest.Server) {
	t.Helper()
	srv := gcptest.NewServer(t)
	p, err := New(t.Context(), Config{DefaultProject: testProject, ClientOptions: srv.ClientOptions()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	// Operations the fake holds RUNNING are polled without the real pauses.
	p.pollFirst, p.pollMax = time.Millisecond, 5*time.Millisecond
	return p, srv
}

// instanceOperations are the fake's zonal operations: the instances', not the rules'.
func instanceOperations(srv *gcptest.Server) []gcptest.Operation {
	var out []gcptest.Operation
	for _, op := range srv.Operations() {
		if !op.Global {
			out = append(out, op)
		}
	}
	return out
}

func create(t *testing.T, p *Provider, req provider.CreateRequest) provider.Instance {
	t.Helper()
	inst, err := p.Create(t.Context(), req)
	require.NoError(t, err)
	return inst
}

func TestNewNeedsDefaultProject(t *testing.T) {
	_, err := New(t.Context(), Config{})
	assert.ErrorContains(t, err, "DefaultProject")
}

func TestCreateThenGetFollowsStatus(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())

	created := create(t, p, req)
	assert.Equal(t, "projects/proj-a/zones/europe-west1-b/instances/px-a", created.ProviderID)
	assert.Equal(t, p.ProviderID(req), created.ProviderID, "the ID is known before Create returns")
	assert.Equal(t, provider.StateProvisioning, created.State)
	assert.False(t, created.CreatedAt.IsZero())

	got, err := p.Get(t.Context(), created.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, "px-a", got.Name)
	assert.Equal(t, created.ProviderID, got.ProviderID)
	assert.Equal(t, provider.StateProvisioning, got.State)
	assert.Empty(t, got.IP)
	assert.False(t, got.CreatedAt.IsZero())
	assert.Equal(t, req.ProxyUID, got.ProxyUID())

	srv.SetStatus("px-a", "RUNNING")
	got, err = p.Get(t.Context(), created.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateProvisioning, got.State, "RUNNING without an external IP cannot carry traffic")
	assert.Empty(t, got.IP)

	srv.SetNatIP("px-a", "203.0.113.7")
	got, err = p.Get(t.Context(), created.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
	assert.Equal(t, "203.0.113.7", got.IP)

	assert.Equal(t, 1, srv.Requests(gcptest.MethodInsert))
}

// TestSpotVMsArePreemptible: spec.gcp.spot makes a Spot VM (stopped, not deleted, when GCE
// takes it back), and a preempted one reads as Stopped and Preempted, so the workflow can
// say so and replace it. A standard VM that stops is not called preempted.
func TestSpotVMsArePreemptible(t *testing.T) {
	p, srv := newTestProvider(t)
	spot := minimalSpec()
	spot.Spot = true
	s := create(t, p, gcpRequest("px-spot", spot))
	std := create(t, p, gcpRequest("px-std", minimalSpec()))

	for _, inst := range srv.Instances() {
		sc := inst.Resource.GetScheduling()
		if inst.Name == "px-std" {
			assert.Empty(t, sc.GetProvisioningModel(), "a standard VM asks for no Spot capacity")
			continue
		}
		assert.Equal(t, "SPOT", sc.GetProvisioningModel())
		assert.Equal(t, "STOP", sc.GetInstanceTerminationAction(), "stopped, so Get can still tell a preemption")
		assert.Equal(t, "TERMINATE", sc.GetOnHostMaintenance())
		assert.False(t, sc.GetAutomaticRestart())
	}

	for _, name := range []string{"px-spot", "px-std"} {
		srv.SetStatus(name, "RUNNING")
		srv.SetNatIP(name, "203.0.113.9")
	}
	got, err := p.Get(t.Context(), s.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateRunning, got.State)
	assert.False(t, got.Preempted)

	srv.Preempt("px-spot")
	got, err = p.Get(t.Context(), s.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateStopped, got.State)
	assert.True(t, got.Preempted)
	assert.Empty(t, got.IP, "a preempted VM loses its ephemeral address")

	srv.SetStatus("px-std", "TERMINATED")
	got, err = p.Get(t.Context(), std.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateStopped, got.State)
	assert.False(t, got.Preempted, "only Spot VMs are preempted")
}

func TestGetMapsStatus(t *testing.T) {
	tests := []struct {
		status string
		natIP  string
		want   provider.State
	}{
		{status: "PROVISIONING", want: provider.StateProvisioning},
		{status: "STAGING", want: provider.StateProvisioning},
		{status: "REPAIRING", natIP: "203.0.113.8", want: provider.StateProvisioning},
		{status: "RUNNING", want: provider.StateProvisioning},
		{status: "RUNNING", natIP: "203.0.113.8", want: provider.StateRunning},
		{status: "STOPPING", natIP: "203.0.113.8", want: provider.StateStopped},
		{status: "STOPPED", want: provider.StateStopped},
		{status: "SUSPENDING", want: provider.StateStopped},
		{status: "SUSPENDED", want: provider.StateStopped},
		{status: "TERMINATED", want: provider.StateStopped},
		{status: "SOMETHING_NEW", natIP: "203.0.113.8", want: provider.StateStopped},
	}
	p, srv := newTestProvider(t)
	inst := create(t, p, gcpRequest("px-s", minimalSpec()))
	for _, tc := range tests {
		t.Run(tc.status+"/"+tc.natIP, func(t *testing.T) {
			srv.SetStatus("px-s", tc.status)
			srv.SetNatIP("px-s", tc.natIP)
			got, err := p.Get(t.Context(), inst.ProviderID)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.State)
			if tc.want == provider.StateRunning {
				assert.Equal(t, tc.natIP, got.IP)
			} else {
				assert.Empty(t, got.IP, "only a running instance has an address to offer")
			}
		})
	}
}

func TestCreateTwiceAdoptsTheFirst(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())

	first := create(t, p, req)
	srv.SetStatus("px-a", "RUNNING")
	srv.SetNatIP("px-a", "203.0.113.9")
	second := create(t, p, req)

	assert.Equal(t, first.ProviderID, second.ProviderID)
	assert.Equal(t, provider.StateRunning, second.State, "the retry reports the existing instance as it is")
	assert.Equal(t, "203.0.113.9", second.IP)
	assert.Len(t, srv.Instances(), 1)
	assert.Equal(t, 2, srv.Requests(gcptest.MethodInsert))
	assert.Equal(t, 1, srv.Requests(gcptest.MethodGet))
}

// TestCreateRetriedUnderAnotherKeyReportsTheVMsKey: a create cut short by a fleet key
// rotation is retried under the new primary key. The VM was built with the first key's
// credentials, and that is the key the retry must report, or every probe would present
// the wrong password.
func TestCreateRetriedUnderAnotherKeyReportsTheVMsKey(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.HoldNextOperation(gcptest.MethodInsert, 1_000_000)
	req := gcpRequest("px-a", minimalSpec())
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := p.Create(ctx, req)
	require.ErrorIs(t, err, context.DeadlineExceeded, "the first attempt is cut short while GCE builds the VM")

	// Bounded: answered with the first attempt's operation, the retry would wait on it.
	retry := req
	retry.KeyID = "ffff0000"
	ctx2, cancel2 := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel2()
	got, err := p.Create(ctx2, retry)
	require.NoError(t, err)
	assert.Equal(t, req.KeyID, got.Labels[provider.LabelKeyID], "the VM's own key, not the retry's")
	assert.Len(t, srv.Instances(), 1)
}

func TestCreateRefusesANameOwnedByAnotherProxy(t *testing.T) {
	p, _ := newTestProvider(t)
	create(t, p, gcpRequest("px-a", minimalSpec()))

	other := gcpRequest("px-a", minimalSpec())
	other.ProxyUID = "ffffffff-0000-0000-0000-000000000000"
	_, err := p.Create(t.Context(), other)
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

func TestCreateSendsStartupScriptAndOwnershipLabels(t *testing.T) {
	p, srv := newTestProvider(t)
	g := minimalSpec()
	g.Tags = []v1alpha1.NetworkTag{"squid"}
	g.Labels = map[string]v1alpha1.GCPLabelValue{
		"team":                     "crawl",
		provider.LabelProxyUID:     "hijack",
		provider.LabelInstallation: "elsewhere",
	}
	withScript := gcpRequest("px-a", g)
	withScript.CloudInit = []byte("#!/bin/sh\napt-get install -y squid\n")
	create(t, p, withScript)
	create(t, p, gcpRequest("px-b", minimalSpec()))

	got := srv.Instances()
	require.Len(t, got, 2)
	a, b := got[0], got[1]
	require.Equal(t, "px-a", a.Name)
	assert.Equal(t, map[string]string{metadataStartupScript: wantScript(t, squid.Config{}, withScript.CloudInit)}, a.Metadata,
		"the hardened Squid first, the cloud-init data after it")
	assert.Equal(t, map[string]string{
		"team":                     "crawl",
		provider.LabelProxyUID:     withScript.ProxyUID,
		provider.LabelInstallation: withScript.Installation,
		provider.LabelManagedBy:    provider.ManagedByValue,
		provider.LabelKeyID:        withScript.KeyID,
		labelFirewall:              minimalRule,
	}, a.Labels)
	assert.Equal(t, []string{"squid", minimalRule}, a.Tags, "the user's tags and the one the instance's firewall rule targets")
	assert.Equal(t, "zones/europe-west1-b/machineTypes/e2-micro", a.MachineType)
	assert.Equal(t, map[string]string{metadataStartupScript: wantScript(t, squid.Config{}, nil)}, b.Metadata,
		"no cloud-init: the hardened Squid alone")
}

func TestCreateUsesTheSpecProject(t *testing.T) {
	p, srv := newTestProvider(t)
	g := minimalSpec()
	g.Project = "proj-b"
	inst := create(t, p, gcpRequest("px-a", g))

	assert.Equal(t, "projects/proj-b/zones/europe-west1-b/instances/px-a", inst.ProviderID)
	got := srv.Instances()
	require.Len(t, got, 1)
	assert.Equal(t, "proj-b", got[0].Project)
	_, err := p.Get(t.Context(), inst.ProviderID)
	assert.NoError(t, err)
}

func TestDelete(t *testing.T) {
	p, srv := newTestProvider(t)
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))

	require.NoError(t, p.Delete(t.Context(), inst.ProviderID))
	_, err := p.Get(t.Context(), inst.ProviderID)
	assert.ErrorIs(t, err, provider.ErrNotFound)
	assert.Empty(t, srv.Instances())

	assert.NoError(t, p.Delete(t.Context(), inst.ProviderID), "deleting a missing instance succeeds")
	assert.Equal(t, 2, srv.Requests(gcptest.MethodDelete))
}

func TestDeleteErrorsAreClassified(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.FailNext(gcptest.MethodDelete, http.StatusForbidden, "forbidden", "Required 'compute.instances.delete' permission")
	err := p.Delete(t.Context(), "projects/proj-a/zones/europe-west1-b/instances/px-a")
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

func TestListOwnedAcrossZones(t *testing.T) {
	p, srv := newTestProvider(t)
	mine := []provider.CreateRequest{gcpRequest("px-a", minimalSpec()), gcpRequest("px-b", minimalSpec())}
	mine[1].Spec.GCP.Zone = "us-central1-a"
	theirs := gcpRequest("px-c", minimalSpec())
	theirs.Installation = "staging"
	for _, req := range append(mine, theirs) {
		create(t, p, req)
	}
	srv.AddInstance(testProject, "europe-west1-b", &computepb.Instance{Name: proto.String("hand-made")})
	srv.AddInstance(testProject, "asia-east1-a", &computepb.Instance{Name: proto.String("far-away")})
	srv.SetStatus("px-b", "RUNNING")
	srv.SetNatIP("px-b", "198.51.100.4")

	got, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	byName := map[string]provider.Instance{}
	for _, inst := range got {
		byName[inst.Name] = inst
	}
	require.Len(t, byName, 2)
	a, b := byName["px-a"], byName["px-b"]
	assert.Equal(t, "projects/proj-a/zones/europe-west1-b/instances/px-a", a.ProviderID)
	assert.Equal(t, "projects/proj-a/zones/us-central1-a/instances/px-b", b.ProviderID)
	assert.Equal(t, provider.StateProvisioning, a.State)
	assert.Equal(t, provider.StateRunning, b.State)
	assert.Equal(t, "198.51.100.4", b.IP)
	for _, inst := range got {
		assert.False(t, inst.CreatedAt.IsZero(), inst.Name)
		assert.Equal(t, "prod-eu", inst.Labels[provider.LabelInstallation], inst.Name)
		assert.NotEmpty(t, inst.ProxyUID(), inst.Name)
	}

	none, err := p.ListOwned(t.Context(), provider.Owner{Installation: "nobody"})
	require.NoError(t, err)
	assert.Empty(t, none)
}

func TestListOwnedRefusesAnUnsafeOwner(t *testing.T) {
	p, srv := newTestProvider(t)
	for _, owner := range []provider.Owner{
		{},
		{Installation: `x" OR labels.a = "b`},
		{Installation: "UPPER"},
		{ProxyUID: "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10"},
		{Installation: "prod-eu", ProxyUID: `x") OR (labels.a = "b`},
		{Installation: "prod-eu", ProxyUID: "UPPER"},
	} {
		_, err := p.ListOwned(t.Context(), owner)
		require.Error(t, err, owner)
		assert.Equal(t, provider.KindPermanent, provider.Class(err), owner)
	}
	assert.Zero(t, srv.TotalRequests())
}

func TestListOwnedByProxy(t *testing.T) {
	p, srv := newTestProvider(t)
	const uid = "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10"
	mine := []provider.CreateRequest{gcpRequest("px-a", minimalSpec()), gcpRequest("px-b", minimalSpec())}
	mine[1].Spec.GCP.Zone = "us-central1-a"
	sibling := gcpRequest("px-c", minimalSpec()) // same installation, another Proxy
	sibling.ProxyUID = "ffffffff-0000-0000-0000-000000000000"
	for _, req := range append(mine, sibling) {
		create(t, p, req)
	}
	// The same UID in another installation is not this Proxy's: UIDs are per cluster, and
	// another installation may run against another cluster.
	srv.AddInstance(testProject, "europe-west1-b", &computepb.Instance{
		Name:   proto.String("px-elsewhere"),
		Labels: map[string]string{provider.LabelInstallation: "staging", provider.LabelProxyUID: uid},
	})

	got, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu", ProxyUID: uid})
	require.NoError(t, err)
	var ids []string
	for _, inst := range got {
		ids = append(ids, inst.ProviderID)
		assert.Equal(t, uid, inst.ProxyUID(), inst.Name)
		assert.Equal(t, "prod-eu", inst.Labels[provider.LabelInstallation], inst.Name)
	}
	assert.ElementsMatch(t, []string{
		"projects/proj-a/zones/europe-west1-b/instances/px-a",
		"projects/proj-a/zones/us-central1-a/instances/px-b",
	}, ids)

	all, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	assert.Len(t, all, 3, "without a UID the whole installation is listed")

	none, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu", ProxyUID: "no-such-uid"})
	require.NoError(t, err)
	assert.Empty(t, none)
}

// The sweeper deletes what a list returns, so an answer wider than the filter asked for
// must not get through.
func TestListOwnedChecksLabelsItself(t *testing.T) {
	const uid = "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10"
	srv := gcptest.NewServer(t)
	srv.AddInstance(testProject, "europe-west1-b", &computepb.Instance{
		Name:   proto.String("px-mine"),
		Labels: map[string]string{provider.LabelInstallation: "prod-eu", provider.LabelProxyUID: uid},
	})
	srv.AddInstance(testProject, "europe-west1-b", &computepb.Instance{
		Name:   proto.String("px-sibling"),
		Labels: map[string]string{provider.LabelInstallation: "prod-eu", provider.LabelProxyUID: "other"},
	})
	srv.AddInstance(testProject, "europe-west1-b", &computepb.Instance{
		Name:   proto.String("px-foreign"),
		Labels: map[string]string{provider.LabelInstallation: "staging", provider.LabelProxyUID: uid},
	})
	p := filterIgnoringProvider(t, srv)

	got, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu", ProxyUID: uid})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "px-mine", got[0].Name)

	got, err = p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	var names []string
	for _, inst := range got {
		names = append(names, inst.Name)
	}
	assert.ElementsMatch(t, []string{"px-mine", "px-sibling"}, names)
}

// filterIgnoringProvider is a provider whose every request reaches srv without its
// filter, as from a server that ignores filters: what it lists must be checked by the
// provider itself. It fails the test if the provider lists instances or rules without a filter. The
// transport has no proxy, so nothing leaves the loopback interface.
func filterIgnoringProvider(t *testing.T, srv *gcptest.Server) *Provider {
	t.Helper()
	inner := &http.Transport{}
	t.Cleanup(inner.CloseIdleConnections)
	dropFilter := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if base := path.Base(r.URL.Path); (base == "instances" || base == "firewalls") && r.URL.Query().Get("filter") == "" {
			t.Errorf("the provider sent no filter: %s", r.URL)
		}
		r = r.Clone(r.Context())
		q := r.URL.Query()
		q.Del("filter")
		r.URL.RawQuery = q.Encode()
		return inner.RoundTrip(r)
	})}
	p, err := New(t.Context(), Config{DefaultProject: testProject, ClientOptions: []option.ClientOption{
		option.WithEndpoint(srv.URL), option.WithoutAuthentication(), option.WithHTTPClient(dropFilter),
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestCreateLabelsTheSpecHash(t *testing.T) {
	p, srv := newTestProvider(t)
	withHash := gcpRequest("px-a", minimalSpec())
	withHash.SpecHash = "0123456789abcdef"
	created := create(t, p, withHash)
	create(t, p, gcpRequest("px-b", minimalSpec()))

	assert.Equal(t, "0123456789abcdef", created.Labels[provider.LabelSpecHash])
	got := srv.Instances()
	require.Len(t, got, 2)
	assert.Equal(t, "0123456789abcdef", got[0].Labels[provider.LabelSpecHash])
	assert.NotContains(t, got[1].Labels, provider.LabelSpecHash, "no hash, no label")

	listed, err := p.ListOwned(t.Context(), provider.Owner{Installation: withHash.Installation, ProxyUID: withHash.ProxyUID})
	require.NoError(t, err)
	require.Len(t, listed, 2)
	byName := map[string]provider.Instance{listed[0].Name: listed[0], listed[1].Name: listed[1]}
	assert.Equal(t, "0123456789abcdef", byName["px-a"].Labels[provider.LabelSpecHash], "a run without state reads it back from the list")
}

func TestListOwnedErrorsAreClassified(t *testing.T) {
	p, srv := newTestProvider(t)
	srv.FailNext(gcptest.MethodAggregatedList, http.StatusForbidden, "forbidden", "Required 'compute.instances.list' permission")
	_, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu"})
	require.Error(t, err)
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

func TestCreateErrorsAreClassified(t *testing.T) {
	tests := []struct {
		name    string
		code    int
		reason  string
		message string
		want    provider.Kind
	}{
		{"quota", 403, "quotaExceeded", "Quota 'CPUS' exceeded.  Limit: 8.0 in region europe-west1.", provider.KindQuota},
		{"forbidden", 403, "forbidden", "Required 'compute.instances.create' permission for 'projects/proj-a'", provider.KindPermanent},
		{"rate limit as 403", 403, "rateLimitExceeded", "Rate Limit Exceeded", provider.KindTransient},
		{"bad request", 400, "invalid", "Invalid value for field 'resource.machineType'", provider.KindPermanent},
		{"image not found", 404, "notFound", "The resource 'projects/debian-cloud/global/images/family/debian-99' was not found", provider.KindPermanent},
		{"internal", 500, "backendError", "Internal Error", provider.KindTransient},
		{"unavailable", 503, "backendError", "Service Unavailable", provider.KindTransient},
		{"too many requests", 429, "rateLimitExceeded", "Too Many Requests", provider.KindTransient},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			srv.FailNext(gcptest.MethodInsert, tc.code, tc.reason, tc.message)
			_, err := p.Create(t.Context(), gcpRequest("px-a", minimalSpec()))
			require.Error(t, err)
			assert.Equal(t, tc.want, provider.Class(err), err.Error())
			assert.Equal(t, 1, srv.Requests(gcptest.MethodInsert), "insert is never retried by the client")
			assert.Empty(t, srv.Instances())
		})
	}
}

func TestCreateNeverReturnsTheCloudInit(t *testing.T) {
	p, srv := newTestProvider(t)
	req := gcpRequest("px-a", minimalSpec())
	req.CloudInit = []byte("#!/bin/sh\necho 'proxy_password=hunter2' > /etc/squid/passwd\n")
	srv.FailNext(gcptest.MethodInsert, 400, "invalid", "Invalid value for field 'resource.metadata': "+string(req.CloudInit))

	_, err := p.Create(t.Context(), req)
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "hunter2")
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

func TestCreateRefusesIncompleteSpecsWithoutCallingTheAPI(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*v1alpha1.GCPSpec)
		field string
	}{
		{"zone", func(g *v1alpha1.GCPSpec) { g.Zone = "" }, "zone"},
		{"machine type", func(g *v1alpha1.GCPSpec) { g.MachineType = "" }, "machineType"},
		{"image", func(g *v1alpha1.GCPSpec) { g.Image = "" }, "image"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, srv := newTestProvider(t)
			g := minimalSpec()
			tc.edit(g)
			_, err := p.Create(t.Context(), gcpRequest("px-a", g))
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), tc.field)
			assert.Zero(t, srv.TotalRequests())
		})
	}
}

func TestMalformedProviderIDs(t *testing.T) {
	p, srv := newTestProvider(t)
	for _, id := range []string{
		"",
		"px-a",
		"zones/europe-west1-b/instances/px-a",
		"projects/proj-a/zones//instances/px-a",
		"projects/proj-a/regions/europe-west1/instances/px-a",
		"projects/proj-a/zones/europe-west1-b/instances/px-a/extra",
	} {
		t.Run(id, func(t *testing.T) {
			_, err := p.Get(t.Context(), id)
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.False(t, errors.Is(err, provider.ErrNotFound), "a bad ID is not proof the instance is gone")

			err = p.Delete(t.Context(), id)
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
		})
	}
	assert.Zero(t, srv.TotalRequests())
}

// Get is retried by the client library itself on 503, so a blip never reaches the workflow.
func TestGetRidesOutAnUnavailableAnswer(t *testing.T) {
	p, srv := newTestProvider(t)
	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	srv.FailNext(gcptest.MethodGet, http.StatusServiceUnavailable, "backendError", "Service Unavailable")

	got, err := p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, "px-a", got.Name)
	assert.Equal(t, 2, srv.Requests(gcptest.MethodGet))
}

// The worker builds its client from options alone, not from the fake's HTTP client; this
// runs that path (the library's own transport, no credentials) end to end.
func TestClientFromEndpointOptionsOnly(t *testing.T) {
	// Keeps the library from looking for a client certificate in the user's gcloud config.
	t.Setenv("GOOGLE_API_USE_CLIENT_CERTIFICATE", "false")
	srv := gcptest.NewServer(t)
	p, err := New(t.Context(), Config{DefaultProject: testProject, ClientOptions: []option.ClientOption{
		option.WithEndpoint(srv.URL), option.WithoutAuthentication(),
	}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })

	inst := create(t, p, gcpRequest("px-a", minimalSpec()))
	got, err := p.Get(t.Context(), inst.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, provider.StateProvisioning, got.State)
}

// The filter is GCE's syntax: a bare expression alone, parenthesised ones side by side
// (which GCE ANDs) for two.
func TestOwnerFilter(t *testing.T) {
	f, err := ownerFilter(provider.Owner{Installation: "prod-eu"})
	require.NoError(t, err)
	assert.Equal(t, `labels.proxyfleet-installation = "prod-eu"`, f)

	f, err = ownerFilter(provider.Owner{Installation: "prod-eu", ProxyUID: "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10"})
	require.NoError(t, err)
	assert.Equal(t, `(labels.proxyfleet-installation = "prod-eu") (labels.proxyfleet-uid = "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10")`, f)
}

// TestListOwnedInAnotherProject: a Proxy may put its VM in another project
// (spec.gcp.project); a run that lost its state must look there, not in the default one.
func TestListOwnedInAnotherProject(t *testing.T) {
	p, _ := newTestProvider(t)
	const uid = "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10"
	req := gcpRequest("px-far", minimalSpec())
	req.ProxyUID = uid
	req.Spec.GCP.Project = "proj-b"
	create(t, p, req)

	inDefault, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu", ProxyUID: uid})
	require.NoError(t, err)
	assert.Empty(t, inDefault)
	got, err := p.ListOwned(t.Context(), provider.Owner{Installation: "prod-eu", ProxyUID: uid, Project: "proj-b"})
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "projects/proj-b/zones/europe-west1-b/instances/px-far", got[0].ProviderID)
}

// secretsOf are what must never reach an error or a log for req: the password, its hash
// (the passwd line squid renders), and the startup script's lines, which carry both the
// hash and the cloud-init data.
func secretsOf(t *testing.T, req provider.CreateRequest) (script string, secrets []string) {
	t.Helper()
	ins, err := buildInsert(req, testProject)
	require.NoError(t, err)
	files, err := squid.Render(squid.Config{Port: req.Port, Credentials: req.Credentials})
	require.NoError(t, err)
	hash := strings.TrimSpace(strings.SplitN(string(files.Passwd), ":", 2)[1])
	script = string(startupScriptOf(ins))
	secrets = []string{req.Credentials.Password, hash, base64.StdEncoding.EncodeToString(files.Passwd)}
	return script, secrets
}

// GCE's messages sometimes quote the value they refuse; for the startup script that is
// the password's hash and the cloud-init data. However the quote is cut, it is withheld.
func TestCreateNeverReturnsTheStartupScript(t *testing.T) {
	req := gcpRequest("px-a", minimalSpec())
	req.CloudInit = []byte("#!/bin/sh\necho 'cloud_init_canary=5e1f' > /etc/squid/extra\n")
	script, secrets := secretsOf(t, req)
	secrets = append(secrets, "cloud_init_canary")
	passwdLine := secrets[2]
	quotes := map[string]string{
		"whole":           script,
		"as JSON":         strings.Trim(fmt.Sprintf("%q", script), `"`),
		"its last part":   script[len(script)/2:],
		"the passwd file": passwdLine,
	}
	for name, quote := range quotes {
		t.Run(name, func(t *testing.T) {
			for _, how := range []string{"direct", "operation"} {
				p, srv := newTestProvider(t)
				msg := "Invalid value for field 'resource.metadata.items[0].value': '" + quote + "'"
				if how == "direct" {
					srv.FailNext(gcptest.MethodInsert, http.StatusBadRequest, "invalid", msg)
				} else {
					srv.FailNextOperation(gcptest.MethodInsert, http.StatusBadRequest, "INVALID_FIELD_VALUE", msg)
				}
				_, err := p.Create(t.Context(), req)
				require.Error(t, err, how)
				assert.Equal(t, provider.KindPermanent, provider.Class(err), how)
				for _, secret := range secrets {
					assert.NotContains(t, err.Error(), secret, how)
				}
				assert.Contains(t, err.Error(), "withheld", how)
			}
		})
	}
}

// The client library logs request and response bodies at debug level to the logger it is
// given. New replaces any logger among the options, so a worker run with debug logging
// never prints the startup script.
func TestClientLogsNothing(t *testing.T) {
	var buf testenv.LogBuffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := gcptest.NewServer(t)
	opts := append(srv.ClientOptions(), option.WithLogger(logger))
	req := gcpRequest("px-a", minimalSpec())
	req.CloudInit = []byte("#!/bin/sh\necho 'cloud_init_canary=5e1f'\n")
	script, secrets := secretsOf(t, req)
	secrets = append(secrets, "cloud_init_canary")

	// The control: the library's own client with that logger prints the body it sends.
	raw, err := compute.NewInstancesRESTClient(t.Context(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	ins, err := buildInsert(gcpRequest("px-control", minimalSpec()), testProject)
	require.NoError(t, err)
	_, err = raw.Insert(t.Context(), ins)
	require.NoError(t, err)
	require.Contains(t, buf.String(), "api request", "the logger would have caught a body")
	buf.Reset()

	p, err := New(t.Context(), Config{DefaultProject: testProject, ClientOptions: opts})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	p.pollFirst, p.pollMax = time.Millisecond, 5*time.Millisecond
	srv.FailNext(gcptest.MethodInsert, http.StatusBadRequest, "invalid", "Invalid value for field 'resource.metadata': '"+script+"'")
	_, err = p.Create(t.Context(), req)
	require.Error(t, err)
	create(t, p, req)
	require.NoError(t, p.Delete(t.Context(), p.ProviderID(req)))

	logged := buf.String()
	for _, secret := range secrets {
		assert.NotContains(t, logged, secret)
	}
	assert.Empty(t, logged)
}
