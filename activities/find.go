package activities

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

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
	// Published is status.instanceName, the instance earlier runs last published, found
	// or not: new instance names start past it.
	Published string `json:"published,omitempty"`
}

// FindInstances lists the instances labelled with this installation and the Proxy's UID. A
// workflow run that starts without state (after a terminate, a server limit or a reset)
// calls it before anything else: the instances earlier runs created are then adopted or
// deleted instead of leaking.
//
// The spec's provider must answer (a failure, or a worker without it, is retried: adopting
// from a partial answer could reuse or leak an instance). The worker's other providers are
// asked too, in case the spec changed provider, but one that fails is skipped and logged:
// a cloud outage elsewhere must not stop this Proxy.
//
// A run started for the delete alone (a cleanup run: no spec, in.Provider empty) must find
// everything, because what it does not find leaks once it releases the finalizer. It reads
// the Proxy object, which the finalizer keeps, for where its instances are: the spec's
// provider and project and the project of the last instance it published. And every
// provider must answer: a failure fails the call, which the workflow retries with backoff,
// so an outage is waited out rather than skipped. For other runs the status read is
// best-effort.
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
	cleanup := in.Provider == ""
	var out FindResult
	// projects are the projects to list per provider besides its default ("").
	projects := map[v1alpha1.Provider][]string{}
	addProject := func(prov v1alpha1.Provider, project string) {
		if project != "" && !slices.Contains(projects[prov], project) {
			projects[prov] = append(projects[prov], project)
		}
	}
	addProject(in.Provider, in.Project)
	// published is the provider of the instance the Proxy last published, when known.
	var published v1alpha1.Provider
	if a.Kube != nil && in.Name != "" {
		p, err := a.ownProxy(ctx, ObjectRef{Namespace: in.Namespace, Name: in.Name, UID: in.ProxyUID})
		switch {
		case err != nil && cleanup:
			return FindResult{}, fmt.Errorf("find instances: read the Proxy for where its instances are: %w", err)
		case err != nil:
			a.log().WarnContext(ctx, "reading the Proxy's published replacement count failed; counting from the instances", "error", err)
		case p != nil:
			out.Replacements, out.Published = p.Status.Replacements, p.Status.InstanceName
			if cleanup && p.Spec.EffectiveMode() == v1alpha1.ModeManaged && p.Spec.GCP != nil {
				addProject(v1alpha1.ProviderGCP, p.Spec.GCP.Project)
			}
			// The instance the Proxy last published may be in a project its spec no
			// longer names (it was edited while no run held the state): a run that adopts
			// needs it as much as a cleanup run. The sweep lists only default projects,
			// so a failed list there must not be skipped either.
			if project := gcpProject(p.Status.ProviderID); project != "" {
				addProject(v1alpha1.ProviderGCP, project)
				published = v1alpha1.ProviderGCP
			}
			// The same for aws, whose "project" is a region. Its provider IDs
			// (<region>/<name>) look like a kubernetes provider's (<namespace>/<name>),
			// so one is read as aws only for a Proxy whose spec is aws.
			if p.Spec.AWS != nil {
				if cleanup {
					addProject(v1alpha1.ProviderAWS, p.Spec.AWS.Region)
				}
				if region := awsRegion(p.Status.ProviderID); region != "" {
					addProject(v1alpha1.ProviderAWS, region)
					published = v1alpha1.ProviderAWS
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(a.Providers)) {
		mustAnswer := cleanup || name == in.Provider || name == published
		for _, project := range append([]string{""}, projects[name]...) {
			owner := provider.Owner{Installation: a.Installation, ProxyUID: in.ProxyUID, Project: project}
			cctx, cancel := a.callContext(ctx)
			list, err := a.Providers[name].ListOwned(cctx, owner)
			cancel()
			if err != nil {
				if mustAnswer {
					return FindResult{}, fmt.Errorf("find instances at %s%s: %w", name, inProject(project), err)
				}
				a.log().WarnContext(ctx, "finding a Proxy's instances at another provider failed; skipped", "provider", name, "error", err)
				break
			}
			for _, inst := range list {
				if !slices.ContainsFunc(out.Instances, func(o OwnedInstance) bool {
					return o.Provider == name && o.Instance.ProviderID == inst.ProviderID
				}) {
					out.Instances = append(out.Instances, OwnedInstance{Provider: name, Instance: inst})
				}
			}
		}
	}
	return out, nil
}

func inProject(project string) string {
	if project == "" {
		return ""
	}
	return " in project " + project
}

// awsRegion is the region of an aws provider ID (<region>/<instance name>, or the form
// Create reports, <region>/<name>/<EC2 ID>/<launch time>), or "".
func awsRegion(providerID string) string {
	parts := strings.Split(providerID, "/")
	if (len(parts) != 2 && len(parts) != 4) || parts[1] == "" || !awsRegionPattern.MatchString(parts[0]) {
		return ""
	}
	return parts[0]
}

// awsRegionPattern is spec.aws.region's.
var awsRegionPattern = regexp.MustCompile(`^[a-z]{2,4}(-[a-z]+)+-[0-9]{1,2}$`)

// gcpProject is the project of a gcp provider ID (projects/<p>/zones/<z>/instances/<n>),
// or "" for any other.
func gcpProject(providerID string) string {
	rest, ok := strings.CutPrefix(providerID, "projects/")
	if !ok {
		return ""
	}
	project, _, ok := strings.Cut(rest, "/")
	if !ok || !strings.Contains(rest, "/instances/") {
		return ""
	}
	return project
}
