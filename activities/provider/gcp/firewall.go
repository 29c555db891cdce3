package gcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// Instances with allowed source ranges are admitted by a firewall rule shared by every
// instance of the installation with the same network, ranges and port: its name (and the
// network tag it targets) is a hash of that configuration (see ruleConfig). A GCP project
// holds a few hundred rules at most, far fewer than a fleet has instances, and a rule per
// configuration is as narrow as a rule per instance: it admits the same sources to the
// same port of instances that all want exactly that. A replacement with other ranges or
// another port gets the other configuration's rule, so it never widens or breaks the rule
// its predecessor still serves under.
//
// A shared rule has no single owner to live and die with, so nothing deletes it when an
// instance goes. The orphan sweep does, once no instance uses it (see ListOwned, which
// reports an unused rule of the installation as an instance of its own, and
// deleteSharedRule, which checks again that none uses it right before deleting). Deleting
// from the instance's Delete instead would race every create of the same configuration
// (the create finds the rule, the delete sees no user yet and removes it, the VM boots
// unreachable) and would put a list of the installation's instances on every delete of a
// fleet. The race is not gone in the sweep, only rare (a create would have to fall between
// the sweep's last check and its delete, on a rule older than the sweep's minimum age), so
// every path that sees a live instance puts its rule back: Create checks it again after
// the VM's insert, and Get checks it (at most once per ruleRecheck per rule and worker),
// from the configuration the instance's description records. The same check puts back a
// rule that was edited or deleted by hand.
//
// Instances made before shared rules (tag = their own name, a rule of that name whose
// description says it was made for that instance) keep their rules: nothing here changes
// or moves them. Their rule is deleted with them, reported (and swept) when left behind,
// as it always was; see ruleOwner.

// sharedRuleDescriptionPrefix starts the description of every shared rule; the
// installation follows it. Like ruleDescriptionPrefix it holds no regular expression
// metacharacter and no quote, so it is its own pattern in a list filter.
const sharedRuleDescriptionPrefix = "proxyfleet: admits crawlers to the proxy port of the instances tagged with this rule's name; deleted by the orphan sweep once none is;"

// sharedRuleNamePrefix starts a shared rule's name and tag. Instance names start with
// "px-", so a shared rule can never be taken for an instance's own rule.
const sharedRuleNamePrefix = "proxyfleet-fw-"

// labelFirewall labels an instance with the name of the shared rule it uses, so the sweep
// can ask the server whether a rule still has users without listing the installation.
const labelFirewall = "proxyfleet-firewall"

// sharedRuleUID stands in the Proxy UID label of an unused shared rule as ListOwned
// reports it. It is no Kubernetes UID, so it never belongs to a live Proxy, and the sweep
// treats the rule like any instance whose Proxy is gone, minimum age included.
const sharedRuleUID = "shared-firewall-rule"

// instanceRulePrefix starts the description of an instance that uses a shared rule; the
// rule's configuration follows (see ruleConfig.instanceDescription). An instance's
// description cannot be changed after it is made, so Get can rebuild the rule from it
// without trusting anything editable.
const instanceRulePrefix = "proxyfleet: crawlers reach this proxy through the firewall rule its network tag names;"

// ruleRecheck is how long a shared rule checked by Get (or made by Create) is taken to be
// as wanted before Get reads it again. Thousands of instances share a handful of rules,
// and the monitor calls Get for each every few minutes; the rule need not be read as often.
const ruleRecheck = time.Minute

// ruleConfig is what decides which rule admits an instance: the installation (so two
// installations never share, and neither deletes the other's), the network (a rule lives
// on one), and the sources and port it admits.
type ruleConfig struct {
	installation string
	project      string
	// network is projects/<project>/global/networks/<name>, whatever form the spec used.
	network string
	// ranges are canonical, sorted and without duplicates (see sourceRanges).
	ranges []string
	port   int32
}

// name is the rule's name and the tag it targets: a hash of the configuration, so every
// instance of it finds the same rule without a registry.
func (c ruleConfig) name() string {
	sum := sha256.Sum256([]byte(strings.Join([]string{
		"proxyfleet firewall", c.installation, c.network, strconv.Itoa(int(c.port)), strings.Join(c.ranges, ","),
	}, "\n")))
	return sharedRuleNamePrefix + hex.EncodeToString(sum[:8])
}

