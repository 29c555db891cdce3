package gcp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"strings"
	"sync"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	gax "github.com/googleapis/gax-go/v2"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// Config configures a Provider.
type Config struct {
	// DefaultProject is used when spec.gcp.project is empty, and is the project ListOwned
	// searches, so the orphan sweeper only sees instances there.
	DefaultProject string
	// ClientOptions are passed to the Compute clients (credentials, endpoint, HTTP client).
	// Any logger among them is replaced: the client's debug log prints request bodies,
	// which carry the startup script (the password's hash and the cloud-init data).
	ClientOptions []option.ClientOption
	// Logger receives what Get cannot report in its answer: a shared firewall rule it
	// found missing or changed and could not put back (see Get). Nil is slog.Default().
	Logger *slog.Logger
}

// Provider runs Proxy instances as Compute Engine VMs.
type Provider struct {
	client *compute.InstancesClient
	// firewalls keeps the shared firewall rules instances are admitted by (see ruleConfig).
	firewalls      *compute.FirewallsClient
	defaultProject string
	log            *slog.Logger
	// pollFirst and pollMax pace the polls of an insert operation: the first pause, then
	// doubling up to the last. Tests shorten them.
	pollFirst, pollMax time.Duration

	// checked holds when each shared rule (by path) was last found or made as wanted, so
	// Get reads a rule at most once per ruleRecheck (see keepRule). Tests set ruleRecheck
	// to 0 to have every Get read it, and replace now.
	checkedMu   sync.Mutex
	checked     map[string]time.Time
	ruleRecheck time.Duration
	now         func() time.Time
}

// Pauses between polls of an insert operation. An insert usually finishes within tens of
// seconds; polling more often than every few seconds would only spend API rate quota.
const (
	defaultPollFirst = time.Second
	defaultPollMax   = 5 * time.Second
)

var _ provider.Provider = (*Provider)(nil)

// New returns a Provider with its own Compute client; Close releases it.
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.DefaultProject == "" {
		// Without it the sweeper would list nothing and leaks would go unnoticed.
		return nil, errors.New("gcp: Config.DefaultProject is required")
	}
	opts := append(append([]option.ClientOption(nil), cfg.ClientOptions...),
		option.WithLogger(slog.New(slog.DiscardHandler)))
	client, err := compute.NewInstancesRESTClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcp: compute client: %w", err)
	}
	firewalls, err := compute.NewFirewallsRESTClient(ctx, opts...)
	if err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("gcp: compute firewalls client: %w", err)
	}
	return &Provider{client: client, firewalls: firewalls, defaultProject: cfg.DefaultProject,
		log:       cmp.Or(cfg.Logger, slog.Default()),
		pollFirst: defaultPollFirst, pollMax: defaultPollMax,
		checked: map[string]time.Time{}, ruleRecheck: ruleRecheck, now: time.Now}, nil
}

// Close releases the clients' connections.
func (p *Provider) Close() error { return errors.Join(p.client.Close(), p.firewalls.Close()) }

// ref locates one instance: what a provider ID encodes.
type ref struct{ project, zone, name string }

func (r ref) String() string {
	return fmt.Sprintf("projects/%s/zones/%s/instances/%s", r.project, r.zone, r.name)
}

// parseProviderID is strict: an ID that does not parse can only come from a bug or a
// hand-edited status, and guessing would risk deleting someone else's VM.
func parseProviderID(id string) (ref, error) {
	parts := strings.Split(id, "/")
	if len(parts) != 6 || parts[0] != "projects" || parts[2] != "zones" || parts[4] != "instances" ||
		parts[1] == "" || parts[3] == "" || parts[5] == "" {
		return ref{}, provider.Permanent(fmt.Errorf("malformed gcp provider ID %q: want projects/<project>/zones/<zone>/instances/<name>", id))
	}
	return ref{project: parts[1], zone: parts[3], name: parts[5]}, nil
}

func (p *Provider) refFor(req provider.CreateRequest) ref {
	r := ref{project: p.defaultProject, name: req.Name}
	if g := req.Spec.GCP; g != nil {
		r.zone = g.Zone
		if g.Project != "" {
			r.project = g.Project
		}
	}
	return r
}

