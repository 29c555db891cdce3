// Package providertest is the contract every provider passes: what the workflow and the
// sweeper count on whichever cloud runs the instance. Each provider's tests run it against
// that provider's stand-in (a fake cloud API speaking the real SDK's protocol, the local
// daemon), with a Harness saying how to make an instance there progress as time would.
//
// The contract, in the order the workflow leans on it:
//   - ProviderID is known before Create, and names the instance Create makes: Get and
//     Delete accept it as they accept the provider ID Create reports (which may say more,
//     such as the cloud's own ID).
//   - Create is exactly once: called again with the same name (a retried activity, a
//     replayed workflow) it returns the same instance and makes no second one.
//   - Get follows the instance to Running with an address and the ownership labels; an
//     instance that never existed is ErrNotFound.
//   - ListOwned returns an owner's instances and nothing else: not another Proxy's, not
//     another installation's, and it refuses an owner with no installation.
//   - Delete is idempotent, and a deleted instance is gone from Get and ListOwned.
//   - An instance is never made without credentials to require of its clients.
package providertest

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Harness is one provider under the contract.
type Harness struct {
	// New returns the provider, on a stand-in of its own for this (sub)test.
	New func(t *testing.T) provider.Provider
	// Spec is a valid spec of the provider's (its block set, defaults applied).
	Spec v1alpha1.ProxySpec
	// Advance moves the named instance on as time would (a fake VM booting); nil when
	// the stand-in does so by itself.
	Advance func(t *testing.T, name string)
	// Instances is how many instances the stand-in holds that are not deleted (or being
	// deleted): the count a second create must not raise.
	Instances func(t *testing.T) int
	// Shape, when set, adapts each create request to the stand-in (the namespace a pod
	// goes in).
	Shape func(*provider.CreateRequest)
}

// Request is a create request as the worker makes one: the instance's credentials derived
// for it, the ownership and spec-hash labels.
func Request(h Harness, name, uid, installation string) provider.CreateRequest {
	r := provider.CreateRequest{
		Name: name, ProxyUID: uid, Installation: installation, Namespace: "crawl",
		Port: h.Spec.EffectivePort(), Spec: h.Spec,
		Credentials: proxyauth.Credentials{Username: "proxyfleet", Password: "contract-" + name + "-pw"},
		KeyID:       "k1", SpecHash: "0123456789abcdef",
	}
	if h.Shape != nil {
		h.Shape(&r)
	}
	return r
}

// installation is a name of the test's own, so stand-ins shared between tests (one API
// server) hold nothing else of it.
func installation(name string) string {
	return name + "-" + strings.ToLower(rand.Text()[:8])
}

// within is how long an instance may take to get where the contract says it goes, with
// Advance called at every look.
const within = 20 * time.Second

// Run runs the contract.
func Run(t *testing.T, h Harness) {
	t.Run("ExactlyOnce", func(t *testing.T) { exactlyOnce(t, h) })
	t.Run("GetFollowsTheInstance", func(t *testing.T) { getFollows(t, h) })
	t.Run("ListOwnedIsTheOwners", func(t *testing.T) { listOwned(t, h) })
	t.Run("DeleteIsIdempotent", func(t *testing.T) { deleteIdempotent(t, h) })
	t.Run("NoInstanceWithoutCredentials", func(t *testing.T) { noCredentials(t, h) })
}

func exactlyOnce(t *testing.T, h Harness) {
	p, ctx := h.New(t), t.Context()
	req := Request(h, "px-contract-1", "uid-contract-1", installation("inst"))
	id := p.ProviderID(req)
	require.NotEmpty(t, id, "the provider ID is known before Create")
	first, err := p.Create(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, req.Name, first.Name)
	for range 3 {
		again, err := p.Create(ctx, req)
		require.NoError(t, err, "a create called again is the same create")
		assert.Equal(t, first.ProviderID, again.ProviderID)
	}
	assert.Equal(t, 1, h.Instances(t), "one instance, however often it was asked for")
}

// running waits until Get says the instance runs, and returns it.
func running(t *testing.T, h Harness, p provider.Provider, name, id string) provider.Instance {
	t.Helper()
	var got provider.Instance
	require.Eventually(t, func() bool {
		if h.Advance != nil {
			h.Advance(t, name)
		}
		var err error
		got, err = p.Get(t.Context(), id)
		require.NoError(t, err)
		return got.State == provider.StateRunning
	}, within, 20*time.Millisecond, "the instance never ran")
	return got
}

