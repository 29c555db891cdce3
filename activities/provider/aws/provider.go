package aws

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// Machine is an instance's shape on EC2: spec.aws with its defaults applied.
type Machine struct {
	// Region is where the instance runs, and the first part of its provider ID.
	Region string
	// InstanceType such as t3.micro. AMI is an image ID (ami-…) or an SSM parameter that
	// names one, such as Debian's /aws/service/debian/release/12/latest/amd64, which EC2
	// resolves at launch (so every new instance boots the image current then).
	InstanceType, AMI string
	// SubnetID is the subnet of the instance's interface; empty is the default subnet.
	SubnetID string
	// PublicIP gives the instance a public address, which the Proxy then serves on.
	PublicIP bool
	// SecurityGroupIDs are groups of the instance's interface beside the shared one.
	SecurityGroupIDs []string
	// AllowedSourceRanges are the networks crawlers connect from: the instance's shared
	// security group admits the proxy port from these alone. Required with a public
	// address.
	AllowedSourceRanges []string
	// InstanceProfile is an IAM instance profile's name or ARN; empty gives none.
	InstanceProfile string
	// Spot runs a one-time Spot instance, terminated when EC2 takes it back.
	Spot bool
	// Tags are added beside the ownership tags, which they cannot override.
	Tags map[string]string
}

// MachineOf is spec.aws as a Machine, with the API's defaults for what the spec leaves
// empty (a spec built without the API server has none filled in).
func MachineOf(spec v1alpha1.ProxySpec) (Machine, error) {
	a := spec.AWS
	if a == nil {
		return Machine{}, errors.New("provider aws needs the spec.aws block")
	}
	if a.Region == "" {
		return Machine{}, errors.New("spec.aws.region is required")
	}
	m := Machine{
		Region:          a.Region,
		InstanceType:    cmp.Or(a.InstanceType, v1alpha1.DefaultAWSInstanceType),
		AMI:             cmp.Or(a.AMI, v1alpha1.DefaultAWSAMI),
		SubnetID:        a.SubnetID,
		PublicIP:        a.AssociatePublicIP == nil || *a.AssociatePublicIP,
		InstanceProfile: a.InstanceProfile,
		Spot:            a.Spot,
		Tags:            maps.Clone(a.Tags),
	}
	for _, g := range a.SecurityGroupIDs {
		m.SecurityGroupIDs = append(m.SecurityGroupIDs, string(g))
	}
	for _, r := range a.AllowedSourceRanges {
		m.AllowedSourceRanges = append(m.AllowedSourceRanges, string(r))
	}
	return m, nil
}

// Config configures a Provider.
type Config struct {
	// AWS is the SDK's configuration (credentials from the default chain, retryer,
	// endpoint); its region is the default one.
	AWS aws.Config
	// Regions are where a ListOwned without an Owner.Project (the sweep of orphans, a
	// cleanup run) looks, besides the default region. A ListOwned for an Owner.Project
	// looks in that region alone.
	Regions []string
	// MachineOf turns a Proxy's spec into its instance's shape; nil is MachineOf, the
	// spec's own aws block (tests give a fixed shape).
	MachineOf func(v1alpha1.ProxySpec) (Machine, error)
	// Now is the clock (a group's creation tag, its checks); nil is time.Now.
	Now func() time.Time
	// Logger receives what Get cannot report in its answer: a shared security group it
	// found drifted and could not put back. Nil is slog.Default().
	Logger *slog.Logger
}

// Provider runs Proxy instances on EC2. An instance is found by its name, a tag, and made
// under a client token of its name and request: so a retried or replayed create never
// makes a second instance, and an instance whose create was cut short is still found and
// deleted.
type Provider struct {
	cfg Config

	mu      sync.Mutex
	clients map[string]*ec2.Client
	checked map[string]time.Time // shared groups by "<region>/<ID>": when Get last read them
	finders map[string]*finds    // Get's coalesced lookups, by region
}

// Tags the provider puts on every instance beside the ownership labels.
const (
	// tagInstance is the workflow's name for the instance (EC2 names it by an ID of its
	// own): how Get, Delete and ListOwned find it and say its provider ID.
	tagInstance = "proxyfleet-instance"
	tagName     = "Name"
)

