package activities

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// OwnedInstance is one instance of a Proxy as its provider reports it.
type OwnedInstance struct {
	Provider v1alpha1.Provider `json:"provider"`
	Instance provider.Instance `json:"instance"`
}

// FindInput names the Proxy whose instances to find.
type FindInput struct {
	ProxyUID  string `json:"proxyUID"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Provider and Project are the spec's, when the run has one: that provider must answer,
	// in that project. Empty (a run started for the delete alone) asks every provider.
	Provider v1alpha1.Provider `json:"provider,omitempty"`
	Project  string            `json:"project,omitempty"`
}

// FindResult is what a run that starts without state learns from the providers and from
// the Proxy's last published status.
type FindResult struct {
	Instances []OwnedInstance `json:"instances,omitempty"`
	// Replacements is status.replacements as earlier runs published it, so the count goes
	// on instead of starting over.
	Replacements int32 `json:"replacements,omitempty"`
}

// FindInstances lists the instances labelled with this installation and the Proxy's UID. A
// workflow run that starts without state (after a terminate, a server limit or a reset)
// calls it before anything else: the instances earlier runs created are then adopted or
// deleted instead of leaking.
//
// The spec's provider must answer (a failure, or a worker without it, is retried: adopting
// from a partial answer could reuse or leak an instance). The worker's other providers are
// asked too, in case the spec changed provider, but one that fails is skipped and logged:
// a cloud outage elsewhere must not stop this Proxy. The status read is best-effort too.
func (a *Activities) FindInstances(ctx context.Context, in FindInput) (FindResult, error) {
	if in.ProxyUID == "" {
		// An empty UID would select the whole installation: never hand that to adoption.
		return FindResult{}, classify("find instances", provider.Permanent(errors.New("no Proxy UID given")))
	}
	if in.Provider != "" {
		if _, err := a.Providers.Get(in.Provider); err != nil {
			return FindResult{}, fmt.Errorf("find instances: %w", err)
		}
	}
	var out FindResult
	for _, name := range slices.Sorted(maps.Keys(a.Providers)) {
		owner := provider.Owner{Installation: a.Installation, ProxyUID: in.ProxyUID}
		if name == in.Provider {
			owner.Project = in.Project
		}
		cctx, cancel := a.callContext(ctx)
		list, err := a.Providers[name].ListOwned(cctx, owner)
		cancel()
		if err != nil {
			if name == in.Provider {
				return FindResult{}, fmt.Errorf("find instances at %s: %w", name, err)
			}
			a.log().WarnContext(ctx, "finding a Proxy's instances at another provider failed; skipped", "provider", name, "error", err)
			continue
		}
		for _, inst := range list {
			out.Instances = append(out.Instances, OwnedInstance{Provider: name, Instance: inst})
		}
	}
	if a.Kube != nil && in.Name != "" {
		p, err := a.ownProxy(ctx, ObjectRef{Namespace: in.Namespace, Name: in.Name, UID: in.ProxyUID})
		switch {
		case err != nil:
			a.log().WarnContext(ctx, "reading the Proxy's published replacement count failed; counting from the instances", "error", err)
		case p != nil:
			out.Replacements = p.Status.Replacements
		}
	}
	return out, nil
}
