package activities

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// WorkflowLister is the part of the Temporal client the sweeper uses.
type WorkflowLister interface {
	ListWorkflow(ctx context.Context, req *workflowservice.ListWorkflowExecutionsRequest) (*workflowservice.ListWorkflowExecutionsResponse, error)
}

// LiveInput says where to look for live Proxies.
type LiveInput struct {
	// Namespaces limits the Proxy list; empty lists every namespace.
	Namespaces []string `json:"namespaces,omitempty"`
	// WorkflowQuery selects running ProxyWorkflows; MemoKey is where their memo keeps the UID.
	WorkflowQuery string `json:"workflowQuery"`
	MemoKey       string `json:"memoKey"`
}

// LiveUIDs are the Proxy UIDs that must keep their instances.
type LiveUIDs struct {
	// Proxies are the UIDs of Proxy objects, including those being deleted: their
	// finalizer owns that deletion, and a sweep racing it would delete twice.
	Proxies []string `json:"proxies"`
	// Workflows are the UIDs of running ProxyWorkflows: a workflow deleting the instance of
	// an object that is already gone still owns it.
	Workflows []string `json:"workflows"`
}

// ListLiveUIDs lists both sources of liveness. A failed list fails the whole call: a partial
// live set would make live instances look orphaned. A running workflow without a readable
// memo (one that has not published yet) adds no UID; its Proxy object, which the finalizer
// keeps until the workflow has deleted every instance, does.
func (a *Activities) ListLiveUIDs(ctx context.Context, in LiveInput) (LiveUIDs, error) {
	var live LiveUIDs
	namespaces := in.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{""}
	}
	for _, ns := range namespaces {
		var list v1alpha1.ProxyList
		var opts []client.ListOption
		if ns != "" {
			opts = append(opts, client.InNamespace(ns))
		}
		if err := a.Kube.List(ctx, &list, opts...); err != nil {
			return LiveUIDs{}, fmt.Errorf("list proxies: %w", err)
		}
		for _, p := range list.Items {
			live.Proxies = append(live.Proxies, string(p.UID))
		}
	}
	if a.Temporal == nil {
		return LiveUIDs{}, errors.New("no Temporal client configured to list running workflows")
	}
	var token []byte
	for {
		resp, err := a.Temporal.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Query: in.WorkflowQuery, NextPageToken: token, PageSize: 1000,
		})
		if err != nil {
			return LiveUIDs{}, fmt.Errorf("list running workflows: %w", err)
		}
		for _, ex := range resp.Executions {
			payload := ex.GetMemo().GetFields()[in.MemoKey]
			if payload == nil {
				continue
			}
			// Only the UID is decoded: a liveness proof must not fail on a field it does not
			// need (the memo is contract.ProxyMemo).
			var m struct {
				UID string `json:"uid"`
			}
			if err := converter.GetDefaultDataConverter().FromPayload(payload, &m); err == nil && m.UID != "" {
				live.Workflows = append(live.Workflows, m.UID)
			}
		}
		if token = resp.NextPageToken; len(token) == 0 {
			return live, nil
		}
	}
}

// ListInput names a provider and an installation, and optionally one Proxy in it.
type ListInput struct {
	Provider     v1alpha1.Provider `json:"provider"`
	Installation string            `json:"installation"`
	// ProxyUID narrows the list to one Proxy's instances: a workflow run that starts with
	// no state finds what its Proxy already has this way. Empty lists the whole
	// installation, as the sweeper does.
	ProxyUID string `json:"proxyUID,omitempty"`
}

// ListInstances lists a provider's instances labelled with the installation, and with the
// Proxy's UID when in.ProxyUID is set.
func (a *Activities) ListInstances(ctx context.Context, in ListInput) ([]provider.Instance, error) {
	p, err := a.Providers.Get(in.Provider)
	if err != nil {
		return nil, classify("list", err)
	}
	list, err := p.ListOwned(ctx, provider.Owner{Installation: in.Installation, ProxyUID: in.ProxyUID})
	if err != nil {
		return nil, classify("list "+string(in.Provider), err)
	}
	return list, nil
}

// OrphanInput is an instance the sweeper decided to delete.
type OrphanInput struct {
	Provider   v1alpha1.Provider `json:"provider"`
	ProviderID string            `json:"providerID"`
	Name       string            `json:"name"`
	UID        string            `json:"uid"`
}

// DeleteOrphan deletes one orphaned instance, loudly: every kill is logged with what it
// was and whose.
func (a *Activities) DeleteOrphan(ctx context.Context, in OrphanInput) error {
	return a.deleteOrphan(ctx, in)
}

func (a *Activities) deleteOrphan(ctx context.Context, in OrphanInput) error {
	p, err := a.Providers.Get(in.Provider)
	if err != nil {
		return classify("delete orphan", err)
	}
	a.log().WarnContext(ctx, "WARNING: deleting orphaned instance", "provider", in.Provider,
		"providerID", in.ProviderID, "instance", in.Name, "uid", in.UID)
	if err := p.Delete(ctx, in.ProviderID); err != nil && !errors.Is(err, provider.ErrNotFound) {
		if errors.Is(err, provider.ErrInUse) {
			return err // kept, not failed: the sweep counts it so
		}
		return classify("delete orphan "+in.ProviderID, err)
	}
	if a.Metrics != nil {
		a.Metrics.gcDeleted.WithLabelValues(string(in.Provider)).Inc()
	}
	return nil
}

// GCSummary is what a sweep adds to the worker's metrics.
type GCSummary struct {
	Outcome string         `json:"outcome"`
	Spared  map[string]int `json:"spared,omitempty"`
}

// RecordGC counts a finished sweep (run as a local activity, so once per sweep).
func (a *Activities) RecordGC(_ context.Context, in GCSummary) error {
	if a.Metrics == nil {
		return nil
	}
	a.Metrics.gcRuns.WithLabelValues(in.Outcome).Inc()
	for reason, n := range in.Spared {
		a.Metrics.gcSpared.WithLabelValues(reason).Add(float64(n))
	}
	return nil
}