// New returns a Provider for cfg.
func New(cfg Config) (*Provider, error) {
	if cfg.MachineOf == nil {
		cfg.MachineOf = MachineOf
	}
	if cfg.AWS.Region == "" {
		return nil, errors.New("aws: the SDK configuration has no region")
	}
	// RunInstances' body carries the user data (the password's hash, the cloud-init
	// data): whatever the configuration asked, the SDK never logs request or response
	// bodies.
	cfg.AWS.ClientLogMode &^= aws.LogRequestWithBody | aws.LogResponseWithBody
	// The default region is always swept (Proxies that name no other run there), and
	// each region once, however often it was named.
	regions := []string{cfg.AWS.Region}
	for _, r := range cfg.Regions {
		if r = strings.TrimSpace(r); r != "" && !slices.Contains(regions, r) {
			regions = append(regions, r)
		}
	}
	cfg.Regions = regions
	return &Provider{cfg: cfg, clients: map[string]*ec2.Client{}, checked: map[string]time.Time{}, finders: map[string]*finds{}}, nil
}

// client is the EC2 client of region, made once.
func (p *Provider) client(region string) *ec2.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[region]; c != nil {
		return c
	}
	c := ec2.NewFromConfig(p.cfg.AWS, func(o *ec2.Options) { o.Region = region })
	p.clients[region] = c
	return c
}

// clientToken is RunInstances' idempotency token for the instance name asked for with in:
// the name and a hash of everything else asked (hashed whole when that is longer than
// EC2's 64 characters). A retried or replayed create asks the same and gets the instance
// the first call made. EC2 keeps a token for a day after its instance is terminated,
// which the name alone would make a trap: a name used again after its instance went
// (by a run that started without state) would be answered with the dead instance, or
// refused outright when anything else differs (its security group made again since).
// With the request in the token, a different request is a new instance, and the same
// one is answered with the dead instance, which the workflow takes for lost and moves on.
func clientToken(name string, in *ec2.RunInstancesInput) string {
	c := *in
	c.ClientToken = nil
	b, err := json.Marshal(&c)
	if err != nil {
		// RunInstancesInput holds only marshalable fields; this cannot happen.
		panic(fmt.Sprintf("aws: hash a RunInstances request: %v", err))
	}
	sum := sha256.Sum256(append([]byte(name+"\x00"), b...))
	if t := name + "-" + hex.EncodeToString(sum[:8]); len(t) <= 64 {
		return t
	}
	return hex.EncodeToString(sum[:])
}

// ProviderID is "<region>/<instance name>": known before EC2 assigns the instance ID.
// Create reports a longer form, "<region>/<name>/<EC2 instance ID>/<launch time in Unix
// seconds>", which Get and Delete accept as well: with it they tell an instance EC2's
// eventually consistent lists do not show yet from one that is gone (see listLag).
func (p *Provider) ProviderID(req provider.CreateRequest) string {
	region := p.cfg.AWS.Region
	if m, err := p.cfg.MachineOf(req.Spec); err == nil && m.Region != "" {
		region = m.Region
	}
	return region + "/" + req.Name
}

func (p *Provider) log() *slog.Logger {
	if p.cfg.Logger != nil {
		return p.cfg.Logger
	}
	return slog.Default()
}

func (p *Provider) now() time.Time {
	if p.cfg.Now != nil {
		return p.cfg.Now()
	}
	return time.Now()
}

// parseGroupID reads the provider ID of a shared group ("<region>/sg/<group ID>").
func parseGroupID(providerID string) (region, id string, ok bool) {
	region, rest, _ := strings.Cut(providerID, "/")
	id, ok = strings.CutPrefix(rest, groupIDPrefix)
	return region, id, ok && region != "" && id != ""
}