// ProviderID implements provider.Provider. The zone is part of the ID so that an instance
// created before a zone edit is still found, and deleted, in its old zone.
func (p *Provider) ProviderID(req provider.CreateRequest) string { return p.refFor(req).String() }

// Create implements provider.Provider. It first makes sure the firewall rule the instance
// needs, if any, is there (see ruleConfigFor; instances of one configuration share it), so
// the instance is reachable from its crawlers' networks as soon as it runs, and a rule that
// cannot be made stops the create before anything billable exists. It then inserts the
// instance and waits for the operation to finish,
// because GCE accepts an insert first and only then finds out whether the zone has the
// hardware or the project the quota: a stockout or quota refusal is reported inside the
// operation alone, and without waiting the VM would simply never appear. The wait is
// bounded by ctx; if ctx ends first, the error is transient and the retry, sending the same
// request ID, is answered with the same operation and waits again (or finds the instance).
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	r := p.refFor(req)
	ins, err := buildInsert(req, r.project)
	if err != nil {
		// The squid package's refusals are its own to word; none should quote the
		// cloud-init data, and this makes sure.
		return provider.Instance{}, redact(err, req.CloudInit)
	}
	rule, err := ruleConfigFor(req, r.project)
	if err != nil {
		return provider.Instance{}, err
	}
	if rule != nil {
		if err := p.ensureRule(ctx, *rule); err != nil {
			return provider.Instance{}, err
		}
	}
	secrets := [][]byte{startupScriptOf(ins), req.CloudInit}
	// The fleet key is part of the ID: a retry under another primary key (a rotation cut
	// the first attempt short) must not be answered with the first attempt's operation
	// and then report its own labels for a VM built with the other key's credentials. It
	// meets the 409 instead, and adopt reports the VM as it is.
	id := requestID(callInsert, r, insertOwner(req))
	for hop := 0; ; hop++ {
		ins.RequestId = proto.String(id)
		op, err := p.client.Insert(ctx, ins)
		if isAlreadyExists(err) {
			return p.adopt(ctx, r, req.ProxyUID)
		}
		if err != nil {
			return provider.Instance{}, redact(fmt.Errorf("gcp insert %s: %w", r, classify(callInsert, err)), secrets...)
		}
		if !op.Done() {
			inst, err := p.awaitInsert(ctx, r, req, ins, op, secrets)
			if err == nil && rule != nil {
				// The rule was there before the insert, but the sweep may have found it
				// unused and deleted it since, in the moment before this instance was
				// listed as using it. Reading it again after the insert's wait closes that
				// gap: a sweep that checked before this instance existed sends its delete
				// right after its check, long before an insert's operation is done (and
				// Get puts the rule back in the unlikely case it is not).
				if err := p.keepRule(ctx, *rule); err != nil {
					return provider.Instance{}, fmt.Errorf("gcp insert %s: checking its firewall rule again: %w", r, err)
				}
			}
			return inst, err
		}
		// GCE answers a new insert with an operation still pending or running, so one that
		// is already done is an earlier attempt's, recognised by its request ID.
		if len(op.Proto().GetError().GetErrors()) == 0 {
			inst, err := p.get(ctx, r)
			if !errors.Is(err, provider.ErrNotFound) {
				if err != nil {
					return provider.Instance{}, err
				}
				return p.owned(r, inst, req.ProxyUID)
			}
			// Created, then deleted since: this name is being used again, and needs a
			// request GCE has not seen.
		}
		// A failed earlier attempt, or one whose instance is gone: sending its ID again
		// would only fetch its operation again, so this attempt needs a new one.
		if hop == maxRequestIDHops {
			return provider.Instance{}, fmt.Errorf(
				"gcp insert %s: the last %d attempts under this name failed and GCE still remembers their request IDs; retrying once it forgets them (an hour or more)",
				r, maxRequestIDHops)
		}
		id = nextRequestID(id, op.Proto())
	}
}