// firewall is the rule as the provider makes it.
func (c ruleConfig) firewall() *computepb.Firewall {
	name := c.name()
	return &computepb.Firewall{
		Name:         proto.String(name),
		Description:  proto.String(sharedRuleDescription(c.installation)),
		Network:      proto.String(c.network),
		Direction:    proto.String(ruleDirection),
		Priority:     proto.Int32(rulePriority),
		SourceRanges: slices.Clone(c.ranges),
		Allowed: []*computepb.Allowed{{
			IPProtocol: proto.String("tcp"),
			Ports:      []string{strconv.Itoa(int(c.port))},
		}},
		TargetTags: []string{name},
	}
}

// instanceDescription records the configuration on the instance, for Get (see
// parseInstanceRule).
func (c ruleConfig) instanceDescription() string {
	return fmt.Sprintf("%s rule=%s network=%s port=%d ranges=%s",
		instanceRulePrefix, c.name(), c.network, c.port, strings.Join(c.ranges, ","))
}

// parseInstanceRule reads the configuration back from an instance made by this version:
// its description, its installation label and its tags. It reports false for anything
// else (an older instance, one without a rule, a description that does not hash to the
// rule it names, or an instance without the rule's tag): the rule is then not this
// instance's to put back.
func parseInstanceRule(inst *computepb.Instance, project string) (ruleConfig, bool) {
	rest, ok := strings.CutPrefix(inst.GetDescription(), instanceRulePrefix)
	if !ok {
		return ruleConfig{}, false
	}
	c := ruleConfig{installation: inst.GetLabels()[provider.LabelInstallation], project: project}
	var name string
	for _, field := range strings.Fields(rest) {
		k, v, _ := strings.Cut(field, "=")
		switch k {
		case "rule":
			name = v
		case "network":
			c.network = v
		case "port":
			port, err := strconv.Atoi(v)
			if err != nil || port < 1 || port > 65535 {
				return ruleConfig{}, false
			}
			c.port = int32(port)
		case "ranges":
			ranges, err := sourceRangesOf(strings.Split(v, ","))
			if err != nil || !slices.Equal(ranges, strings.Split(v, ",")) {
				return ruleConfig{}, false
			}
			c.ranges = ranges
		default:
			return ruleConfig{}, false
		}
	}
	if !labelValue.MatchString(c.installation) || c.network != networkID(c.network, project) ||
		c.port == 0 || len(c.ranges) == 0 || name != c.name() ||
		!slices.Contains(inst.GetTags().GetItems(), name) {
		return ruleConfig{}, false
	}
	return c, true
}

func sharedRuleDescription(installation string) string {
	return fmt.Sprintf("%s %s=%s", sharedRuleDescriptionPrefix, provider.LabelInstallation, installation)
}

// parseSharedRuleOwner reads the installation from a shared rule's description; anything
// else is not a shared rule of ours.
func parseSharedRuleOwner(description string) (string, bool) {
	rest, ok := strings.CutPrefix(description, sharedRuleDescriptionPrefix+" "+provider.LabelInstallation+"=")
	if !ok || !labelValue.MatchString(rest) {
		return "", false
	}
	return rest, true
}

// sharedRuleLabels are the labels an unused shared rule is reported with (see
// sharedRuleUID).
func sharedRuleLabels(installation string) map[string]string {
	return map[string]string{
		provider.LabelInstallation: installation,
		provider.LabelProxyUID:     sharedRuleUID,
		provider.LabelManagedBy:    provider.ManagedByValue,
	}
}

// ruleDescriptionPrefix starts the description of every per-instance rule made before
// rules were shared. Firewall rules carry no labels, so the description holds the
// ownership a VM's labels hold, after this prefix. It contains no regular expression
// metacharacter and no quote, so it is its own pattern in the list filter (see
// legacyRuleFilter).
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

// legacyRuleFilter selects, on the server's side, the per-instance rules of owner's
// instances: those of the installation, or of one Proxy in it. It is a regular
// expression that must match the whole description; the values are label values
// (checked by ownerFilter), which hold no metacharacter.
func legacyRuleFilter(owner provider.Owner) string {
	re := fmt.Sprintf("%s %s=%s ", ruleDescriptionPrefix, provider.LabelInstallation, owner.Installation)
	if owner.ProxyUID != "" {
		re += fmt.Sprintf("%s=%s ", provider.LabelProxyUID, owner.ProxyUID)
	}
	return fmt.Sprintf("description eq %q", re+".*")
}