func getFollows(t *testing.T, h Harness) {
	p, ctx := h.New(t), t.Context()
	req := Request(h, "px-contract-2", "uid-contract-2", installation("inst"))
	created, err := p.Create(ctx, req)
	require.NoError(t, err)
	got := running(t, h, p, req.Name, created.ProviderID)
	assert.Equal(t, req.Name, got.Name)
	early, err := p.Get(ctx, p.ProviderID(req))
	require.NoError(t, err, "the provider ID known before the create names the instance too")
	assert.Equal(t, req.Name, early.Name)
	assert.NotEmpty(t, got.IP, "a running instance has the address crawlers connect to")
	assert.False(t, got.CreatedAt.IsZero(), "the sweep's minimum age needs the creation time")
	for k, v := range req.Labels() {
		assert.Equal(t, v, got.Labels[k], "ownership label %s", k)
	}

	missing := Request(h, "px-contract-never", "uid-never", req.Installation)
	_, err = p.Get(ctx, p.ProviderID(missing))
	assert.ErrorIs(t, err, provider.ErrNotFound)
}

func listOwned(t *testing.T, h Harness) {
	p, ctx := h.New(t), t.Context()
	mine, other, none := installation("inst"), installation("other"), installation("none")
	for _, r := range []provider.CreateRequest{
		Request(h, "px-contract-a1", "uid-a", mine),
		Request(h, "px-contract-a2", "uid-a", mine),
		Request(h, "px-contract-b1", "uid-b", mine),
		Request(h, "px-contract-c1", "uid-a", other),
	} {
		_, err := p.Create(ctx, r)
		require.NoError(t, err)
	}
	names := func(owner provider.Owner) []string {
		t.Helper()
		list, err := p.ListOwned(ctx, owner)
		require.NoError(t, err)
		var out []string
		for _, in := range list {
			// The instances; a provider may report other things it owns for the sweep
			// (aws and gcp: shared security groups and firewall rules no instance uses).
			if strings.HasPrefix(in.Name, "px-contract-") {
				out = append(out, in.Name)
			}
		}
		return out
	}
	assert.ElementsMatch(t, []string{"px-contract-a1", "px-contract-a2"}, names(provider.Owner{Installation: mine, ProxyUID: "uid-a"}))
	assert.ElementsMatch(t, []string{"px-contract-a1", "px-contract-a2", "px-contract-b1"}, names(provider.Owner{Installation: mine}))
	assert.ElementsMatch(t, []string{"px-contract-c1"}, names(provider.Owner{Installation: other}))
	assert.Empty(t, names(provider.Owner{Installation: none}))

	_, err := p.ListOwned(ctx, provider.Owner{ProxyUID: "uid-a"})
	require.Error(t, err, "an owner without an installation would select everyone's")
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
}

func deleteIdempotent(t *testing.T, h Harness) {
	p, ctx := h.New(t), t.Context()
	req := Request(h, "px-contract-3", "uid-contract-3", installation("inst"))
	created, err := p.Create(ctx, req)
	require.NoError(t, err)
	running(t, h, p, req.Name, created.ProviderID)
	require.NoError(t, p.Delete(ctx, created.ProviderID))
	require.NoError(t, p.Delete(ctx, created.ProviderID), "deleting what is being deleted is done")
	require.NoError(t, p.Delete(ctx, p.ProviderID(req)), "by the provider ID known before the create too")
	require.Eventually(t, func() bool {
		if h.Advance != nil {
			h.Advance(t, req.Name)
		}
		_, err := p.Get(ctx, created.ProviderID)
		return errors.Is(err, provider.ErrNotFound)
	}, within, 20*time.Millisecond, "a deleted instance is gone")
	require.NoError(t, p.Delete(ctx, created.ProviderID), "deleting what is gone is done")
	list, err := p.ListOwned(ctx, provider.Owner{Installation: req.Installation, ProxyUID: "uid-contract-3"})
	require.NoError(t, err)
	assert.Empty(t, list)
	assert.Zero(t, h.Instances(t))

	never := Request(h, "px-contract-never", "uid-never", req.Installation)
	require.NoError(t, p.Delete(ctx, p.ProviderID(never)), "deleting what never was is done")
}

func noCredentials(t *testing.T, h Harness) {
	p := h.New(t)
	req := Request(h, "px-contract-4", "uid-contract-4", installation("inst"))
	req.Credentials = proxyauth.Credentials{}
	_, err := p.Create(context.Background(), req)
	require.Error(t, err, "an instance without credentials would be an open proxy")
	assert.Equal(t, provider.KindPermanent, provider.Class(err))
	assert.Zero(t, h.Instances(t))
}
