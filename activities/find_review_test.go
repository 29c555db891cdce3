package activities_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// TestReviewARestartedRunFindsTheInstanceInTheOldProject: a run that starts without state
// but with a spec (the workflow was terminated, or a server limit ended it, and the
// operator's next spec signal started it again) lists only the spec's project and every
// provider's default. Its Proxy was moved from old-project to spec-project meanwhile (the
// edit came with the restart, or the old run ended mid-replacement). The instance the
// Proxy last published, in old-project, is not found: it is neither adopted nor retired,
// and, since the sweep lists the default project only, it runs (and bills) forever. The
// cleanup run reads the published instance's project for exactly this reason; an
// adopting run needs it just as much (issue 29: "finds ... every project and provider it
// used").
func TestReviewARestartedRunFindsTheInstanceInTheOldProject(t *testing.T) {
	f := newFixture(t)
	p := f.movedProxy(t, "moved", "px-m-1")
	gcp := &projectLister{byProject: map[string][]provider.Instance{"old-project": {owned("px-m-1", string(p.UID), "test", 0)}}}
	f.acts.Providers = provider.Registry{v1alpha1.ProviderGCP: gcp}
	names := f.found(t, activities.FindInput{ProxyUID: string(p.UID), Namespace: f.ns, Name: p.Name,
		Provider: v1alpha1.ProviderGCP, Project: "spec-project"})
	assert.Contains(t, names, "px-m-1", "the instance the Proxy last published was not looked for; asked: %q", gcp.asked)
}
