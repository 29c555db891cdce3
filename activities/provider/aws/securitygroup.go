package aws

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/proxyfleet/proxyfleet/activities/provider"
)

// A security group per configuration: the instances of an installation with the same VPC,
// proxy port and allowed source ranges share one group that admits that port from those
// ranges alone, so a thousand proxies cost one group, not a thousand. Its name is a hash
// of the configuration: every worker finds the same group without asking anyone.

// groupConfig is what a shared group admits.
type groupConfig struct {
	installation string
	// vpc is the VPC of the instances' subnet ("" for the default VPC).
	vpc    string
	port   int32
	ranges []string // CIDRs (IPv4 and IPv6), normalized and sorted
}

// Tags on a shared group: the ownership labels of the installation, the configuration's
// name, which the sweep lists groups by, and when it was made (EC2 keeps no creation time
// for a group, and the sweep spares the young).
const (
	tagGroupConfig  = "proxyfleet-group-config"
	tagGroupCreated = "proxyfleet-created"
)

// Tags that record a group's configuration, so that Get, which has no spec at hand, can
// put a drifted group back: the VPC ("" for the default one), the port, and the ranges,
// comma-separated, in pieces of at most 256 characters (a tag value's limit) tagged
// proxyfleet-ranges-0, -1, …. The group's name is a hash of them all: tags edited by hand
// no longer match it, and are then not trusted (see configOf).
const (
	tagGroupVPC    = "proxyfleet-vpc"
	tagGroupPort   = "proxyfleet-port"
	tagGroupRanges = "proxyfleet-ranges-"
	maxTagValue    = 256
)

// configTags are the tags that record c.
func configTags(c groupConfig) []types.Tag {
	tags := []types.Tag{
		{Key: aws.String(tagGroupVPC), Value: aws.String(c.vpc)},
		{Key: aws.String(tagGroupPort), Value: aws.String(strconv.Itoa(int(c.port)))},
	}
	joined := strings.Join(c.ranges, ",")
	for i := 0; len(joined) > 0; i++ {
		piece := joined
		if len(piece) > maxTagValue {
			cut := strings.LastIndex(piece[:maxTagValue+1], ",")
			piece = piece[:cut]
		}
		tags = append(tags, types.Tag{Key: aws.String(tagGroupRanges + strconv.Itoa(i)), Value: aws.String(piece)})
		joined = strings.TrimPrefix(joined[len(piece):], ",")
	}
	return tags
}

// configOf reads the configuration g's tags record; ok is false when g is not a shared
// group of ours or its tags do not hash to its name (edited by hand: not to be trusted).
func configOf(g types.SecurityGroup) (c groupConfig, ok bool) {
	port, err := strconv.Atoi(tagOf(g.Tags, tagGroupPort))
	if err != nil || tagOf(g.Tags, tagGroupConfig) == "" {
		return groupConfig{}, false
	}
	c = groupConfig{installation: tagOf(g.Tags, provider.LabelInstallation), vpc: tagOf(g.Tags, tagGroupVPC), port: int32(port)}
	for i := 0; ; i++ {
		piece := tagOf(g.Tags, tagGroupRanges+strconv.Itoa(i))
		if piece == "" {
			break
		}
		c.ranges = append(c.ranges, strings.Split(piece, ",")...)
	}
	return c, c.name() == aws.ToString(g.GroupName) && c.name() == tagOf(g.Tags, tagGroupConfig)
}

// sharedGroupUID stands in the Proxy UID label of an unused shared group as ListOwned
// reports it to the sweep. It is no Kubernetes UID, so it never belongs to a live Proxy,
// and the sweep treats the group like an instance whose Proxy is gone, minimum age
// included: it deletes it through Delete, which deletes it only if no instance uses it.
const sharedGroupUID = "shared-security-group"

// groupIDPrefix marks the provider ID of a shared group: "<region>/sg/<group ID>".
const groupIDPrefix = "sg/"

func (c groupConfig) name() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s", c.installation, c.vpc, c.port, strings.Join(c.ranges, ","))
	return "proxyfleet-" + strconv.Itoa(int(c.port)) + "-" + hex.EncodeToString(h.Sum(nil))[:16]
}

// rules are the group's ingress rules, as the provider compares them.
func (c groupConfig) rules() []string {
	out := make([]string, 0, len(c.ranges))
	for _, r := range c.ranges {
		out = append(out, ruleKey(c.port, r))
	}
	return out
}

func ruleKey(port int32, cidr string) string { return "tcp:" + strconv.Itoa(int(port)) + ":" + cidr }