func parseID(providerID string) (instanceID, error) {
	parts := strings.Split(providerID, "/")
	var id instanceID
	switch len(parts) {
	case 2:
		id = instanceID{region: parts[0], name: parts[1]}
	case 4:
		unix, err := strconv.ParseInt(parts[3], 10, 64)
		if err == nil && strings.HasPrefix(parts[2], "i-") {
			id = instanceID{region: parts[0], name: parts[1], ec2ID: parts[2], launched: time.Unix(unix, 0)}
		}
	}
	if id.region == "" || id.name == "" {
		return instanceID{}, provider.Permanent(fmt.Errorf("aws: provider ID %q is not <region>/<instance name>[/<instance ID>/<launch time>]", providerID))
	}
	return id, nil
}

// instanceID is what a provider ID says of an instance: its region and name, and, in
// the form Create reports, EC2's ID for it and its launch time.
type instanceID struct {
	region, name string
	ec2ID        string
	launched     time.Time
}

// listLag is how long after its launch an instance EC2 does not list is taken for one
// its eventually consistent lists have yet to show, rather than one that is gone. EC2's
// lag is seconds; a terminated instance stays listed for about an hour, so one gone
// from the lists was launched far longer ago than this.
const listLag = 10 * time.Minute

// fresh reports whether id names an instance launched within listLag of now, EC2's
// time when known (the worker's clock may be off; launch times are EC2's). A launch
// time in the future beyond a minute's slack is not believed.
func (p *Provider) fresh(id instanceID, now time.Time) bool {
	if now.IsZero() {
		now = p.now()
	}
	age := now.Sub(id.launched)
	return id.ec2ID != "" && age > -time.Minute && age < listLag
}

// errNotListedYet is the transient answer for a fresh instance EC2 does not list yet.
func errNotListedYet(id instanceID) error {
	return fmt.Errorf("instance %s (%s) is not listed by EC2 yet (its lists are eventually consistent): try again", id.name, id.ec2ID)
}

// Create runs the instance, or returns the one an earlier call with the same name ran.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	m, err := p.cfg.MachineOf(req.Spec)
	if err != nil {
		return provider.Instance{}, provider.Permanent(err)
	}
	script, err := squid.InstanceScript(req.Port, req.Credentials, req.Spec.Egress, req.CloudInit)
	if err != nil {
		return provider.Instance{}, provider.Permanent(err)
	}
	// An earlier attempt may have made it (its answer lost with a worker): return that one
	// as it is, rather than ask again with parameters that may differ now (a security
	// group made again since), which would be another token and a second instance.
	if l, err := p.lookup(ctx, m.Region, req.Name); err != nil || l.live != nil {
		if err != nil {
			return provider.Instance{}, err
		}
		return p.created(m.Region, *l.live, req.Port), nil
	}
	vpc, err := p.vpcOf(ctx, m.Region, m.SubnetID)
	if err != nil {
		return provider.Instance{}, err
	}
	gc, err := groupConfigFor(req, m, vpc)
	if err != nil {
		return provider.Instance{}, err
	}
	var shared string // the shared group's ID, if the instance has one
	if gc != nil {
		if shared, err = p.ensureGroup(ctx, m.Region, *gc); err != nil {
			return provider.Instance{}, err
		}
		m.SecurityGroupIDs = append(slices.Clone(m.SecurityGroupIDs), shared)
	}
	in, err := runInput(req, m, script)
	if err != nil {
		return provider.Instance{}, err
	}
	out, err := p.client(m.Region).RunInstances(ctx, in)
	if shared != "" && isCode(err, "InvalidGroup.NotFound") && strings.Contains(errorMessage(err), shared) {
		// The sweep deleted the shared group between its check and this call: the
		// retry makes it again. (A group of the spec's own that does not exist is the
		// request's fault, and permanent: classify says so.)
		return provider.Instance{}, fmt.Errorf("run instance %s: its security group went meanwhile: %w", req.Name, err)
	}
	if err != nil {
		return provider.Instance{}, classify("run instance "+req.Name, err)
	}
	if len(out.Instances) != 1 {
		return provider.Instance{}, fmt.Errorf("run instance %s: EC2 answered %d instances", req.Name, len(out.Instances))
	}
	// A token of an instance terminated since is answered with that instance: reported
	// as it is (being deleted), so the workflow takes it for lost and uses another name.
	return p.created(m.Region, out.Instances[0], req.Port), nil
}