// sharedRuleFilter selects, on the server's side, the shared rules of an installation.
func sharedRuleFilter(installation string) string {
	return fmt.Sprintf("description eq %q", sharedRuleDescription(installation))
}

// rulePath names a rule in errors.
func rulePath(r ref) string { return firewallPath(r.project, r.name) }

func firewallPath(project, name string) string {
	return fmt.Sprintf("projects/%s/global/firewalls/%s", project, name)
}

// ruleConfigFor is the configuration of the rule the instance req describes needs, or nil
// when it needs none: without an external IP and without allowed source ranges, the
// VPC's own rules decide who reaches the instance, as for any other VM in it. An external
// IP without ranges is refused, permanently: the instance would be reachable by nobody,
// or, under a permissive VPC rule, by everybody. Like buildInsert it is pure, and gives
// the same rule for the same request, so a retry finds nothing to change.
func ruleConfigFor(req provider.CreateRequest, project string) (*ruleConfig, error) {
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
	if m := subnetworkProject.FindStringSubmatch(g.Subnetwork); m != nil && m[1] != project {
		return nil, provider.Permanent(fmt.Errorf(
			"spec.gcp.subnetwork %q is in project %s, not the instance's project %s (a Shared VPC): its firewall rules live there, which the provider does not manage; "+
				"leave spec.gcp.allowedSourceRanges empty, set spec.gcp.externalIP to false and admit crawlers with the host project's own rules",
			g.Subnetwork, m[1], project))
	}
	network, err := ruleNetwork(g.Network, project)
	if err != nil {
		return nil, err
	}
	// The rule's description carries the installation and is parsed back by splitting on
	// spaces and '='; a label value has neither, and is what it must be anyway to label
	// the instance.
	if !labelValue.MatchString(req.Installation) {
		return nil, provider.Permanent(fmt.Errorf("installation %q must be a valid GCP label value", req.Installation))
	}
	return &ruleConfig{
		installation: req.Installation,
		project:      project,
		network:      networkID(network, project),
		ranges:       ranges,
		port:         req.Port,
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

// subnetworkProject finds the project in a subnetwork path or URL.
var subnetworkProject = regexp.MustCompile(`projects/([^/]+)/regions/[^/]+/subnetworks/`)

// ruleNetwork is the network path for the rule of an instance in project. A network in
// another project (a Shared VPC's host project) is refused: GCE keeps a network's rules in
// the network's project, while the provider looks for rules in the instance's project.
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

// ensureRule makes sure c's rule exists as wanted: it inserts it, or finds it (made by
// another instance of the configuration, or an earlier attempt) and corrects it if it has
// drifted. It waits for the operations, so the rule is in place before an instance is
// inserted behind it, and a refusal reported only inside an operation (quota, an unknown
// network) is an error here rather than a rule that never appears. The insert carries a
// request ID derived from the rule and installation, so a retry, or another instance's
// create of the same rule, is recognised by GCE. On success the rule counts as checked
// (see ruleChecked).
func (p *Provider) ensureRule(ctx context.Context, c ruleConfig) error {
	want := c.firewall()
	path := firewallPath(c.project, want.GetName())
	id := nameUUID(string(callFirewallInsert) + " " + path + " " + c.installation)
	for hop := 0; ; hop++ {
		op, err := p.firewalls.Insert(ctx, &computepb.InsertFirewallRequest{
			Project: c.project, FirewallResource: want, RequestId: proto.String(id),
		})
		if isAlreadyExists(err) {
			err := p.reconcileRule(ctx, c)
			if errors.Is(err, provider.ErrNotFound) {
				// Deleted between the two calls (by the sweep); the next attempt inserts it
				// again.
				return fmt.Errorf("gcp firewall insert %s: already exists, then not found: retrying", path)
			}
			return err
		}
		if err != nil {
			return fmt.Errorf("gcp firewall insert %s: %w", path, classify(callFirewallInsert, err))
		}
		if !op.Done() {
			err := p.finishFirewallOp(ctx, path, "insert", op)
			if err != nil && !op.Done() && ctx.Err() == nil && p.reconcileRule(ctx, c) == nil {
				// The operation could not be read, but the rule is there as wanted.
				return nil
			}
			if err == nil {
				p.ruleChecked(c)
			}
			return err
		}
		// Done at once: an earlier insert under this request ID, recognised by GCE. If it
		// succeeded the rule is there, unless it has been deleted since.
		if len(op.Proto().GetError().GetErrors()) == 0 {
			err := p.reconcileRule(ctx, c)
			if !errors.Is(err, provider.ErrNotFound) {
				return err
			}
		}
		// A failed earlier insert, or one whose rule is gone: its ID would only fetch its
		// operation again.
		if hop == maxRequestIDHops {
			return fmt.Errorf(
				"gcp firewall insert %s: the last %d attempts failed and GCE still remembers their request IDs; retrying once it forgets them (an hour or more)",
				path, maxRequestIDHops)
		}
		id = nextRequestID(id, op.Proto())
	}
}

// finishFirewallOp waits for op, an insert's or update's (verb) of the rule at path, and
// returns its error, if any.
func (p *Provider) finishFirewallOp(ctx context.Context, path, verb string, op *compute.Operation) error {
	if !op.Done() {
		if err := p.wait(ctx, op); err != nil {
			return fmt.Errorf("gcp firewall %s %s: operation %s not finished (a retry checks the rule again): %w",
				verb, path, op.Name(), err)
		}
	}
	if err := classifyOperation(op.Proto(), globalScope); err != nil {
		return fmt.Errorf("gcp firewall %s %s: %w", verb, path, err)
	}
	return nil
}

// reconcileRule checks the existing rule of c against what c wants. A rule of that name
// that is not a shared rule of c's installation is a permanent error: taking it over would
// hand the instance to whatever it admits, and changing it would break whatever it serves.
// Ours is corrected if it admits anything other than it should. A missing rule is
// provider.ErrNotFound. On success the rule counts as checked.
func (p *Provider) reconcileRule(ctx context.Context, c ruleConfig) error {
	want := c.firewall()
	name, path := want.GetName(), firewallPath(c.project, want.GetName())
	got, err := p.getFirewall(ctx, c.project, name)
	if err != nil {
		return err
	}
	if inst, ok := parseSharedRuleOwner(got.GetDescription()); !ok || inst != c.installation {
		return provider.Permanent(fmt.Errorf(
			"gcp firewall %s: a rule of this name exists and was not made by this installation (its description: %q); the provider never takes over a rule it did not make",
			path, got.GetDescription()))
	}
	if networkID(got.GetNetwork(), c.project) != c.network {
		// GCE cannot move a rule to another network. The name hashes the network, so this
		// is a rule edited by hand (or recreated) on another one.
		return provider.Permanent(fmt.Errorf(
			"gcp firewall %s: the rule is on network %s, not %s; delete the rule and the next create or check makes it again",
			path, got.GetNetwork(), c.network))
	}
	if !ruleDrifted(got, want) {
		p.ruleChecked(c)
		return nil
	}
	// Update (PUT) rather than patch: a JSON merge patch built from a proto cannot clear a
	// list (empty lists are not sent), so a source tag added by hand would survive it.
	// No request ID: the call sets the rule to one fixed state, so repeating it is
	// harmless, while a remembered ID would make GCE skip a later correction.
	want.LogConfig = got.GetLogConfig() // an operator's choice to log the rule's hits stays
	op, err := p.firewalls.Update(ctx, &computepb.UpdateFirewallRequest{
		Project: c.project, Firewall: name, FirewallResource: want,
	})
	if isNotReady(err) {
		// Another update (or a delete) of the rule runs; the next check looks again.
		return fmt.Errorf("gcp firewall update %s: the rule is busy with another operation: retrying", path)
	}
	if err != nil {
		return fmt.Errorf("gcp firewall update %s: %w", path, classify(callFirewallUpdate, err))
	}
	if err := p.finishFirewallOp(ctx, path, "update", op); err != nil {
		return err
	}
	p.ruleChecked(c)
	return nil
}

// keepRule makes sure the rule of a live instance is there as wanted, reading it first:
// the check Create makes after its insert and Get makes for a live instance. Reading
// first costs one call when all is well, where ensureRule's insert would cost two.
func (p *Provider) keepRule(ctx context.Context, c ruleConfig) error {
	err := p.reconcileRule(ctx, c)
	if errors.Is(err, provider.ErrNotFound) {
		return p.ensureRule(ctx, c)
	}
	return err
}

// ruleChecked notes that c's rule was found or made as wanted just now.
func (p *Provider) ruleChecked(c ruleConfig) {
	if p.ruleRecheck <= 0 {
		return
	}
	now := p.now()
	p.checkedMu.Lock()
	defer p.checkedMu.Unlock()
	// A handful of rules, each noted every ruleRecheck at most: pruning here keeps the
	// map as small as the rules in use.
	for k, at := range p.checked {
		if now.Sub(at) >= p.ruleRecheck {
			delete(p.checked, k)
		}
	}
	p.checked[firewallPath(c.project, c.name())] = now
}

// ruleFresh reports whether c's rule was checked within ruleRecheck.
func (p *Provider) ruleFresh(c ruleConfig) bool {
	p.checkedMu.Lock()
	defer p.checkedMu.Unlock()
	at, ok := p.checked[firewallPath(c.project, c.name())]
	return ok && p.now().Sub(at) < p.ruleRecheck
}

// forgetRule drops what ruleChecked noted about the rule at path, once it is deleted.
func (p *Provider) forgetRule(path string) {
	p.checkedMu.Lock()
	defer p.checkedMu.Unlock()
	delete(p.checked, path)
}

// getFirewall reads a rule; a missing one is provider.ErrNotFound.
func (p *Provider) getFirewall(ctx context.Context, project, name string) (*computepb.Firewall, error) {
	fw, err := p.firewalls.Get(ctx, &computepb.GetFirewallRequest{Project: project, Firewall: name})
	if err != nil {
		return nil, fmt.Errorf("gcp firewall get %s: %w", firewallPath(project, name), classify(callFirewallGet, err))
	}
	return fw, nil
}

// ruleOf is the per-instance rule made for the instance at r by a version before shared
// rules. A rule of that name made by anyone else, or for an instance of that name in
// another zone, is provider.ErrNotFound: it is not the instance's to report or delete.
func (p *Provider) ruleOf(ctx context.Context, r ref) (*computepb.Firewall, ruleOwner, error) {
	fw, err := p.getFirewall(ctx, r.project, r.name)
	if err != nil {
		return nil, ruleOwner{}, err
	}
	owner, ok := parseRuleOwner(fw.GetDescription())
	if !ok || owner.zone != r.zone {
		return nil, ruleOwner{}, fmt.Errorf("gcp firewall %s: not made for this instance: %w", rulePath(r), provider.ErrNotFound)
	}
	return fw, owner, nil
}

// deleteFirewall deletes the per-instance rule of the instance at r, if there is one
// (instances made before shared rules have one; an instance made since has none, which
// costs this one read). Like an instance delete it does not wait: Get reports the
// instance as deleting while the rule is there, so the caller's polling asks again.
func (p *Provider) deleteFirewall(ctx context.Context, r ref) error {
	_, _, err := p.ruleOf(ctx, r)
	if errors.Is(err, provider.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return deleteOnce(ctx, callFirewallDelete, rulePath(r), requestID(callFirewallDelete, r, ""), func(id string) (*compute.Operation, error) {
		return p.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{
			Project: r.project, Firewall: r.name, RequestId: proto.String(id),
		})
	}, func() error { _, err := p.getFirewall(ctx, r.project, r.name); return err })
}

// ruleUsers reports whether any instance of installation in project is labelled as using
// the shared rule name, asking the server for exactly those (a label filter), so the
// check costs one short list however large the fleet.
func (p *Provider) ruleUsers(ctx context.Context, project, installation, name string) (bool, error) {
	filter := fmt.Sprintf("(labels.%s = %q) (labels.%s = %q)", provider.LabelInstallation, installation, labelFirewall, name)
	it := p.client.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: project, Filter: proto.String(filter),
	})
	for {
		pair, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("gcp list the users of firewall rule %s: %w", firewallPath(project, name), classify(callList, err))
		}
		for _, inst := range pair.Value.GetInstances() {
			// A too-broad answer errs on the side of keeping the rule; a user is checked
			// anyway, by the label or by the tag the rule selects it with.
			if inst.GetLabels()[labelFirewall] == name || slices.Contains(inst.GetTags().GetItems(), name) {
				return true, nil
			}
		}
	}
}

