package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/iterator"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Every instance with allowed source ranges has a firewall rule of its own: same name, on
// the instance's network, admitting tcp:<port> from those ranges to the instance alone
// (its target tag is the instance's name, which buildInsert adds to the instance's tags).
// A rule per instance, rather than one per Proxy or per installation, lives and dies with
// its instance, so a replacement with other ranges or another port never widens or breaks
// the rule its predecessor still serves under, and a leaked rule is found the way a leaked
// instance is: by its name and its owner.

// ruleDescriptionPrefix starts the description of every rule the provider makes. Firewall
// rules carry no labels, so the description holds the ownership a VM's labels hold, after
// this prefix. It contains no regular expression metacharacter and no quote, so it is its
// own pattern in the list filter (see ruleFilter).
const ruleDescriptionPrefix = "proxyfleet: admits crawlers to the proxy port of the instance of the same name; deleted with it;"

// descZone is the description field naming the instance's zone. A rule is per project and
// an instance per zone, so the zone says which instance a rule belongs to, and lets the
// sweeper delete a leaked rule through the provider ID of its (gone) instance.
const descZone = "proxyfleet-zone"

// Firewall rule settings.
const (
	ruleDirection = "INGRESS"
	// rulePriority is GCE's default; a rule only allows, so its rank matters only against
	// deny rules the VPC's owner put in on purpose.
	rulePriority   = 1000
	defaultNetwork = "global/networks/default"
	globalScope    = "global"
)

// ruleOwner is what a rule's description says about whose it is.
type ruleOwner struct{ installation, uid, zone string }

func (o ruleOwner) description() string {
	return fmt.Sprintf("%s %s=%s %s=%s %s=%s", ruleDescriptionPrefix,
		provider.LabelInstallation, o.installation, provider.LabelProxyUID, o.uid, descZone, o.zone)
}

// labels are the ownership labels of the instance the rule was made for.
func (o ruleOwner) labels() map[string]string {
	return map[string]string{
		provider.LabelInstallation: o.installation,
		provider.LabelProxyUID:     o.uid,
		provider.LabelManagedBy:    provider.ManagedByValue,
	}
}

// parseRuleOwner reads a description written by ruleOwner.description. Anything else,
// including our prefix followed by something unexpected, is not ours: a rule is only ever
// changed or deleted when its description proves it was made here.
func parseRuleOwner(description string) (ruleOwner, bool) {
	rest, ok := strings.CutPrefix(description, ruleDescriptionPrefix)
	if !ok {
		return ruleOwner{}, false
	}
	var o ruleOwner
	for _, field := range strings.Fields(rest) {
		k, v, _ := strings.Cut(field, "=")
		switch k {
		case provider.LabelInstallation:
			o.installation = v
		case provider.LabelProxyUID:
			o.uid = v
		case descZone:
			o.zone = v
		default:
			return ruleOwner{}, false
		}
	}
	if o.installation == "" || o.uid == "" || o.zone == "" {
		return ruleOwner{}, false
	}
	return o, true
}

// ruleFilter selects, on the server's side, the rules whose description starts with our
// prefix. It is a regular expression that must match the whole description.
var ruleFilter = fmt.Sprintf("description eq %q", ruleDescriptionPrefix+".*")

// rulePath names a rule in errors.
func rulePath(r ref) string {
	return fmt.Sprintf("projects/%s/global/firewalls/%s", r.project, r.name)
}