// groupConfigFor is the shared group req's instance needs, or nil when the machine
// admits every source by groups of its own (no allowed ranges, no public address).
func groupConfigFor(req provider.CreateRequest, m Machine, vpc string) (*groupConfig, error) {
	if len(m.AllowedSourceRanges) == 0 {
		if m.PublicIP {
			return nil, provider.Permanent(errors.New(
				"an instance with a public address needs allowed source ranges: list the networks crawlers connect from"))
		}
		return nil, nil
	}
	c := &groupConfig{installation: req.Installation, vpc: vpc, port: req.Port}
	for i, r := range m.AllowedSourceRanges {
		p, err := netip.ParsePrefix(r)
		if err != nil {
			return nil, provider.Permanent(fmt.Errorf("allowed source range %d %q: not a CIDR", i, r))
		}
		c.ranges = append(c.ranges, p.Masked().String())
	}
	slices.Sort(c.ranges)
	c.ranges = slices.Compact(c.ranges)
	return c, nil
}

// vpcOf is the VPC of subnet ("" for the default subnet, whose VPC is the default one).
func (p *Provider) vpcOf(ctx context.Context, region, subnet string) (string, error) {
	if subnet == "" {
		return "", nil
	}
	out, err := p.client(region).DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{subnet}})
	if err != nil {
		return "", classify("describe subnet "+subnet, err)
	}
	if len(out.Subnets) != 1 {
		return "", provider.Permanent(fmt.Errorf("subnet %s: EC2 knows no such subnet", subnet))
	}
	return aws.ToString(out.Subnets[0].VpcId), nil
}

// ensureGroup finds or makes c's group, puts its ingress back to c's rules when it
// drifted (a rule added or removed by hand), and returns its ID.
func (p *Provider) ensureGroup(ctx context.Context, region string, c groupConfig) (string, error) {
	g, err := p.findGroup(ctx, region, c)
	if err != nil {
		return "", err
	}
	if g == nil {
		g, err = p.createGroup(ctx, region, c)
		if err != nil {
			return "", err
		}
	}
	if tagOf(g.Tags, provider.LabelInstallation) != c.installation {
		return "", provider.Permanent(fmt.Errorf("security group %s (%s) is not this installation's: rename or delete it",
			c.name(), aws.ToString(g.GroupId)))
	}
	return aws.ToString(g.GroupId), p.keepIngress(ctx, region, g, c)
}

func (p *Provider) findGroup(ctx context.Context, region string, c groupConfig) (*types.SecurityGroup, error) {
	filters := []types.Filter{{Name: aws.String("group-name"), Values: []string{c.name()}}}
	if c.vpc != "" {
		filters = append(filters, types.Filter{Name: aws.String("vpc-id"), Values: []string{c.vpc}})
	}
	out, err := p.client(region).DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: filters})
	if err != nil {
		return nil, classify("describe security group "+c.name(), err)
	}
	if len(out.SecurityGroups) == 0 {
		return nil, nil
	}
	return &out.SecurityGroups[0], nil
}

func (p *Provider) createGroup(ctx context.Context, region string, c groupConfig) (*types.SecurityGroup, error) {
	tags := []types.Tag{
		{Key: aws.String(provider.LabelInstallation), Value: aws.String(c.installation)},
		{Key: aws.String(provider.LabelManagedBy), Value: aws.String(provider.ManagedByValue)},
		{Key: aws.String(tagGroupConfig), Value: aws.String(c.name())},
		{Key: aws.String(tagGroupCreated), Value: aws.String(p.now().UTC().Format(time.RFC3339))},
	}
	tags = append(tags, configTags(c)...)
	in := &ec2.CreateSecurityGroupInput{
		GroupName:         aws.String(c.name()),
		Description:       aws.String(fmt.Sprintf("proxyfleet: Squid port %d from the allowed source ranges", c.port)),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeSecurityGroup, Tags: tags}},
	}
	if c.vpc != "" {
		in.VpcId = aws.String(c.vpc)
	}
	out, err := p.client(region).CreateSecurityGroup(ctx, in)
	switch {
	case isCode(err, "InvalidGroup.Duplicate"):
		// Another worker made it a moment ago.
		g, err := p.findGroup(ctx, region, c)
		if err == nil && g == nil {
			err = fmt.Errorf("security group %s: EC2 says it exists and lists none", c.name())
		}
		return g, err
	case err != nil:
		return nil, classify("create security group "+c.name(), err)
	}
	return &types.SecurityGroup{GroupId: out.GroupId, GroupName: aws.String(c.name()), Tags: tags}, nil
}

