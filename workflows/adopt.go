package workflows

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/activities"
	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// A run that starts without state (after a terminate, a server limit or a reset) first
// finds what earlier runs left: adopt is the transition that takes it.

// maxInstanceNumber bounds the instance numbers adopt believes: far beyond any Proxy's
// count of instances, far below where the counter would wrap around.
const maxInstanceNumber = 1 << 31

// adopt takes what the providers hold for this Proxy, on a run that started without state.
// Instances already recorded are left alone. Of the others, the newest that can serve
// becomes the current instance when there is none and the Proxy is not being deleted: kept
// as-is if its spec-hash label says it was built from the spec now wanted, otherwise
// replaced make-before-break like any outdated instance. Everything else is retired. The
// counter moves past every number found and the instance last published, so a new
// instance reuses an old name only if that one never served (a replacement lost while it
// was made, published nowhere).
func (s *ProxyState) adopt(res activities.FindResult, now time.Time) effect {
	found := res.Instances
	s.Unlisted = false
	s.succeeded()
	s.Replacements = max(s.Replacements, res.Replacements)
	prefix := strings.TrimSuffix(InstanceName(s.UID, 0), "0")
	number := func(name string) int {
		n, err := strconv.Atoi(strings.TrimPrefix(name, prefix))
		if err != nil || !strings.HasPrefix(name, prefix) || n < 0 || n > maxInstanceNumber {
			return 0 // not one of this Proxy's names, or one no run made (a hand-edited status)
		}
		return n
	}
	// The instance the Proxy last published may be gone from every list (and its name
	// still held by a cloud: EC2 keeps a client token for a while after its instance is
	// terminated), so new names start past it too.
	s.Counter = max(s.Counter, number(res.Published))
	var unknown []activities.OwnedInstance
	for _, f := range found {
		if s.find(f.Instance.Name) == nil {
			unknown = append(unknown, f)
		}
		s.Counter = max(s.Counter, number(f.Instance.Name))
	}
	if len(unknown) == 0 {
		return effect{}
	}
	// Newest first: running before provisioning, then the higher number.
	rank := func(f activities.OwnedInstance) int {
		if f.Instance.State == provider.StateRunning && f.Instance.IP != "" {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(unknown, func(x, y activities.OwnedInstance) int {
		if c := cmp.Compare(rank(y), rank(x)); c != 0 {
			return c
		}
		if c := cmp.Compare(number(y.Instance.Name), number(x.Instance.Name)); c != 0 {
			return c
		}
		return strings.Compare(x.Instance.Name, y.Instance.Name)
	})
	ref := func(f activities.OwnedInstance) InstanceRef {
		r := InstanceRef{
			Provider: f.Provider, Name: f.Instance.Name, ProviderID: f.Instance.ProviderID, Created: true,
			State: f.Instance.State, IP: f.Instance.IP, Hash: f.Instance.Labels[provider.LabelSpecHash],
			CreatedAt: f.Instance.CreatedAt, KeyID: f.Instance.Labels[provider.LabelKeyID],
		}
		if r.Hash == "" && s.Spec != nil && f.Provider == s.Spec.Provider {
			// Built before instances carried their spec hash (version 0): taken as built from
			// the spec now wanted, or every proxy would be replaced when its run moves to
			// this version. Until the cloud-init hash is known it stays empty (hashed fills it).
			if !s.NeedHash {
				r.Hash = DesiredHash(s.Spec, s.SecretHash)
			}
		}
		if s.Spec != nil {
			r.Spec = *s.Spec
			r.Port = portOr(f.Instance.Port, s.Spec)
		}
		if r.CreatedAt.IsZero() {
			r.CreatedAt = now
		}
		return r
	}
	var adopted string
	canServe := func(f activities.OwnedInstance) bool {
		st := f.Instance.State
		return st == provider.StateRunning || st == provider.StateProvisioning
	}
	if !s.Deleting && s.Spec != nil && s.Spec.EffectiveMode() == v1alpha1.ModeManaged && s.Instance == nil &&
		unknown[0].Provider == s.Spec.Provider && canServe(unknown[0]) {
		r := ref(unknown[0])
		s.Instance = &r
		adopted = r.Name
		unknown = unknown[1:]
	}
	var retired []string
	for _, f := range unknown {
		s.Retiring = append(s.Retiring, ref(f))
		retired = append(retired, f.Instance.Name)
	}
	note := fmt.Sprintf("found %d instance(s) of earlier runs", len(found))
	if adopted != "" {
		note += "; adopted " + adopted
	}
	if len(retired) > 0 {
		note += "; retiring " + strings.Join(retired, ", ")
	}
	return effect{replan: true, note: note, warn: true}
}