// buildFirewall is the rule the instance req describes needs, or nil when it needs none:
// without an external IP and without allowed source ranges, the VPC's own rules decide
// who reaches the instance, as for any other VM in it. An external IP without ranges is
// refused, permanently: the instance would be reachable by nobody, or, under a permissive
// VPC rule, by everybody. Like buildInsert it is pure, and gives the same rule for the same
// request, so a retry finds nothing to change.
func buildFirewall(req provider.CreateRequest, r ref) (*computepb.Firewall, error) {
	g := req.Spec.GCP
	if g == nil {
		return nil, provider.Permanent(errors.New("spec.gcp is missing"))
	}
	if len(g.AllowedSourceRanges) == 0 {
		if externalIP(g) {
			return nil, provider.Permanent(errors.New(
				"spec.gcp.allowedSourceRanges is required when the instance has an external IP: list the networks crawlers connect from (or set spec.gcp.externalIP to false)"))
		}
		return nil, nil
	}
	ranges, err := sourceRanges(g.AllowedSourceRanges)
	if err != nil {
		return nil, err
	}
	for i, c := range g.AllowedSourceRanges {
		// The instance gets an IPv4 address only, and a GCE rule holds IPv4 or IPv6
		// ranges, never both: an IPv6 range could admit no one.
		if p, _ := netip.ParsePrefix(string(c)); !p.Addr().Is4() {
			return nil, provider.Permanent(fmt.Errorf(
				"spec.gcp.allowedSourceRanges[%d] %q is an IPv6 range: the instance has an IPv4 address only, so list the IPv4 networks crawlers connect from", i, c))
		}
	}
	if g.Subnetwork != "" && g.Network == "" {
		// GCE puts the instance on the subnetwork's network, which the name alone does not
		// say; a rule on the default network would admit no one.
		return nil, provider.Permanent(errors.New(
			"spec.gcp.network is required with spec.gcp.subnetwork and spec.gcp.allowedSourceRanges: the firewall rule is made on the instance's network"))
	}
	if m := subnetworkProject.FindStringSubmatch(g.Subnetwork); m != nil && m[1] != r.project {
		return nil, provider.Permanent(fmt.Errorf(
			"spec.gcp.subnetwork %q is in project %s, not the instance's project %s (a Shared VPC): its firewall rules live there, which the provider does not manage; "+
				"leave spec.gcp.allowedSourceRanges empty, set spec.gcp.externalIP to false and admit crawlers with the host project's own rules",
			g.Subnetwork, m[1], r.project))
	}
	network, err := ruleNetwork(g.Network, r.project)
	if err != nil {
		return nil, err
	}
	// The description is parsed back by splitting on spaces and '='; label values have
	// neither, and are what these must be anyway to label the instance.
	if !labelValue.MatchString(req.Installation) || !labelValue.MatchString(req.ProxyUID) {
		return nil, provider.Permanent(fmt.Errorf("installation %q and Proxy UID %q must be valid GCP label values", req.Installation, req.ProxyUID))
	}
	return &computepb.Firewall{
		Name:         proto.String(r.name),
		Description:  proto.String(ruleOwner{installation: req.Installation, uid: req.ProxyUID, zone: r.zone}.description()),
		Network:      proto.String(network),
		Direction:    proto.String(ruleDirection),
		Priority:     proto.Int32(rulePriority),
		SourceRanges: ranges,
		Allowed: []*computepb.Allowed{{
			IPProtocol: proto.String("tcp"),
			Ports:      []string{strconv.Itoa(int(req.Port))},
		}},
		TargetTags: []string{r.name},
	}, nil
}