// awaitInsert waits for an accepted insert's operation and reports its outcome. An error
// inside the operation is classified like a direct API error of the same reason, so a
// stockout or quota refusal becomes provider.QuotaError (a wait, shown as QuotaExceeded)
// instead of an instance that never appears.
func (p *Provider) awaitInsert(ctx context.Context, r ref, req provider.CreateRequest, ins *computepb.InsertInstanceRequest, op *compute.Operation, secrets [][]byte) (provider.Instance, error) {
	if err := p.wait(ctx, op); err != nil {
		if ctx.Err() != nil {
			return provider.Instance{}, fmt.Errorf(
				"gcp insert %s: operation %s still running when the call ran out of time (a retry waits for it again): %w", r, op.Name(), err)
		}
		// The operation cannot be read (an API error polling it). The instance may well be
		// on its way; report it as Get sees it, as if the operation were not there, rather
		// than fail a create that went through. A stockout then shows as the instance
		// vanishing, which the workflow answers with a new instance.
		if inst, gerr := p.adopt(ctx, r, req.ProxyUID); gerr == nil {
			return inst, nil
		}
		return provider.Instance{}, fmt.Errorf("gcp insert %s: polling operation %s: %w", r, op.Name(), err)
	}
	if err := classifyOperation(op.Proto(), zoneScope(r.zone)); err != nil {
		return provider.Instance{}, redact(fmt.Errorf("gcp insert %s: %w", r, err), secrets...)
	}
	inst := provider.Instance{
		Name:       r.name,
		ProviderID: r.String(),
		State:      provider.StateProvisioning,
		Labels:     ins.GetInstanceResource().GetLabels(),
	}
	// The operation's insert time stands in for the VM's creation time, which only Get
	// can report; they differ by the time GCE takes to accept the request.
	if t, err := time.Parse(time.RFC3339, op.Proto().GetInsertTime()); err == nil {
		inst.CreatedAt = t
	}
	return inst, nil
}

// wait polls op until it is done or ctx ends. It returns nil once the operation is done,
// whether it succeeded or failed: its outcome is in op.Proto(). The client's own Wait is
// not used because its pauses grow to a minute, half the caller's whole activity.
func (p *Provider) wait(ctx context.Context, op *compute.Operation) error {
	pause := p.pollFirst
	for {
		// Poll returns an error for an operation that finished with one, after recording
		// it: that outcome is the caller's to read, not a failure to poll.
		err := op.Poll(ctx)
		if op.Done() {
			return nil
		}
		if err != nil {
			return err
		}
		if err := gax.Sleep(ctx, pause); err != nil {
			return err
		}
		pause = min(2*pause, p.pollMax)
	}
}

// adopt answers an insert refused with 409. After a crash the name is taken by our own
// earlier attempt, which is success; if another Proxy (or a person) owns the name, taking
// the VM over would hand its traffic, and later its deletion, to the wrong owner.
func (p *Provider) adopt(ctx context.Context, r ref, proxyUID string) (provider.Instance, error) {
	inst, err := p.get(ctx, r)
	if errors.Is(err, provider.ErrNotFound) {
		// Deleted between the two calls; the next attempt will insert it again.
		return provider.Instance{}, fmt.Errorf("gcp insert %s: already exists, then not found: retrying", r)
	}
	if err != nil {
		return provider.Instance{}, err
	}
	return p.owned(r, inst, proxyUID)
}

// owned returns inst if it carries proxyUID's label, and a permanent error otherwise.
func (p *Provider) owned(r ref, inst provider.Instance, proxyUID string) (provider.Instance, error) {
	if owner := inst.ProxyUID(); owner != proxyUID {
		return provider.Instance{}, provider.Permanent(fmt.Errorf(
			"gcp insert %s: the name is taken by an instance labelled %s=%q, not this Proxy", r, provider.LabelProxyUID, owner))
	}
	return inst, nil
}

