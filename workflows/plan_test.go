package workflows

import (
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func TestPlan(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	managed := &v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}
	external := &v1alpha1.ProxySpec{Mode: v1alpha1.ModeExternal, Endpoint: &v1alpha1.Endpoint{Host: "h", Port: 1}}
	desired := DesiredHash(managed, "")
	running := func(name, hash string) *InstanceRef {
		return &InstanceRef{Name: name, Hash: hash, Created: true, State: provider.StateRunning, IP: "127.0.0.1"}
	}
	healthy := &activities.Health{Known: true, Healthy: true}

	cases := []struct {
		name  string
		state ProxyState
		want  step
	}{
		{"no spec yet", ProxyState{}, stepIdle},
		{"deleting with instances deletes first", ProxyState{Spec: managed, Deleting: true, Retiring: []InstanceRef{{Name: "a"}}}, stepDelete},
		{"deleting and nothing left finishes", ProxyState{Spec: managed, Deleting: true}, stepFinish},
		{"retiring waits out a failed delete", ProxyState{Spec: managed, Retiring: []InstanceRef{{Name: "a"}}, DeleteRetryAt: now.Add(time.Minute)}, stepSteady},
		{"retiring is deleted before anything else", ProxyState{Spec: managed, Retiring: []InstanceRef{{Name: "a"}}}, stepDelete},
		{"external only monitors", ProxyState{Spec: external}, stepSteady},
		{"permanent failure latches for its generation", ProxyState{Spec: managed, Generation: 3, Failure: &Failure{Generation: 3}}, stepIdle},
		{"a newer generation clears the latch", ProxyState{Spec: managed, Generation: 4, Failure: &Failure{Generation: 3}}, stepCreate},
		{"backoff waits", ProxyState{Spec: managed, RetryAt: now.Add(time.Minute)}, stepSteady},
		{"secret hash first", ProxyState{Spec: managed, NeedHash: true}, stepHash},
		{"no instance creates", ProxyState{Spec: managed}, stepCreate},
		{"unfinished create is retried under the same name", ProxyState{Spec: managed, Instance: &InstanceRef{Name: "a", Hash: desired}}, stepCreate},
		{"created but not running waits", ProxyState{Spec: managed, Instance: &InstanceRef{Name: "a", Hash: desired, Created: true}}, stepWaitRunning},
		{"stale instance not yet serving is dropped", ProxyState{Spec: managed, Instance: &InstanceRef{Name: "a", Hash: "old", Created: true}}, stepRetireCurrent},
		{"running and current is steady", ProxyState{Spec: managed, Instance: running("a", desired)}, stepSteady},
		{"spec changed builds the replacement", ProxyState{Spec: managed, Instance: running("a", "old")}, stepCreateNext},
		{"replace signal builds the replacement", ProxyState{Spec: managed, Instance: running("a", desired), ReplaceReason: "manual"}, stepCreateNext},
		{"replacement waits to run", ProxyState{Spec: managed, Instance: running("a", "old"), Next: &InstanceRef{Name: "b", Hash: desired, Created: true}}, stepWaitNext},
		{"replacement is verified before traffic moves", ProxyState{Spec: managed, Instance: running("a", "old"), Next: running("b", desired)}, stepVerifyNext},
		{"verified replacement is promoted", ProxyState{Spec: managed, Instance: running("a", "old"), Next: func() *InstanceRef { r := running("b", desired); r.Health = healthy; return r }()}, stepPromote},
		{"replacement of an outdated spec is dropped", ProxyState{Spec: managed, Instance: running("a", "old"), Next: running("b", "older")}, stepRetireNext},
		{"replacement no longer needed is dropped", ProxyState{Spec: managed, Instance: running("a", desired), Next: running("b", desired)}, stepRetireNext},
		{"replacement under quota keeps monitoring the current one", ProxyState{Spec: managed, Instance: running("a", "old"), RetryAt: now.Add(time.Minute)}, stepSteady},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.state
			assert.Equal(t, tc.want.String(), plan(&s, now).String())
		})
	}
}

func TestInstanceNameIsValidForGCPAndPods(t *testing.T) {
	gcpName := regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)
	seen := map[string]bool{}
	for _, uid := range []string{"8f14e45f-ceea-467f-a0e6-1d5b7e1e4b2a", "0", "x"} {
		for _, n := range []int{1, 2, 999999} {
			name := InstanceName(uid, n)
			assert.Regexp(t, gcpName, name)
			assert.LessOrEqual(t, len(name), 63)
			assert.False(t, seen[name], "duplicate name %s", name)
			seen[name] = true
		}
	}
	assert.Equal(t, InstanceName("u", 1), InstanceName("u", 1), "names are deterministic")
}

func TestDesiredHashIgnoresFieldsThatNeedNoNewInstance(t *testing.T) {
	base := v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{}}
	h := DesiredHash(&base, "s1")
	edited := base
	edited.Attributes = map[string]v1alpha1.AttributeValue{"region": "eu"}
	edited.MaxLeases = 7
	edited.HealthCheck.URL = "http://other/"
	assert.Equal(t, h, DesiredHash(&edited, "s1"))
	assert.NotEqual(t, h, DesiredHash(&base, "s2"), "secret rotation changes the hash")
	edited.Port = 8080
	assert.NotEqual(t, h, DesiredHash(&edited, "s1"), "port changes the hash")
}

// TestDesiredHashKeepsOlderSpecs: fields added since a spec was stored do not change its
// hash while they hold their defaults, so upgrading replaces no instance. A GCP Proxy
// stored before externalIP existed reads back with the schema's default (true); egress and
// allowedClients are unset.
func TestDesiredHashKeepsOlderSpecs(t *testing.T) {
	stored := v1alpha1.ProxySpec{Mode: v1alpha1.ModeManaged, Provider: v1alpha1.ProviderGCP,
		GCP: &v1alpha1.GCPSpec{Zone: "europe-west1-b", MachineType: "e2-micro", Image: "img"}}
	// What DesiredHash gave for this spec before these fields existed (computed at commit
	// 22f94cd): instances built then must not look stale now.
	const before = "e37f68d09accf2aa"
	h := DesiredHash(&stored, "")
	assert.Equal(t, before, h)
	readBack := stored
	readBack.GCP = stored.GCP.DeepCopy()
	on := true
	readBack.GCP.ExternalIP = &on
	assert.Equal(t, h, DesiredHash(&readBack, ""), "the schema's default is no change")
	off := false
	readBack.GCP.ExternalIP = &off
	assert.NotEqual(t, h, DesiredHash(&readBack, ""), "turning the external IP off is one")
	readBack.GCP.ExternalIP = &on
	readBack.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24"}
	assert.NotEqual(t, h, DesiredHash(&readBack, ""), "new source ranges are one")
}