// keepIngress makes g's ingress exactly c's rules, and reads the group again after any
// change until it holds them. A revoke or authorize of several rules that fails because a
// rule is gone, or there, already (another worker repairing the same group) changed none
// of the others in a VPC, and a revoke in a default VPC may succeed while leaving rules
// it did not know: what the group holds then decides the next step, not what was asked.
func (p *Provider) keepIngress(ctx context.Context, region string, g *types.SecurityGroup, c groupConfig) error {
	for attempt := 0; ; attempt++ {
		changed, err := p.setIngress(ctx, region, g, c)
		if err != nil || !changed {
			return err
		}
		if attempt == 3 {
			return fmt.Errorf("security group %s keeps changing under its repair: will try again", c.name())
		}
		id := aws.ToString(g.GroupId)
		if g, err = p.describeGroup(ctx, region, id); err != nil || g == nil {
			if g == nil && err == nil {
				err = fmt.Errorf("security group %s (%s) went during its repair", c.name(), id)
			}
			return err
		}
	}
}

// setIngress is one attempt of keepIngress on g as read; changed reports that it asked
// EC2 for a change (made, or refused because g had changed since).
func (p *Provider) setIngress(ctx context.Context, region string, g *types.SecurityGroup, c groupConfig) (changed bool, err error) {
	have := map[string]types.IpPermission{}
	for _, perm := range g.IpPermissions {
		key := func(cidr string) string {
			k := aws.ToString(perm.IpProtocol) + ":" + strconv.Itoa(int(aws.ToInt32(perm.FromPort))) + ":" + cidr
			if aws.ToInt32(perm.FromPort) != aws.ToInt32(perm.ToPort) {
				k += "-" + strconv.Itoa(int(aws.ToInt32(perm.ToPort)))
			}
			return k
		}
		bare := perm
		bare.IpRanges, bare.Ipv6Ranges, bare.UserIdGroupPairs, bare.PrefixListIds = nil, nil, nil, nil
		for _, r := range perm.IpRanges {
			one := bare
			one.IpRanges = []types.IpRange{{CidrIp: r.CidrIp}}
			have[key(aws.ToString(r.CidrIp))] = one
		}
		for _, r := range perm.Ipv6Ranges {
			one := bare
			one.Ipv6Ranges = []types.Ipv6Range{{CidrIpv6: r.CidrIpv6}}
			have[key(aws.ToString(r.CidrIpv6))] = one
		}
		// Rules by group or prefix list are nobody's of ours: they go too.
		for _, g := range perm.UserIdGroupPairs {
			one := bare
			one.UserIdGroupPairs = []types.UserIdGroupPair{g}
			have[key("group:"+aws.ToString(g.GroupId))] = one
		}
		for _, pl := range perm.PrefixListIds {
			one := bare
			one.PrefixListIds = []types.PrefixListId{pl}
			have[key("prefix-list:"+aws.ToString(pl.PrefixListId))] = one
		}
	}
	want := c.rules()
	var extra, missing []types.IpPermission
	for key, perm := range have {
		if !slices.Contains(want, key) {
			extra = append(extra, perm)
		}
	}
	for _, key := range want {
		if _, ok := have[key]; !ok {
			_, rest, _ := strings.Cut(key, ":")
			_, cidr, _ := strings.Cut(rest, ":")
			perm := types.IpPermission{IpProtocol: aws.String("tcp"), FromPort: aws.Int32(c.port), ToPort: aws.Int32(c.port)}
			if strings.Contains(cidr, ":") {
				perm.Ipv6Ranges = []types.Ipv6Range{{CidrIpv6: aws.String(cidr)}}
			} else {
				perm.IpRanges = []types.IpRange{{CidrIp: aws.String(cidr)}}
			}
			missing = append(missing, perm)
		}
	}
	id := g.GroupId
	if len(extra) > 0 {
		_, err := p.client(region).RevokeSecurityGroupIngress(ctx, &ec2.RevokeSecurityGroupIngressInput{GroupId: id, IpPermissions: extra})
		if isCode(err, "InvalidPermission.NotFound") {
			return true, nil
		}
		if err != nil {
			return false, classify("revoke ingress of "+c.name(), err)
		}
	}
	if len(missing) > 0 {
		_, err := p.client(region).AuthorizeSecurityGroupIngress(ctx, &ec2.AuthorizeSecurityGroupIngressInput{GroupId: id, IpPermissions: missing})
		if isCode(err, "InvalidPermission.Duplicate") {
			return true, nil
		}
		if err != nil {
			return false, classify("authorize ingress of "+c.name(), err)
		}
	}
	return len(extra) > 0 || len(missing) > 0, nil
}

// groupCheckEvery is how often Get reads one shared group again, however many instances
// use it.
const groupCheckEvery = time.Minute