// redact withholds an error message that quotes any of secrets: the startup script holds
// the proxy password's hash and the cloud-init data, which may hold secrets of its own, and
// errors end up in workflow history and logs. Lines are matched one by one because
// messages get trimmed, truncated and re-escaped on their way here; short lines ("fi") are
// skipped so that ordinary messages are not withheld by accident. A quoted line that is no
// secret (the script's "#!/bin/bash") withholds the message too: telling the script's
// lines apart is not worth the risk of telling them wrong.
func redact(err error, secrets ...[]byte) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	for _, secret := range secrets {
		for _, line := range strings.Split(string(secret), "\n") {
			line = strings.TrimSpace(line)
			if len(line) < 8 {
				continue
			}
			escaped, _ := json.Marshal(line)
			if strings.Contains(msg, line) || strings.Contains(msg, string(escaped[1:len(escaped)-1])) {
				return withKind(provider.Class(err), errors.New(
					"gcp insert failed; the API's message quoted the instance's startup script (its credentials or the cloud-init data) and was withheld"))
			}
		}
	}
	return err
}

// Get implements provider.Provider. An instance that is gone while its own firewall rule
// (one made before rules were shared) is still there is reported as
// provider.StateDeleting, not as provider.ErrNotFound: it is only gone once Delete has
// removed the rule too, and callers that wait for ErrNotFound after a delete keep calling
// Delete until then.
//
// For a live instance Get also makes sure its shared rule is there as wanted (at most
// once per ruleRecheck per rule), from the configuration the instance records: the
// workflow's wait for a new instance and the monitor's drift checks call Get, so a rule
// deleted by a sweep that raced a create, or edited or deleted by hand, is put back within
// minutes, and at once when the proxy turns unhealthy. Failing to put it back does not
// fail Get, whose answer (running, stopped, preempted) the caller needs all the same; it
// is logged, and the next Get tries again.
//
// The provider ID of an unused shared rule (as ListOwned reports one) is answered with
// that rule, still being deleted, until it is gone.
func (p *Provider) Get(ctx context.Context, providerID string) (provider.Instance, error) {
	if project, name, ok := parseRuleID(providerID); ok {
		return p.getUnusedRule(ctx, project, name)
	}
	r, err := parseProviderID(providerID)
	if err != nil {
		return provider.Instance{}, err
	}
	raw, err := p.getRaw(ctx, r)
	if err == nil {
		inst := toInstance(raw, r.project, r.zone)
		if inst.State == provider.StateProvisioning || inst.State == provider.StateRunning {
			p.keepRuleOf(ctx, r, raw)
		}
		return inst, nil
	}
	if !errors.Is(err, provider.ErrNotFound) {
		return provider.Instance{}, err
	}
	rule, owner, ferr := p.ruleOf(ctx, r)
	switch {
	case errors.Is(ferr, provider.ErrNotFound):
		return provider.Instance{}, err
	case ferr != nil:
		// Whether something is left cannot be told; not found would be a guess.
		return provider.Instance{}, ferr
	}
	return leftover(r, rule, owner), nil
}

// keepRuleOf puts back the shared rule of the live instance inst at r, if it has one and
// it was not checked lately (see Get).
func (p *Provider) keepRuleOf(ctx context.Context, r ref, inst *computepb.Instance) {
	c, ok := parseInstanceRule(inst, r.project)
	if !ok || p.ruleFresh(c) {
		return
	}
	if err := p.keepRule(ctx, c); err != nil {
		p.log.WarnContext(ctx, "gcp: the firewall rule of a live instance is missing or changed and could not be put back; the next check tries again",
			"instance", r.String(), "rule", firewallPath(c.project, c.name()), "error", err)
	}
}

// getUnusedRule answers Get for the provider ID of a shared rule: the rule, being
// deleted, while it is a shared rule of ours, else provider.ErrNotFound.
func (p *Provider) getUnusedRule(ctx context.Context, project, name string) (provider.Instance, error) {
	fw, err := p.getFirewall(ctx, project, name)
	if err != nil {
		return provider.Instance{}, err
	}
	installation, ok := parseSharedRuleOwner(fw.GetDescription())
	if !ok {
		return provider.Instance{}, fmt.Errorf("gcp firewall %s: not a shared rule of proxyfleet: %w", firewallPath(project, name), provider.ErrNotFound)
	}
	return unusedRule(project, installation, fw), nil
}