// deleteSharedRule deletes the shared rule name, which the sweep found unused: only if it
// is still a shared rule of ours and no instance uses it now. The check right before the
// delete narrows the race with a create of the same configuration to the one call in
// between; a create that falls into it puts the rule back itself (see keepRule).
func (p *Provider) deleteSharedRule(ctx context.Context, project, name string) error {
	path := firewallPath(project, name)
	fw, err := p.getFirewall(ctx, project, name)
	if errors.Is(err, provider.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	installation, ok := parseSharedRuleOwner(fw.GetDescription())
	if !ok {
		// Not ours (any more): nothing of ours to delete.
		return nil
	}
	used, err := p.ruleUsers(ctx, project, installation, name)
	if err != nil {
		return err
	}
	if used {
		return fmt.Errorf("firewall rule %s: an instance uses it again: %w", path, provider.ErrInUse)
	}
	p.forgetRule(path)
	return deleteOnce(ctx, callFirewallDelete, path, nameUUID(string(callFirewallDelete)+" "+path), func(id string) (*compute.Operation, error) {
		return p.firewalls.Delete(ctx, &computepb.DeleteFirewallRequest{
			Project: project, Firewall: name, RequestId: proto.String(id),
		})
	}, func() error { _, err := p.getFirewall(ctx, project, name); return err })
}

// ownedRule is a per-instance rule of owner's, with the instance it was made for.
type ownedRule struct {
	rule  *computepb.Firewall
	owner ruleOwner
}

// listOwnedRules lists the per-instance rules in project made for owner's instances. The
// filter is the server's; the sweeper deletes what ListOwned returns, so every
// description is checked again here.
func (p *Provider) listOwnedRules(ctx context.Context, project string, owner provider.Owner) ([]ownedRule, error) {
	var out []ownedRule
	err := p.listRules(ctx, project, legacyRuleFilter(owner), func(fw *computepb.Firewall) {
		if o, ok := parseRuleOwner(fw.GetDescription()); ok && owner.Owns(o.labels()) {
			out = append(out, ownedRule{rule: fw, owner: o})
		}
	})
	return out, err
}

// listSharedRules lists the shared rules of installation in project, checked like
// listOwnedRules checks its own.
func (p *Provider) listSharedRules(ctx context.Context, project, installation string) ([]*computepb.Firewall, error) {
	var out []*computepb.Firewall
	err := p.listRules(ctx, project, sharedRuleFilter(installation), func(fw *computepb.Firewall) {
		if inst, ok := parseSharedRuleOwner(fw.GetDescription()); ok && inst == installation {
			out = append(out, fw)
		}
	})
	return out, err
}

func (p *Provider) listRules(ctx context.Context, project, filter string, each func(*computepb.Firewall)) error {
	it := p.firewalls.List(ctx, &computepb.ListFirewallsRequest{Project: project, Filter: proto.String(filter)})
	for {
		fw, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("gcp list firewall rules in project %s: %w", project, classify(callFirewallList, err))
		}
		each(fw)
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

// unusedRule reports a shared rule no instance uses as an instance of its own, being
// deleted, under a provider ID naming the rule (see parseRuleID): the sweep deletes it
// through Delete once it is older than the sweep's minimum age (see sharedRuleUID).
func unusedRule(project, installation string, rule *computepb.Firewall) provider.Instance {
	inst := provider.Instance{
		Name:       rule.GetName(),
		ProviderID: firewallPath(project, rule.GetName()),
		State:      provider.StateDeleting,
		Labels:     sharedRuleLabels(installation),
	}
	if t, err := time.Parse(time.RFC3339, rule.GetCreationTimestamp()); err == nil {
		inst.CreatedAt = t
	}
	return inst
}

// parseRuleID parses the provider ID of an unused shared rule, as unusedRule writes it.
// Anything else, a per-instance rule's name included, is not one.
func parseRuleID(id string) (project, name string, ok bool) {
	parts := strings.Split(id, "/")
	if len(parts) != 5 || parts[0] != "projects" || parts[1] == "" || parts[2] != "global" || parts[3] != "firewalls" ||
		!strings.HasPrefix(parts[4], sharedRuleNamePrefix) {
		return "", "", false
	}
	return parts[1], parts[4], true
}