// created is what Create reports of in: instanceOf with the provider ID's long form.
func (p *Provider) created(region string, in types.Instance, port int32) provider.Instance {
	out := p.instanceOf(region, in, port)
	launched := aws.ToTime(in.LaunchTime)
	if launched.IsZero() {
		launched = p.now()
	}
	out.ProviderID = fmt.Sprintf("%s/%s/%s/%d", region, out.Name, aws.ToString(in.InstanceId), launched.Unix())
	return out
}

// maxUserData is EC2's limit on user data before base64.
const maxUserData = 16 * 1024

// runInput is the RunInstances request for req: one instance, IMDSv2 required with a hop
// limit of 1 (so a container on the instance cannot reach the metadata service), no
// instance profile unless the machine names one, the ownership labels as tags.
func runInput(req provider.CreateRequest, m Machine, script []byte) (*ec2.RunInstancesInput, error) {
	if len(script) > maxUserData {
		return nil, provider.Permanent(fmt.Errorf("the instance's boot script is %d bytes, over EC2's %d for user data: shorten spec.cloudInit", len(script), maxUserData))
	}
	tags := map[string]string{}
	maps.Copy(tags, m.Tags)
	maps.Copy(tags, req.Labels())
	tags[tagInstance], tags[tagName] = req.Name, req.Name
	var ec2Tags []types.Tag
	for _, k := range sortedKeys(tags) {
		ec2Tags = append(ec2Tags, types.Tag{Key: aws.String(k), Value: aws.String(tags[k])})
	}
	nic := types.InstanceNetworkInterfaceSpecification{
		DeviceIndex: aws.Int32(0), AssociatePublicIpAddress: aws.Bool(m.PublicIP),
		DeleteOnTermination: aws.Bool(true), Groups: m.SecurityGroupIDs,
	}
	if m.SubnetID != "" {
		nic.SubnetId = aws.String(m.SubnetID)
	}
	image := m.AMI
	if strings.HasPrefix(image, "/") {
		image = "resolve:ssm:" + image
	}
	in := &ec2.RunInstancesInput{
		ImageId: aws.String(image), InstanceType: types.InstanceType(m.InstanceType),
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		UserData: aws.String(base64.StdEncoding.EncodeToString(script)),
		MetadataOptions: &types.InstanceMetadataOptionsRequest{
			HttpTokens: types.HttpTokensStateRequired, HttpPutResponseHopLimit: aws.Int32(1),
			HttpEndpoint: types.InstanceMetadataEndpointStateEnabled,
		},
		NetworkInterfaces: []types.InstanceNetworkInterfaceSpecification{nic},
		TagSpecifications: []types.TagSpecification{
			{ResourceType: types.ResourceTypeInstance, Tags: ec2Tags},
			{ResourceType: types.ResourceTypeVolume, Tags: ec2Tags},
		},
	}
	if m.InstanceProfile != "" {
		in.IamInstanceProfile = &types.IamInstanceProfileSpecification{}
		if strings.HasPrefix(m.InstanceProfile, "arn:") {
			in.IamInstanceProfile.Arn = aws.String(m.InstanceProfile)
		} else {
			in.IamInstanceProfile.Name = aws.String(m.InstanceProfile)
		}
	}
	if m.Spot {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{SpotInstanceType: types.SpotInstanceTypeOneTime,
				InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate}}
	}
	in.ClientToken = aws.String(clientToken(req.Name, in))
	return in, nil
}

// lookup is what EC2 lists of the instance called name in region, on its own (Create and
// Delete; Get's lookups go in batches, see findBatched).
func (p *Provider) lookup(ctx context.Context, region, name string) (listed, error) {
	got, err := p.describeNames(ctx, region, []string{name})
	if err != nil {
		return listed{}, err
	}
	return got[name], nil
}

// listed is what EC2 lists of one instance name: the instance that is not terminated, if
// any; else the newest terminated one (EC2 lists a terminated instance, with why, for
// about an hour); and EC2's time when it answered.
type listed struct {
	live, gone *types.Instance
	at         time.Time
}