func (p *Provider) get(ctx context.Context, r ref) (provider.Instance, error) {
	inst, err := p.getRaw(ctx, r)
	if err != nil {
		return provider.Instance{}, err
	}
	return toInstance(inst, r.project, r.zone), nil
}

func (p *Provider) getRaw(ctx context.Context, r ref) (*computepb.Instance, error) {
	inst, err := p.client.Get(ctx, &computepb.GetInstanceRequest{Project: r.project, Zone: r.zone, Instance: r.name})
	if err != nil {
		return nil, fmt.Errorf("gcp get %s: %w", r, classify(callGet, err))
	}
	return inst, nil
}

// Delete implements provider.Provider: it deletes the instance, then its own firewall
// rule if it has one (an instance made before rules were shared). The rule goes last so
// that an instance whose delete failed is still reachable by its crawlers; removing it
// while the instance stops takes nothing from anyone. Neither operation is waited for: the
// caller polls Get until both are gone (Get reports an instance whose rule is left as
// deleting), and issues the delete again meanwhile. A shared rule stays: other instances
// may use it, and the sweep deletes it once none does (see ruleConfig).
//
// The provider ID of an unused shared rule (as ListOwned reports one to the sweep)
// deletes that rule, if it is still ours and still unused (see deleteSharedRule).
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	if project, name, ok := parseRuleID(providerID); ok {
		return p.deleteSharedRule(ctx, project, name)
	}
	r, err := parseProviderID(providerID)
	if err != nil {
		return err
	}
	if err := p.deleteInstance(ctx, r); err != nil {
		return err
	}
	return p.deleteFirewall(ctx, r)
}

// deleteInstance issues the delete of the instance at r; a missing instance is success.
func (p *Provider) deleteInstance(ctx context.Context, r ref) error {
	return deleteOnce(ctx, callDelete, r.String(), requestID(callDelete, r, ""), func(id string) (*compute.Operation, error) {
		return p.client.Delete(ctx, &computepb.DeleteInstanceRequest{
			Project: r.project, Zone: r.zone, Instance: r.name, RequestId: proto.String(id),
		})
	}, func() error { _, err := p.get(ctx, r); return err })
}

