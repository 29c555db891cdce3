package activities

import (
	"context"
	"errors"
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
}

// FindResult is what a run that starts without state learns from the providers and from
// the Proxy's last published status.
type FindResult struct {
	Instances []OwnedInstance `json:"instances,omitempty"`
	// Replacements is status.replacements as earlier runs published it, so the count goes
	// on instead of starting over.
	Replacements int32 `json:"replacements,omitempty"`
}

// FindInstances lists, at every provider this worker has, the instances labelled with this
// installation and the Proxy's UID. A workflow run that starts without state (after a
// terminate, a server limit or a reset) calls it before anything else: the instances
// earlier runs created are then adopted or deleted instead of leaking. Every provider must
// answer: a partial list could leave an instance no one deletes, so a failure is retried.
func (a *Activities) FindInstances(ctx context.Context, in FindInput) (FindResult, error) {
	if in.ProxyUID == "" {
		// An empty UID would select the whole installation: never hand that to adoption.
		return FindResult{}, classify("find instances", provider.Permanent(errors.New("no Proxy UID given")))
	}
	var out FindResult
	for _, name := range slices.Sorted(maps.Keys(a.Providers)) {
		list, err := a.Providers[name].ListOwned(ctx, provider.Owner{Installation: a.Installation, ProxyUID: in.ProxyUID})
		if err != nil {
			return FindResult{}, classify("find instances at "+string(name), err)
		}
		for _, inst := range list {
			out.Instances = append(out.Instances, OwnedInstance{Provider: name, Instance: inst})
		}
	}
	if a.Kube != nil && in.Name != "" {
		p, err := a.ownProxy(ctx, ObjectRef{Namespace: in.Namespace, Name: in.Name, UID: in.ProxyUID})
		if err != nil {
			return FindResult{}, err
		}
		if p != nil {
			out.Replacements = p.Status.Replacements
		}
	}
	return out, nil
}