// spotTermination is the state reason of an instance EC2 took back.
const spotTermination = "Server.SpotInstanceTermination"

// liveStates are every state but terminated: EC2 lists a terminated instance for about an
// hour, and it is gone for the provider's purposes.
var liveStates = []string{"pending", "running", "shutting-down", "stopping", "stopped"}

// Get returns the instance; a terminated one, or none, is provider.ErrNotFound (and
// provider.ErrPreempted when EC2 took a Spot instance back). Of a live instance it also
// puts its shared security groups back when they drifted (checkGroups): the workflow's
// wait for a new instance and the monitor's drift checks call it.
//
// The provider ID of an unused shared group (as ListOwned reports one to the sweep) is
// answered with that group, being deleted, until it is gone.
func (p *Provider) Get(ctx context.Context, providerID string) (provider.Instance, error) {
	if region, id, ok := parseGroupID(providerID); ok {
		g, err := p.describeGroup(ctx, region, id)
		if err != nil {
			return provider.Instance{}, err
		}
		if g == nil {
			return provider.Instance{}, fmt.Errorf("security group %s: %w", providerID, provider.ErrNotFound)
		}
		return unusedGroup(region, tagOf(g.Tags, provider.LabelInstallation), *g), nil
	}
	id, err := parseID(providerID)
	if err != nil {
		return provider.Instance{}, err
	}
	region, name := id.region, id.name
	l, err := p.findBatched(ctx, region, name)
	if err != nil {
		return provider.Instance{}, err
	}
	in := l.live
	if in == nil {
		switch gone := l.gone; {
		case gone != nil && gone.StateReason != nil && aws.ToString(gone.StateReason.Code) == spotTermination:
			return provider.Instance{}, fmt.Errorf("instance %s: %w", providerID, provider.ErrPreempted)
		case gone == nil && p.fresh(id, l.at):
			return provider.Instance{}, errNotListedYet(id)
		}
		return provider.Instance{}, fmt.Errorf("instance %s: %w", providerID, provider.ErrNotFound)
	}
	if st := in.State; st != nil && (st.Name == types.InstanceStateNamePending || st.Name == types.InstanceStateNameRunning) {
		p.checkGroups(ctx, region, *in)
	}
	return p.instanceOf(region, *in, 0), nil
}

// Delete terminates the instance; one that is gone already is done. The provider ID of an
// unused shared group deletes that group, if it is still ours and still unused.
func (p *Provider) Delete(ctx context.Context, providerID string) error {
	if region, id, ok := parseGroupID(providerID); ok {
		return p.deleteGroup(ctx, region, id)
	}
	id, err := parseID(providerID)
	if err != nil {
		return err
	}
	region, name := id.region, id.name
	l, err := p.lookup(ctx, region, name)
	if err != nil {
		return err
	}
	in := l.live
	if in == nil {
		if l.gone != nil || !p.fresh(id, l.at) {
			return nil
		}
		// Launched moments ago and not listed yet: terminate it by its ID, which EC2
		// may not know everywhere yet either (then the delete is tried again).
		_, err := p.client(region).TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{id.ec2ID}})
		if isCode(err, "InvalidInstanceID.NotFound") {
			return errNotListedYet(id)
		}
		return classify("terminate instance "+name, err)
	}
	if in.State != nil && in.State.Name == types.InstanceStateNameShuttingDown {
		return nil // terminated already; Get says Deleting until it is gone
	}
	_, err = p.client(region).TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{aws.ToString(in.InstanceId)}})
	if err != nil && !isCode(err, "InvalidInstanceID.NotFound") {
		return classify("terminate instance "+name, err)
	}
	return nil
}