// deleteOnce issues a delete (an instance's or a firewall rule's) of what under id, a
// request ID derived from the call, and does not wait for it: the caller polls until the
// resource is gone and asks again if it stays. send issues the delete under an ID; get
// reads the resource (provider.ErrNotFound when it is gone).
func deleteOnce(ctx context.Context, c call, what, id string, send func(id string) (*compute.Operation, error), get func() error) error {
	for hop := 0; ; hop++ {
		op, err := send(id)
		if isNotReady(err) {
			// Another operation on the resource is still running, most often a delete
			// issued before (by an earlier attempt whose request ID GCE has forgotten, or
			// by someone else). That is a delete in progress, not a failure.
			return nil
		}
		if err = classify(c, err); err != nil {
			if errors.Is(err, provider.ErrNotFound) {
				return nil
			}
			return fmt.Errorf("gcp %s %s: %w", c, what, err)
		}
		if !op.Done() {
			return nil
		}
		// Done at once: an earlier delete under this request ID, recognised by GCE. If it
		// succeeded the resource is gone, unless one has been made under the name since.
		if len(op.Proto().GetError().GetErrors()) == 0 {
			err := get()
			if errors.Is(err, provider.ErrNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
		}
		// A failed earlier delete, or one that deleted a previous resource of this name:
		// sending its ID again would only fetch it again, so this attempt needs a new one.
		if hop == maxRequestIDHops {
			return fmt.Errorf(
				"gcp %s %s: the last %d deletes of this name did not take and GCE still remembers their request IDs; retrying once it forgets them (an hour or more)",
				c, what, maxRequestIDHops)
		}
		id = nextRequestID(id, op.Proto())
	}
}

// labelValue is GCP's label value syntax; checking it keeps the filter expression below
// from being bent by a quote in the installation ID or Proxy UID.
var labelValue = regexp.MustCompile(`^[-_a-z0-9]{1,63}$`)

// ownerFilter is the aggregatedList filter for owner. Each value is checked first: a quote
// in one would let it rewrite the expression and widen the list.
func ownerFilter(owner provider.Owner) (string, error) {
	if err := owner.Check(); err != nil {
		return "", err
	}
	if !labelValue.MatchString(owner.Installation) {
		return "", provider.Permanent(fmt.Errorf("installation %q is not a valid GCP label value", owner.Installation))
	}
	if owner.ProxyUID == "" {
		return fmt.Sprintf("labels.%s = %q", provider.LabelInstallation, owner.Installation), nil
	}
	if !labelValue.MatchString(owner.ProxyUID) {
		return "", provider.Permanent(fmt.Errorf("proxy UID %q is not a valid GCP label value", owner.ProxyUID))
	}
	// GCE ANDs parenthesised expressions written side by side.
	return fmt.Sprintf("(labels.%s = %q) (labels.%s = %q)",
		provider.LabelInstallation, owner.Installation, provider.LabelProxyUID, owner.ProxyUID), nil
}

// ListOwned implements provider.Provider. It searches owner.Project, or the default
// project, and asks the server for owner's resources alone: instances by their labels,
// per-instance firewall rules by their descriptions. Besides the instances it reports, as
// provider.StateDeleting, every instance that is gone while its own firewall rule (one
// made before rules were shared) is left (a delete cut short between the two), so that
// the sweeper, which deletes what this returns for Proxies that no longer exist, removes
// leaked rules too.
//
// Listing a whole installation (owner.ProxyUID empty, as the sweeper does) also reports
// every shared rule of the installation that no listed instance uses, as an instance being
// deleted whose Proxy UID label is sharedRuleUID, and whose age is the rule's: the sweeper
// deletes it like an orphan once it is older than its minimum age. Shared rules are no
// Proxy's, so one Proxy's list never shows them.
func (p *Provider) ListOwned(ctx context.Context, owner provider.Owner) ([]provider.Instance, error) {
	filter, err := ownerFilter(owner)
	if err != nil {
		return nil, err
	}
	project := cmp.Or(owner.Project, p.defaultProject)
	// Rules first: Create makes a rule before its instance, so the instance of a rule
	// listed here is in the instance list read after, or is made after it (the Get below
	// sees it then). A rule whose instance is not inserted yet is reported like a leftover;
	// the sweeper's minimum age spares it, as it spares a young instance. The same order
	// keeps a shared rule whose first user is being made from looking unused for long.
	rules, err := p.listOwnedRules(ctx, project, owner)
	if err != nil {
		return nil, err
	}
	var shared []*computepb.Firewall
	if owner.ProxyUID == "" {
		if shared, err = p.listSharedRules(ctx, project, owner.Installation); err != nil {
			return nil, err
		}
	}
	out, used, err := p.listOwnedInstances(ctx, project, filter, owner)
	if err != nil {
		return nil, err
	}
	listed := make(map[ref]bool, len(out))
	for _, inst := range out {
		if r, err := parseProviderID(inst.ProviderID); err == nil {
			listed[r] = true
		}
	}
	for _, o := range rules {
		r := ref{project: project, zone: o.owner.zone, name: o.rule.GetName()}
		if listed[r] {
			continue
		}
		// The instance list shows only instances labelled for owner. One of that name that
		// is not (made by hand), or one made since the list, makes the rule no leftover,
		// and deleting through the rule's provider ID would delete that instance.
		_, err := p.get(ctx, r)
		if err == nil {
			continue
		}
		if !errors.Is(err, provider.ErrNotFound) {
			return nil, err
		}
		out = append(out, leftover(r, o.rule, o.owner))
	}
	for _, fw := range shared {
		if !used[fw.GetName()] {
			out = append(out, unusedRule(project, owner.Installation, fw))
		}
	}
	return out, nil
}

// listOwnedInstances lists the instances in project matching filter, checked against
// owner, and the shared rules they use: those their tags or labels name. Every instance
// the server returned counts as a user, owner's or not, since keeping a rule too long
// costs nothing but a quota slot.
func (p *Provider) listOwnedInstances(ctx context.Context, project, filter string, owner provider.Owner) ([]provider.Instance, map[string]bool, error) {
	it := p.client.AggregatedList(ctx, &computepb.AggregatedListInstancesRequest{
		Project: project,
		Filter:  proto.String(filter),
	})
	var out []provider.Instance
	used := map[string]bool{}
	for {
		pair, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, used, nil
		}
		if err != nil {
			return nil, nil, fmt.Errorf("gcp list instances in project %s: %w", project, classify(callList, err))
		}
		scopeZone := strings.TrimPrefix(pair.Key, "zones/")
		for _, inst := range pair.Value.GetInstances() {
			for _, tag := range inst.GetTags().GetItems() {
				used[tag] = true
			}
			if name := inst.GetLabels()[labelFirewall]; name != "" {
				used[name] = true
			}
			// The filter is the server's; the sweeper deletes what this returns, so the
			// labels are checked again here rather than trusted.
			if !owner.Owns(inst.GetLabels()) {
				continue
			}
			out = append(out, toInstance(inst, project, scopeZone))
		}
	}
}