// sourceRanges are the ranges in GCE's canonical form (masked), sorted and without
// duplicates, so the rule does not depend on how the spec spells or orders them, and a
// rule read back compares equal.
func sourceRanges(cidrs []v1alpha1.CIDR) ([]string, error) {
	out := make([]string, 0, len(cidrs))
	for i, c := range cidrs {
		p, err := netip.ParsePrefix(string(c))
		if err != nil {
			return nil, provider.Permanent(fmt.Errorf("spec.gcp.allowedSourceRanges[%d] %q: not a CIDR", i, c))
		}
		out = append(out, p.Masked().String())
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// networkRef matches a network given as a path or URL naming its project.
var networkRef = regexp.MustCompile(`(?:^|/)projects/([^/]+)/global/networks/([^/]+)$`)

// ruleNetwork is the network path for the rule of an instance in project. A network in
// another project (a Shared VPC's host project) is refused: GCE keeps a network's rules in
// the network's project, while Delete finds a rule by the provider ID alone, which names
// the instance's project.
// subnetworkProject finds the project in a subnetwork path or URL.
var subnetworkProject = regexp.MustCompile(`projects/([^/]+)/regions/[^/]+/subnetworks/`)

func ruleNetwork(network, project string) (string, error) {
	if network == "" {
		return defaultNetwork, nil
	}
	path := networkPath(network)
	if m := networkRef.FindStringSubmatch(path); m != nil && m[1] != project {
		return "", provider.Permanent(fmt.Errorf(
			"spec.gcp.network %q is in project %s, not the instance's project %s: its firewall rules would have to live there, which the provider does not manage; "+
				"leave spec.gcp.allowedSourceRanges empty, set spec.gcp.externalIP to false and admit crawlers with the host project's own rules",
			network, m[1], project))
	}
	return path, nil
}

// networkID is a network path or URL reduced to projects/<project>/global/networks/<name>,
// so the path sent and the URL GCE answers with compare equal.
func networkID(network, project string) string {
	if m := networkRef.FindStringSubmatch(network); m != nil {
		return "projects/" + m[1] + "/global/networks/" + m[2]
	}
	return "projects/" + project + "/" + strings.TrimPrefix(network, "/")
}

// ruleDrifted reports whether got, a rule of ours, admits anything other than want does:
// other sources, ports or targets, or none at all (disabled, or turned around). Priority
// and logging are left as they are: they change no one's access.
func ruleDrifted(got, want *computepb.Firewall) bool {
	gotRanges, err := sourceRangesOf(got.GetSourceRanges())
	if err != nil || !slices.Equal(gotRanges, want.GetSourceRanges()) {
		return true
	}
	allowed := got.GetAllowed()
	if len(allowed) != 1 || !strings.EqualFold(allowed[0].GetIPProtocol(), "tcp") ||
		!slices.Equal(allowed[0].GetPorts(), want.GetAllowed()[0].GetPorts()) {
		return true
	}
	return got.GetDirection() != ruleDirection || got.GetDisabled() ||
		!slices.Equal(got.GetTargetTags(), want.GetTargetTags()) ||
		len(got.GetDenied()) > 0 || len(got.GetDestinationRanges()) > 0 ||
		len(got.GetSourceTags()) > 0 || len(got.GetSourceServiceAccounts()) > 0 ||
		len(got.GetTargetServiceAccounts()) > 0
}

// sourceRangesOf canonicalises ranges read back from GCE like sourceRanges does the spec's.
func sourceRangesOf(ranges []string) ([]string, error) {
	cidrs := make([]v1alpha1.CIDR, len(ranges))
	for i, s := range ranges {
		cidrs[i] = v1alpha1.CIDR(s)
	}
	return sourceRanges(cidrs)
}

// ensureFirewall makes sure want, the rule of the instance at r, exists as wanted: it
// inserts it, or finds it made by an earlier attempt and corrects it if it has drifted.
// It waits for the operations, so the rule is in place before the instance is inserted,
// and a refusal reported only inside an operation (quota, an unknown network) is an error
// here rather than a rule that never appears. Inserts carry a request ID, like the
// instance's, so a retry is recognised by GCE.
func (p *Provider) ensureFirewall(ctx context.Context, r ref, want *computepb.Firewall) error {
	owner, _ := parseRuleOwner(want.GetDescription())
	id := requestID(callFirewallInsert, r, owner.uid)
	for hop := 0; ; hop++ {
		op, err := p.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{
			Project: r.project, FirewallResource: want, RequestId: proto.String(id),
		})
		if isAlreadyExists(err) {
			err := p.reconcileFirewall(ctx, r, want)
			if errors.Is(err, provider.ErrNotFound) {
				// Deleted between the two calls; the next attempt inserts it again.
				return fmt.Errorf("gcp firewall insert %s: already exists, then not found: retrying", rulePath(r))
			}
			return err
		}
		if err != nil {
			return fmt.Errorf("gcp firewall insert %s: %w", rulePath(r), classify(callFirewallInsert, err))
		}
		if !op.Done() {
			err := p.finishFirewallOp(ctx, r, "insert", op)
			if err != nil && !op.Done() && ctx.Err() == nil && p.reconcileFirewall(ctx, r, want) == nil {
				// The operation could not be read, but the rule is there as wanted.
				return nil
			}
			return err
		}
		// Done at once: an earlier attempt's insert, recognised by its request ID. If it
		// succeeded the rule is there, unless it has been deleted since.
		if len(op.Proto().GetError().GetErrors()) == 0 {
			err := p.reconcileFirewall(ctx, r, want)
			if !errors.Is(err, provider.ErrNotFound) {
				return err
			}
		}
		// A failed earlier insert, or one whose rule is gone: its ID would only fetch its
		// operation again.
		if hop == maxRequestIDHops {
			return fmt.Errorf(
				"gcp firewall insert %s: the last %d attempts failed and GCE still remembers their request IDs; retrying once it forgets them (an hour or more)",
				rulePath(r), maxRequestIDHops)
		}
		id = nextRequestID(id, op.Proto())
	}
}

// finishFirewallOp waits for op, an insert's or update's (verb) of the rule at r, and
// returns its error, if any.
func (p *Provider) finishFirewallOp(ctx context.Context, r ref, verb string, op *compute.Operation) error {
	if !op.Done() {
		if err := p.wait(ctx, op); err != nil {
			return fmt.Errorf("gcp firewall %s %s: operation %s not finished (a retry checks the rule again): %w",
				verb, rulePath(r), op.Name(), err)
		}
	}
	if err := classifyOperation(op.Proto(), globalScope); err != nil {
		return fmt.Errorf("gcp firewall %s %s: %w", verb, rulePath(r), err)
	}
	return nil
}

// reconcileFirewall checks the existing rule at r against want. A rule that is not this
// instance's is a permanent error: taking it over would hand the instance to whatever it
// admits, and changing it would break whatever it serves. Ours is corrected if it admits
// anything other than want does. A missing rule is provider.ErrNotFound.
func (p *Provider) reconcileFirewall(ctx context.Context, r ref, want *computepb.Firewall) error {
	got, err := p.getFirewall(ctx, r)
	if err != nil {
		return err
	}
	gotOwner, ok := parseRuleOwner(got.GetDescription())
	wantOwner, _ := parseRuleOwner(want.GetDescription())
	if !ok || gotOwner != wantOwner {
		return provider.Permanent(fmt.Errorf(
			"gcp firewall %s: a rule of this name exists and was not made for this instance (its description: %q); the provider never takes over a rule it did not make",
			rulePath(r), got.GetDescription()))
	}
	if networkID(got.GetNetwork(), r.project) != networkID(want.GetNetwork(), r.project) {
		// GCE cannot move a rule to another network.
		return provider.Permanent(fmt.Errorf(
			"gcp firewall %s: the instance's rule is on network %s, not %s; delete the rule and the Proxy's next attempt makes it again",
			rulePath(r), got.GetNetwork(), want.GetNetwork()))
	}
	if !ruleDrifted(got, want) {
		return nil
	}
	// Update (PUT) rather than patch: a JSON merge patch built from a proto cannot clear a
	// list (empty lists are not sent), so a source tag added by hand would survive it.
	// No request ID: the call sets the rule to one fixed state, so repeating it is
	// harmless, while a remembered ID would make GCE skip a later correction.
	upd := proto.CloneOf(want)
	upd.LogConfig = got.GetLogConfig() // an operator's choice to log the rule's hits stays
	op, err := p.firewalls.Update(ctx, &computepb.UpdateFirewallRequest{
		Project: r.project, Firewall: r.name, FirewallResource: upd,
	})
	if err != nil {
		return fmt.Errorf("gcp firewall update %s: %w", rulePath(r), classify(callFirewallUpdate, err))
	}
	return p.finishFirewallOp(ctx, r, "update", op)
}

// getFirewall reads the rule named like the instance at r; a missing one is
// provider.ErrNotFound.
func (p *Provider) getFirewall(ctx context.Context, r ref) (*computepb.Firewall, error) {
	fw, err := p.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: r.project, Firewall: r.name})
	if err != nil {
		return nil, fmt.Errorf("gcp firewall get %s: %w", rulePath(r), classify(callFirewallGet, err))
	}
	return fw, nil
}