// ListOwned lists owner's instances in owner.Project's region, or else in the default
// region and every one of Config.Regions, by tag filters a page at a time,
// each checked again with Owner.Owns. Listing a whole installation (as the sweeper does)
// also reports each of its shared security groups that no listed instance uses (see
// unusedGroup).
func (p *Provider) ListOwned(ctx context.Context, owner provider.Owner) ([]provider.Instance, error) {
	if err := owner.Check(); err != nil {
		return nil, err
	}
	regions := p.cfg.Regions
	if owner.Project != "" {
		regions = []string{owner.Project}
	}
	var out []provider.Instance
	for _, region := range regions {
		list, err := p.listRegion(ctx, region, owner)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", region, err)
		}
		out = append(out, list...)
	}
	return out, nil
}

// listRegion is ListOwned in one region. Groups are listed first: Create makes a group
// before its instance, so a group's first user is in the instance list read after, or
// made after it (and the sweep's minimum age spares a group that young).
func (p *Provider) listRegion(ctx context.Context, region string, owner provider.Owner) ([]provider.Instance, error) {
	var groups []types.SecurityGroup
	if owner.ProxyUID == "" {
		var err error
		if groups, err = p.listGroups(ctx, region, owner.Installation); err != nil {
			return nil, err
		}
	}
	used := map[string]bool{}
	filters := []types.Filter{{Name: aws.String("instance-state-name"), Values: liveStates}}
	sel := owner.Selector()
	for _, k := range sortedKeys(sel) {
		filters = append(filters, types.Filter{Name: aws.String("tag:" + k), Values: []string{sel[k]}})
	}
	pages := ec2.NewDescribeInstancesPaginator(p.client(region), &ec2.DescribeInstancesInput{Filters: filters, MaxResults: aws.Int32(1000)})
	var out []provider.Instance
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify("list instances", err)
		}
		for _, r := range page.Reservations {
			for _, in := range r.Instances {
				if in.State != nil && in.State.Name == types.InstanceStateNameTerminated {
					continue // gone since the filter was applied
				}
				for _, g := range in.SecurityGroups {
					used[aws.ToString(g.GroupId)] = true
				}
				inst := p.instanceOf(region, in, 0)
				if tagOf(in.Tags, tagInstance) != "" && owner.Owns(inst.Labels) {
					out = append(out, inst)
				}
			}
		}
	}
	for _, g := range groups {
		if !used[aws.ToString(g.GroupId)] {
			out = append(out, unusedGroup(region, owner.Installation, g))
		}
	}
	return out, nil
}

// instanceOf is what the provider reports of an EC2 instance: Running once it has the
// address crawlers connect to (the public one when it has one), Stopped when stopped or
// taken back (Preempted for a Spot interruption), Deleting while shutting down.
func (p *Provider) instanceOf(region string, in types.Instance, port int32) provider.Instance {
	labels := map[string]string{}
	for _, t := range in.Tags {
		if k := aws.ToString(t.Key); strings.HasPrefix(k, "proxyfleet-") {
			labels[k] = aws.ToString(t.Value)
		}
	}
	delete(labels, tagInstance)
	out := provider.Instance{
		Name:       tagOf(in.Tags, tagInstance),
		ProviderID: region + "/" + tagOf(in.Tags, tagInstance),
		Port:       port,
		CreatedAt:  aws.ToTime(in.LaunchTime),
		Labels:     labels,
		State:      provider.StateProvisioning,
	}
	ip := aws.ToString(in.PublicIpAddress)
	if ip == "" {
		ip = aws.ToString(in.PrivateIpAddress)
	}
	var name types.InstanceStateName
	if in.State != nil {
		name = in.State.Name
	}
	switch name {
	case types.InstanceStateNameRunning:
		if ip != "" {
			out.State, out.IP = provider.StateRunning, ip
		}
	case types.InstanceStateNameShuttingDown, types.InstanceStateNameTerminated:
		out.State = provider.StateDeleting
	case types.InstanceStateNameStopping, types.InstanceStateNameStopped:
		out.State = provider.StateStopped
	}
	if in.StateReason != nil && aws.ToString(in.StateReason.Code) == spotTermination {
		out.State, out.Preempted, out.IP = provider.StateStopped, true, ""
	}
	return out
}

func tagOf(tags []types.Tag, key string) string {
	for _, t := range tags {
		if aws.ToString(t.Key) == key {
			return aws.ToString(t.Value)
		}
	}
	return ""
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