// toInstance maps a VM to the provider's view. zone is the fallback for a response that
// omits the instance's own zone URL.
func toInstance(inst *computepb.Instance, project, zone string) provider.Instance {
	if z := inst.GetZone(); z != "" {
		zone = z[strings.LastIndex(z, "/")+1:]
	}
	r := ref{project: project, zone: zone, name: inst.GetName()}
	out := provider.Instance{
		Name:       r.name,
		ProviderID: r.String(),
		Labels:     maps.Clone(inst.GetLabels()),
	}
	if t, err := time.Parse(time.RFC3339, inst.GetCreationTimestamp()); err == nil {
		out.CreatedAt = t
	}
	ip := address(inst)
	out.State = stateOf(inst.GetStatus(), ip)
	if out.State == provider.StateRunning {
		out.IP = ip
	}
	out.Preempted = preempted(inst)
	return out
}

// preempted reports whether a VM was taken back by Compute Engine: a Spot VM on its way to
// or in TERMINATED. The provider never stops its instances (it deletes them, and a deleted
// instance is retired before it stops), so a Spot VM stops only when preempted, or when a
// person stops it by hand, which the workflow treats alike.
func preempted(inst *computepb.Instance) bool {
	if inst.GetScheduling().GetProvisioningModel() != computepb.Scheduling_SPOT.String() {
		return false
	}
	switch inst.GetStatus() {
	case computepb.Instance_STOPPING.String(), computepb.Instance_TERMINATED.String(), computepb.Instance_STOPPED.String():
		return true
	}
	return false
}

// stateOf maps a VM status. RUNNING without its address (see address) cannot carry
// traffic yet. Unknown statuses count as Stopped: the workflow replaces a stopped instance, which is
// the safe move for cattle whatever the new status means.
func stateOf(status, ip string) provider.State {
	switch status {
	case computepb.Instance_PROVISIONING.String(), computepb.Instance_STAGING.String(),
		computepb.Instance_REPAIRING.String():
		return provider.StateProvisioning
	case computepb.Instance_RUNNING.String():
		if ip == "" {
			return provider.StateProvisioning
		}
		return provider.StateRunning
	default:
		// STOPPING, STOPPED, SUSPENDING, SUSPENDED, TERMINATED and anything newer.
		return provider.StateStopped
	}
}

// address is where crawlers reach the instance: its external address if it has an access
// config (Create gives it exactly one, unless spec.gcp.externalIP is false), else its
// internal one. An instance with an access config but no address yet has none: its
// internal address would do for crawlers inside the VPC only, and those outside would be
// handed one they cannot reach.
func address(inst *computepb.Instance) string {
	external := false
	for _, nic := range inst.GetNetworkInterfaces() {
		for _, ac := range nic.GetAccessConfigs() {
			external = true
			if ip := ac.GetNatIP(); ip != "" {
				return ip
			}
		}
	}
	if external {
		return ""
	}
	for _, nic := range inst.GetNetworkInterfaces() {
		if ip := nic.GetNetworkIP(); ip != "" {
			return ip
		}
	}
	return ""
}