// ruleOf is the rule made for the instance at r. A rule of that name made by anyone else,
// or for an instance of that name in another zone, is provider.ErrNotFound: it is not the
// instance's to report or delete.
func (p *Provider) ruleOf(ctx context.Context, r ref) (*computepb.Firewall, ruleOwner, error) {
	fw, err := p.getFirewall(ctx, r)
	if err != nil {
		return nil, ruleOwner{}, err
	}
	owner, ok := parseRuleOwner(fw.GetDescription())
	if !ok || owner.zone != r.zone {
		return nil, ruleOwner{}, fmt.Errorf("gcp firewall %s: not made for this instance: %w", rulePath(r), provider.ErrNotFound)
	}
	return fw, owner, nil
}

// deleteFirewall deletes the rule of the instance at r, if there is one. Like an instance
// delete it does not wait: Get reports the instance as deleting while the rule is there,
// so the caller's polling asks again.
func (p *Provider) deleteFirewall(ctx context.Context, r ref) error {
	_, _, err := p.ruleOf(ctx, r)
	if errors.Is(err, provider.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return deleteOnce(ctx, callFirewallDelete, r, rulePath(r), func(id string) (*compute.Operation, error) {
		return p.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{
			Project: r.project, Firewall: r.name, RequestId: proto.String(id),
		})
	}, func() error { _, err := p.getFirewall(ctx, r); return err })
}

// ownedRule is a rule of owner's, with the instance it was made for.
type ownedRule struct {
	rule  *computepb.Firewall
	owner ruleOwner
}

// listOwnedRules lists the rules in project made for owner's instances. The filter is the
// server's; the sweeper deletes what ListOwned returns, so every description is checked
// again here.
func (p *Provider) listOwnedRules(ctx context.Context, project string, owner provider.Owner) ([]ownedRule, error) {
	it := p.firewalls.List(ctx, &computepb.ListFirewallsRequest{Project: project, Filter: proto.String(ruleFilter)})
	var out []ownedRule
	for {
		fw, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("gcp list firewall rules in project %s: %w", project, classify(callFirewallList, err))
		}
		o, ok := parseRuleOwner(fw.GetDescription())
		if ok && owner.Owns(o.labels()) {
			out = append(out, ownedRule{rule: fw, owner: o})
		}
	}
}

// leftover reports the instance at r, which no longer exists, through the rule left of it:
// StateDeleting, so that the workflow's delete loop and the sweeper call Delete until the
// rule is gone too.
func leftover(r ref, rule *computepb.Firewall, owner ruleOwner) provider.Instance {
	inst := provider.Instance{
		Name:       r.name,
		ProviderID: r.String(),
		State:      provider.StateDeleting,
		Labels:     owner.labels(),
	}
	if t, err := time.Parse(time.RFC3339, rule.GetCreationTimestamp()); err == nil {
		inst.CreatedAt = t
	}
	return inst
}
