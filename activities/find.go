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
	ProxyUID string `json:"proxyUID"`
}

// FindInstances lists, at every provider this worker has, the instances labelled with this
// installation and the Proxy's UID. A workflow run that starts without state (after a
// terminate, a server limit or a reset) calls it before anything else: the instances
// earlier runs created are then adopted or deleted instead of leaking. Every provider must
// answer: a partial list could leave an instance no one deletes, so a failure is retried.
func (a *Activities) FindInstances(ctx context.Context, in FindInput) ([]OwnedInstance, error) {
	if in.ProxyUID == "" {
		// An empty UID would select the whole installation: never hand that to adoption.
		return nil, classify("find instances", provider.Permanent(errors.New("no Proxy UID given")))
	}
	var out []OwnedInstance
	for _, name := range slices.Sorted(maps.Keys(a.Providers)) {
		list, err := a.Providers[name].ListOwned(ctx, provider.Owner{Installation: a.Installation, ProxyUID: in.ProxyUID})
		if err != nil {
			return nil, classify("find instances at "+string(name), err)
		}
		for _, inst := range list {
			out = append(out, OwnedInstance{Provider: name, Instance: inst})
		}
	}
	return out, nil
}