// checkGroups puts the shared groups of a live instance back as their configuration
// wants, if they drifted (a rule added or removed by hand), reading each at most once
// a groupCheckEvery per worker. What it cannot do is logged, not returned: the instance
// itself is fine, and the next check tries again.
func (p *Provider) checkGroups(ctx context.Context, region string, in types.Instance) {
	for _, gi := range in.SecurityGroups {
		id := aws.ToString(gi.GroupId)
		if !strings.HasPrefix(aws.ToString(gi.GroupName), "proxyfleet-") || !p.dueForCheck(region+"/"+id) {
			continue
		}
		g, err := p.describeGroup(ctx, region, id)
		if err != nil || g == nil {
			if err != nil {
				p.log().WarnContext(ctx, "checking a shared security group failed; will check again", "group", id, "error", err)
			}
			continue
		}
		c, ok := configOf(*g)
		if !ok {
			if tagOf(g.Tags, tagGroupConfig) != "" {
				p.log().WarnContext(ctx, "a shared security group's configuration tags were edited; its rules are left as they are",
					"group", id, "name", aws.ToString(g.GroupName))
			}
			continue
		}
		if err := p.keepIngress(ctx, region, g, c); err != nil {
			p.log().WarnContext(ctx, "putting a drifted security group back failed; will try again", "group", id, "error", err)
		}
	}
}

// dueForCheck reports whether the group key was last checked a groupCheckEvery ago or
// never, and if so counts it checked now.
func (p *Provider) dueForCheck(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if last, ok := p.checked[key]; ok && now.Sub(last) < groupCheckEvery {
		return false
	}
	p.checked[key] = now
	return true
}

// listGroups lists the installation's shared groups in region.
func (p *Provider) listGroups(ctx context.Context, region, installation string) ([]types.SecurityGroup, error) {
	pages := ec2.NewDescribeSecurityGroupsPaginator(p.client(region), &ec2.DescribeSecurityGroupsInput{
		MaxResults: aws.Int32(1000),
		Filters: []types.Filter{
			{Name: aws.String("tag:" + provider.LabelInstallation), Values: []string{installation}},
			{Name: aws.String("tag-key"), Values: []string{tagGroupConfig}},
		}})
	var out []types.SecurityGroup
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, classify("list security groups", err)
		}
		for _, g := range page.SecurityGroups {
			if tagOf(g.Tags, provider.LabelInstallation) == installation && tagOf(g.Tags, tagGroupConfig) != "" {
				out = append(out, g)
			}
		}
	}
	return out, nil
}

// unusedGroup is how ListOwned reports a shared group no listed instance uses: an
// instance being deleted, of no Proxy (sharedGroupUID), as old as the group.
func unusedGroup(region, installation string, g types.SecurityGroup) provider.Instance {
	created, _ := time.Parse(time.RFC3339, tagOf(g.Tags, tagGroupCreated))
	return provider.Instance{
		Name:       aws.ToString(g.GroupName),
		ProviderID: region + "/" + groupIDPrefix + aws.ToString(g.GroupId),
		State:      provider.StateDeleting,
		CreatedAt:  created,
		Labels: map[string]string{
			provider.LabelInstallation: installation,
			provider.LabelProxyUID:     sharedGroupUID,
			provider.LabelManagedBy:    provider.ManagedByValue,
		},
	}
}

// describeGroup is the group id in region, or nil when there is none.
func (p *Provider) describeGroup(ctx context.Context, region, id string) (*types.SecurityGroup, error) {
	out, err := p.client(region).DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{GroupIds: []string{id}})
	if isCode(err, "InvalidGroup.NotFound") {
		return nil, nil
	}
	if err != nil {
		return nil, classify("describe security group "+id, err)
	}
	if len(out.SecurityGroups) == 0 {
		return nil, nil
	}
	return &out.SecurityGroups[0], nil
}

// deleteGroup deletes a shared group the sweep found unused: only if it is still one of
// ours and no instance uses it now (an instance made since the sweep listed it keeps it:
// provider.ErrInUse).
func (p *Provider) deleteGroup(ctx context.Context, region, id string) error {
	g, err := p.describeGroup(ctx, region, id)
	if err != nil || g == nil || tagOf(g.Tags, tagGroupConfig) == "" {
		return err
	}
	users, err := p.client(region).DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: []types.Filter{
		{Name: aws.String("instance.group-id"), Values: []string{id}},
		{Name: aws.String("instance-state-name"), Values: liveStates},
	}})
	if err != nil {
		return classify("list the users of security group "+id, err)
	}
	for _, r := range users.Reservations {
		for _, in := range r.Instances {
			if in.State == nil || in.State.Name != types.InstanceStateNameTerminated {
				return fmt.Errorf("security group %s: an instance uses it again: %w", id, provider.ErrInUse)
			}
		}
	}
	_, err = p.client(region).DeleteSecurityGroup(ctx, &ec2.DeleteSecurityGroupInput{GroupId: aws.String(id)})
	switch {
	case isCode(err, "InvalidGroup.NotFound"):
		return nil
	case isCode(err, "DependencyViolation"):
		return fmt.Errorf("security group %s: %w", id, provider.ErrInUse)
	case err != nil:
		return classify("delete security group "+id, err)
	}
	return nil
}
