package ec2test

import (
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The answers, in the elements the SDK's ec2query deserializers read.

const xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type xmlState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type xmlReason struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type xmlGroupID struct {
	ID   string `xml:"groupId"`
	Name string `xml:"groupName"`
}

type xmlMetadata struct {
	HTTPTokens string `xml:"httpTokens"`
	HopLimit   int    `xml:"httpPutResponseHopLimit"`
	Endpoint   string `xml:"httpEndpoint"`
	State      string `xml:"state"`
}

type xmlProfile struct {
	Arn string `xml:"arn"`
	ID  string `xml:"id"`
}

type xmlInstance struct {
	ID           string       `xml:"instanceId"`
	ImageID      string       `xml:"imageId"`
	State        xmlState     `xml:"instanceState"`
	StateReason  *xmlReason   `xml:"stateReason,omitempty"`
	PrivateIP    string       `xml:"privateIpAddress,omitempty"`
	PublicIP     string       `xml:"ipAddress,omitempty"`
	InstanceType string       `xml:"instanceType"`
	LaunchTime   string       `xml:"launchTime"`
	SubnetID     string       `xml:"subnetId,omitempty"`
	VPCID        string       `xml:"vpcId,omitempty"`
	ClientToken  string       `xml:"clientToken,omitempty"`
	Lifecycle    string       `xml:"instanceLifecycle,omitempty"`
	Groups       []xmlGroupID `xml:"groupSet>item"`
	Tags         []xmlTag     `xml:"tagSet>item"`
	Metadata     xmlMetadata  `xml:"metadataOptions"`
	Profile      *xmlProfile  `xml:"iamInstanceProfile,omitempty"`
}

type xmlReservation struct {
	ID        string        `xml:"reservationId"`
	OwnerID   string        `xml:"ownerId"`
	Instances []xmlInstance `xml:"instancesSet>item"`
}

type runInstancesResponse struct {
	XMLName   struct{}      `xml:"RunInstancesResponse"`
	Xmlns     string        `xml:"xmlns,attr"`
	RequestID string        `xml:"requestId"`
	ID        string        `xml:"reservationId"`
	OwnerID   string        `xml:"ownerId"`
	Instances []xmlInstance `xml:"instancesSet>item"`
}

type describeInstancesResponse struct {
	XMLName      struct{}         `xml:"DescribeInstancesResponse"`
	Xmlns        string           `xml:"xmlns,attr"`
	RequestID    string           `xml:"requestId"`
	Reservations []xmlReservation `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type xmlStateChange struct {
	ID       string   `xml:"instanceId"`
	Current  xmlState `xml:"currentState"`
	Previous xmlState `xml:"previousState"`
}

type terminateInstancesResponse struct {
	XMLName   struct{}         `xml:"TerminateInstancesResponse"`
	Xmlns     string           `xml:"xmlns,attr"`
	RequestID string           `xml:"requestId"`
	Changes   []xmlStateChange `xml:"instancesSet>item"`
}

type returnResponse struct {
	XMLName   xml.Name
	Xmlns     string `xml:"xmlns,attr"`
	RequestID string `xml:"requestId"`
	Return    bool   `xml:"return"`
}

type createSecurityGroupResponse struct {
	XMLName   struct{} `xml:"CreateSecurityGroupResponse"`
	Xmlns     string   `xml:"xmlns,attr"`
	RequestID string   `xml:"requestId"`
	Return    bool     `xml:"return"`
	GroupID   string   `xml:"groupId"`
	Tags      []xmlTag `xml:"tagSet>item"`
}

type xmlRange struct {
	CIDR string `xml:"cidrIp"`
}

type xmlRange6 struct {
	CIDR string `xml:"cidrIpv6"`
}

type xmlPermission struct {
	Protocol string      `xml:"ipProtocol"`
	From     int         `xml:"fromPort"`
	To       int         `xml:"toPort"`
	Ranges   []xmlRange  `xml:"ipRanges>item"`
	Ranges6  []xmlRange6 `xml:"ipv6Ranges>item"`
}

type xmlGroup struct {
	OwnerID     string          `xml:"ownerId"`
	ID          string          `xml:"groupId"`
	Name        string          `xml:"groupName"`
	Description string          `xml:"groupDescription"`
	VPCID       string          `xml:"vpcId"`
	Ingress     []xmlPermission `xml:"ipPermissions>item"`
	Tags        []xmlTag        `xml:"tagSet>item"`
}

type describeSecurityGroupsResponse struct {
	XMLName   struct{}   `xml:"DescribeSecurityGroupsResponse"`
	Xmlns     string     `xml:"xmlns,attr"`
	RequestID string     `xml:"requestId"`
	Groups    []xmlGroup `xml:"securityGroupInfo>item"`
	NextToken string     `xml:"nextToken,omitempty"`
}

var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

func xmlTags(t map[string]string) []xmlTag {
	out := make([]xmlTag, 0, len(t))
	for _, k := range slices.Sorted(maps.Keys(t)) {
		out = append(out, xmlTag{Key: k, Value: t[k]})
	}
	return out
}

func (s *Server) xmlOf(in *instance) xmlInstance {
	x := xmlInstance{
		ID: in.ID, ImageID: in.ImageID, InstanceType: in.InstanceType,
		State:     xmlState{Code: stateCodes[in.State], Name: in.State},
		PrivateIP: in.PrivateIP, PublicIP: in.PublicIP,
		LaunchTime: in.LaunchTime.UTC().Format("2006-01-02T15:04:05.000Z"),
		SubnetID:   in.SubnetID, VPCID: in.VPCID, ClientToken: in.ClientToken,
		Tags:     xmlTags(in.Tags),
		Metadata: xmlMetadata{HTTPTokens: in.HTTPTokens, HopLimit: in.HopLimit, Endpoint: in.MetadataEndpoint, State: "applied"},
	}
	if in.StateReason != "" {
		x.StateReason = &xmlReason{Code: in.StateReason, Message: in.StateReason + ": the instance was interrupted"}
	}
	if in.Spot {
		x.Lifecycle = "spot"
	}
	if in.InstanceProfile != "" {
		x.Profile = &xmlProfile{Arn: in.InstanceProfile, ID: "AIPAFAKE"}
	}
	for _, id := range in.SecurityGroupIDs {
		name := ""
		if g := s.groups[id]; g != nil {
			name = g.Name
		}
		x.Groups = append(x.Groups, xmlGroupID{ID: id, Name: name})
	}
	return x
}

// maxUserData is EC2's limit on user data before base64.
const maxUserData = 16 * 1024

func (s *Server) runInstances(form url.Values) (any, *apiError) {
	if form.Get("MinCount") != "1" || form.Get("MaxCount") != "1" {
		return nil, invalid("InvalidParameterValue", "the fake makes one instance at a time (MinCount=MaxCount=1)")
	}
	image := form.Get("ImageId")
	if name, ok := strings.CutPrefix(image, "resolve:ssm:"); ok {
		v, found := s.params[name]
		if !found {
			return nil, invalid("InvalidParameterValue", "Invalid value '%s' for ImageId: the SSM parameter does not exist", image)
		}
		image = v
	}
	if !strings.HasPrefix(image, "ami-") {
		return nil, invalid("InvalidAMIID.Malformed", "Invalid id: %q (expecting \"ami-...\")", image)
	}
	tok := form.Get("ClientToken")
	if len(tok) > 64 {
		return nil, invalid("InvalidParameterValue", "ClientToken is longer than 64 characters")
	}
	params := paramsOf(form)
	if t, ok := s.tokens[tok]; ok && tok != "" {
		if t.params != params {
			return nil, invalid("IdempotentParameterMismatch",
				"The client token you have provided is associated with a resource that is already deleted or has parameters that differ from this request.")
		}
		return s.reservation(t.ids), nil
	}
	in := &instance{Instance: Instance{
		ImageID: image, InstanceType: form.Get("InstanceType"), ClientToken: tok,
		State: "pending", VPCID: DefaultVPC, Tags: map[string]string{},
		HTTPTokens: "optional", HopLimit: 1, MetadataEndpoint: "enabled",
		PublicIPAssociated: true, LaunchTime: time.Now(),
	}}
	if in.InstanceType == "" {
		in.InstanceType = "m1.small"
	}
	in.SubnetID = form.Get("SubnetId")
	in.SecurityGroupIDs = list(form, "SecurityGroupId")
	if count(form, "NetworkInterface") > 0 {
		in.SubnetID = form.Get("NetworkInterface.1.SubnetId")
		in.SecurityGroupIDs = list(form, "NetworkInterface.1.SecurityGroupId")
		in.PublicIPAssociated = form.Get("NetworkInterface.1.AssociatePublicIpAddress") == "true"
		if form.Get("NetworkInterface.1.DeviceIndex") != "0" {
			return nil, invalid("InvalidParameterValue", "the primary network interface needs DeviceIndex 0")
		}
	}
	if in.SubnetID == "" {
		in.SubnetID = DefaultSubnet
	}
	vpc, ok := s.subnets[in.SubnetID]
	if !ok {
		return nil, invalid("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", in.SubnetID)
	}
	in.VPCID = vpc
	for _, id := range in.SecurityGroupIDs {
		switch g := s.groups[id]; {
		case g == nil:
			return nil, invalid("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
		case g.VPCID != vpc:
			return nil, invalid("InvalidParameter", "Security group %s and subnet %s belong to different networks.", id, in.SubnetID)
		}
	}
	if ud := form.Get("UserData"); ud != "" {
		raw, err := base64.StdEncoding.DecodeString(ud)
		if err != nil {
			return nil, invalid("InvalidParameterValue", "Invalid BASE64 encoding of user data.")
		}
		if len(raw) > maxUserData {
			return nil, invalid("InvalidParameterValue", "User data is limited to 16384 bytes")
		}
		in.UserData = ud
	}
	if v := form.Get("MetadataOptions.HttpTokens"); v != "" {
		in.HTTPTokens = v
	}
	if v := form.Get("MetadataOptions.HttpPutResponseHopLimit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 64 {
			return nil, invalid("InvalidParameterValue", "HttpPutResponseHopLimit must be 1 to 64")
		}
		in.HopLimit = n
	}
	if v := form.Get("MetadataOptions.HttpEndpoint"); v != "" {
		in.MetadataEndpoint = v
	}
	if v := form.Get("IamInstanceProfile.Arn"); v != "" {
		in.InstanceProfile = v
	} else if v := form.Get("IamInstanceProfile.Name"); v != "" {
		in.InstanceProfile = v
	}
	switch form.Get("InstanceMarketOptions.MarketType") {
	case "":
	case "spot":
		in.Spot = true
		in.Interruption = form.Get("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior")
		if in.Interruption == "" {
			in.Interruption = "terminate"
		}
		kind := form.Get("InstanceMarketOptions.SpotOptions.SpotInstanceType")
		if in.Interruption != "terminate" && kind != "persistent" {
			return nil, invalid("InvalidParameterCombination", "Interruption behavior %q needs SpotInstanceType persistent", in.Interruption)
		}
	default:
		return nil, invalid("InvalidParameterValue", "MarketType %q is not valid", form.Get("InstanceMarketOptions.MarketType"))
	}
	for i := 1; i <= count(form, "TagSpecification"); i++ {
		p := "TagSpecification." + strconv.Itoa(i)
		if form.Get(p+".ResourceType") == "instance" {
			maps.Copy(in.Tags, tags(form, p+".Tag"))
		}
	}
	for k := range in.Tags {
		if strings.HasPrefix(strings.ToLower(k), "aws:") {
			return nil, invalid("InvalidParameterValue", "Tag keys starting with 'aws:' are reserved for internal use")
		}
	}
	in.ID = s.newID("i")
	in.PrivateIP = fmt.Sprintf("10.0.%d.%d", (s.seq/250)%250, s.seq%250+1)
	s.instances[in.ID] = in
	s.order = append(s.order, in.ID)
	if tok != "" {
		s.tokens[tok] = token{params: params, ids: []string{in.ID}}
	}
	return s.reservation([]string{in.ID}), nil
}

// reservation is RunInstances' answer for the instances ids, as they are now.
func (s *Server) reservation(ids []string) runInstancesResponse {
	r := runInstancesResponse{Xmlns: xmlns, RequestID: "req-fake", ID: "r-" + strings.TrimPrefix(ids[0], "i-"), OwnerID: ownerID}
	for _, id := range ids {
		r.Instances = append(r.Instances, s.xmlOf(s.instances[id]))
	}
	return r
}

// PublicAddress is the public IPv4 address a running instance with one gets: in
// 198.51.100.0/24 (TEST-NET-2, never routed), as data only: nothing may connect to it.
func PublicAddress(seq int) string { return fmt.Sprintf("198.51.100.%d", seq%250+1) }

// advance moves an instance along as time would between two looks: pending becomes running
// (with its public address) after PendingPolls looks, shutting-down becomes terminated.
func (s *Server) advance(in *instance) {
	switch in.State {
	case "pending":
		if in.polls < s.PendingPolls {
			in.polls++
			return
		}
		if s.Boot != nil && !in.booted {
			s.boot(in)
			return
		}
		in.State = "running"
		if in.PublicIPAssociated && in.PublicIP == "" {
			n, _ := strconv.ParseInt(strings.TrimPrefix(in.ID, "i-"), 16, 64)
			in.PublicIP = PublicAddress(int(n))
		}
	case "shutting-down":
		in.State = "terminated"
		in.PublicIP = ""
	}
}

// boot runs Boot for in, once, outside the lock; the instance runs at Boot's address once
// it returns, unless it was terminated meanwhile.
func (s *Server) boot(in *instance) {
	if in.booting {
		return
	}
	in.booting = true
	snap := in.Instance
	snap.Tags = maps.Clone(in.Tags)
	go func() {
		addr, stop, err := s.Boot(snap)
		s.mu.Lock()
		defer s.mu.Unlock()
		in.booted = true
		switch {
		case err != nil:
			s.t.Errorf("ec2test: booting %s: %v", in.ID, err)
		case in.State != "pending":
			if stop != nil {
				stop() // terminated while booting
			}
		default:
			in.State, in.stop = "running", stop
			if in.PublicIPAssociated {
				in.PublicIP = addr
			} else {
				in.PrivateIP = addr
			}
		}
	}()
}

// maxFilterValues is EC2's limit on the filter values of one call, all filters together.
const maxFilterValues = 200

func (s *Server) describeInstances(form url.Values) (any, *apiError) {
	ids := list(form, "InstanceId")
	f := filters(form)
	values := 0
	for _, v := range f {
		values += len(v)
	}
	if values > maxFilterValues {
		return nil, invalid("FilterLimitExceeded", "The maximum number of filter values specified on a single call is %d", maxFilterValues)
	}
	maxResults := 0
	if v := form.Get("MaxResults"); v != "" {
		if len(ids) > 0 {
			return nil, invalid("InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults")
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 5 || n > 1000 {
			return nil, invalid("InvalidParameterValue", "MaxResults must be between 5 and 1000")
		}
		maxResults = n
	}
	for _, id := range ids {
		if in := s.instances[id]; in == nil || in.forgotten {
			return nil, invalid("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	var match []*instance
	for _, id := range s.order {
		in := s.instances[id]
		if in.forgotten || len(ids) > 0 && !slices.Contains(ids, id) {
			continue
		}
		if states, ok := f["instance-state-name"]; ok && !slices.Contains(states, in.State) {
			continue
		}
		if vpcs, ok := f["vpc-id"]; ok && !slices.Contains(vpcs, in.VPCID) {
			continue
		}
		if toks, ok := f["client-token"]; ok && !slices.Contains(toks, in.ClientToken) {
			continue
		}
		if gs, ok := f["instance.group-id"]; ok && !slices.ContainsFunc(gs, func(g string) bool { return slices.Contains(in.SecurityGroupIDs, g) }) {
			continue
		}
		if !matchTags(f, in.Tags) {
			continue
		}
		match = append(match, in)
	}
	start, apiErr := pageStart(form.Get("NextToken"), len(match))
	if apiErr != nil {
		return nil, apiErr
	}
	end := len(match)
	if maxResults > 0 {
		end = min(start+maxResults, len(match))
	}
	resp := describeInstancesResponse{Xmlns: xmlns, RequestID: "req-fake"}
	for _, in := range match[start:end] {
		s.advance(in)
		resp.Reservations = append(resp.Reservations, xmlReservation{
			ID: "r-" + strings.TrimPrefix(in.ID, "i-"), OwnerID: ownerID, Instances: []xmlInstance{s.xmlOf(in)}})
	}
	if end < len(match) {
		resp.NextToken = "page-" + strconv.Itoa(end)
	}
	return resp, nil
}

// pageStart reads a NextToken this fake gave.
func pageStart(tok string, n int) (int, *apiError) {
	if tok == "" {
		return 0, nil
	}
	i, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
	if err != nil || !strings.HasPrefix(tok, "page-") || i < 0 || i > n {
		return 0, invalid("InvalidParameterValue", "Invalid NextToken %q", tok)
	}
	return i, nil
}

func (s *Server) terminateInstances(form url.Values) (any, *apiError) {
	ids := list(form, "InstanceId")
	if len(ids) == 0 {
		return nil, invalid("MissingParameter", "The request must contain the parameter InstanceId")
	}
	for _, id := range ids {
		if s.instances[id] == nil {
			return nil, invalid("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	resp := terminateInstancesResponse{Xmlns: xmlns, RequestID: "req-fake"}
	for _, id := range ids {
		in := s.instances[id]
		prev := in.State
		if in.State != "terminated" {
			in.State = "shutting-down"
			in.halt()
		}
		resp.Changes = append(resp.Changes, xmlStateChange{ID: id,
			Current:  xmlState{Code: stateCodes[in.State], Name: in.State},
			Previous: xmlState{Code: stateCodes[prev], Name: prev}})
	}
	return resp, nil
}

func (s *Server) createTags(form url.Values) (any, *apiError) {
	t := tags(form, "Tag")
	for _, id := range list(form, "ResourceId") {
		switch {
		case s.instances[id] != nil:
			maps.Copy(s.instances[id].Tags, t)
		case s.groups[id] != nil:
			maps.Copy(s.groups[id].Tags, t)
		default:
			return nil, invalid("InvalidID", "The ID '%s' is not valid", id)
		}
	}
	return returnResponse{XMLName: name("CreateTagsResponse"), Xmlns: xmlns, RequestID: "req-fake", Return: true}, nil
}

func (s *Server) createSecurityGroup(form url.Values) (any, *apiError) {
	nm, desc := form.Get("GroupName"), form.Get("GroupDescription")
	if nm == "" || desc == "" {
		return nil, invalid("MissingParameter", "GroupName and GroupDescription are required")
	}
	if strings.HasPrefix(nm, "sg-") {
		return nil, invalid("InvalidParameterValue", "Group names may not be in the format sg-*")
	}
	vpc := form.Get("VpcId")
	if vpc == "" {
		vpc = DefaultVPC
	}
	for _, g := range s.groups {
		if g.Name == nm && g.VPCID == vpc {
			return nil, invalid("InvalidGroup.Duplicate", "The security group '%s' already exists for VPC '%s'", nm, vpc)
		}
	}
	g := &group{SecurityGroup: SecurityGroup{ID: s.newID("sg"), Name: nm, Description: desc, VPCID: vpc, Tags: map[string]string{}}, rules: map[string]bool{}}
	for i := 1; i <= count(form, "TagSpecification"); i++ {
		p := "TagSpecification." + strconv.Itoa(i)
		if form.Get(p+".ResourceType") == "security-group" {
			maps.Copy(g.Tags, tags(form, p+".Tag"))
		}
	}
	s.groups[g.ID] = g
	return createSecurityGroupResponse{Xmlns: xmlns, RequestID: "req-fake", Return: true, GroupID: g.ID, Tags: xmlTags(g.Tags)}, nil
}

func (s *Server) describeSecurityGroups(form url.Values) (any, *apiError) {
	ids, names := list(form, "GroupId"), list(form, "GroupName")
	f := filters(form)
	for _, id := range ids {
		if s.groups[id] == nil {
			return nil, invalid("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
		}
	}
	var match []*group
	for _, id := range slices.Sorted(maps.Keys(s.groups)) {
		g := s.groups[id]
		switch {
		case len(ids) > 0 && !slices.Contains(ids, id),
			len(names) > 0 && !slices.Contains(names, g.Name),
			f["group-name"] != nil && !slices.Contains(f["group-name"], g.Name),
			f["group-id"] != nil && !slices.Contains(f["group-id"], g.ID),
			f["vpc-id"] != nil && !slices.Contains(f["vpc-id"], g.VPCID),
			!matchTags(f, g.Tags):
			continue
		}
		match = append(match, g)
	}
	start, apiErr := pageStart(form.Get("NextToken"), len(match))
	if apiErr != nil {
		return nil, apiErr
	}
	end := len(match)
	if v := form.Get("MaxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 5 || n > 1000 {
			return nil, invalid("InvalidParameterValue", "MaxResults must be between 5 and 1000")
		}
		end = min(start+n, len(match))
	}
	resp := describeSecurityGroupsResponse{Xmlns: xmlns, RequestID: "req-fake"}
	for _, g := range match[start:end] {
		x := xmlGroup{OwnerID: ownerID, ID: g.ID, Name: g.Name, Description: g.Description, VPCID: g.VPCID, Tags: xmlTags(g.Tags)}
		for _, r := range slices.Sorted(maps.Keys(g.rules)) {
			proto, rest, _ := strings.Cut(r, ":")
			port, cidr, _ := strings.Cut(rest, ":")
			p, _ := strconv.Atoi(port)
			perm := xmlPermission{Protocol: proto, From: p, To: p}
			if strings.Contains(cidr, ":") {
				perm.Ranges6 = []xmlRange6{{CIDR: cidr}}
			} else {
				perm.Ranges = []xmlRange{{CIDR: cidr}}
			}
			x.Ingress = append(x.Ingress, perm)
		}
		resp.Groups = append(resp.Groups, x)
	}
	if end < len(match) {
		resp.NextToken = "page-" + strconv.Itoa(end)
	}
	return resp, nil
}

// changeIngress authorizes (add) or revokes rules of one port each ("tcp:3128:cidr").
func (s *Server) changeIngress(form url.Values, add bool) (any, *apiError) {
	g := s.groups[form.Get("GroupId")]
	if g == nil {
		return nil, invalid("InvalidGroup.NotFound", "The security group '%s' does not exist", form.Get("GroupId"))
	}
	var rules []string
	for i := 1; i <= count(form, "IpPermissions"); i++ {
		p := "IpPermissions." + strconv.Itoa(i)
		from, to := form.Get(p+".FromPort"), form.Get(p+".ToPort")
		if from != to {
			return nil, invalid("InvalidParameterValue", "the fake keeps rules of one port: %s-%s", from, to)
		}
		for j := 1; j <= count(form, p+".IpRanges"); j++ {
			rules = append(rules, fmt.Sprintf("%s:%s:%s", form.Get(p+".IpProtocol"), from, form.Get(fmt.Sprintf("%s.IpRanges.%d.CidrIp", p, j))))
		}
		for j := 1; j <= count(form, p+".Ipv6Ranges"); j++ {
			rules = append(rules, fmt.Sprintf("%s:%s:%s", form.Get(p+".IpProtocol"), from, form.Get(fmt.Sprintf("%s.Ipv6Ranges.%d.CidrIpv6", p, j))))
		}
	}
	for _, r := range rules {
		switch {
		case add && g.rules[r]:
			return nil, invalid("InvalidPermission.Duplicate", "the specified rule %q already exists", r)
		case !add && !g.rules[r]:
			return nil, invalid("InvalidPermission.NotFound", "The specified rule does not exist in this security group.")
		}
	}
	for _, r := range rules {
		if add {
			g.rules[r] = true
		} else {
			delete(g.rules, r)
		}
	}
	action := "AuthorizeSecurityGroupIngressResponse"
	if !add {
		action = "RevokeSecurityGroupIngressResponse"
	}
	return returnResponse{XMLName: name(action), Xmlns: xmlns, RequestID: "req-fake", Return: true}, nil
}

func (s *Server) deleteSecurityGroup(form url.Values) (any, *apiError) {
	id := form.Get("GroupId")
	if s.groups[id] == nil {
		return nil, invalid("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
	}
	for _, in := range s.instances {
		if in.State != "terminated" && slices.Contains(in.SecurityGroupIDs, id) {
			return nil, &apiError{http.StatusBadRequest, "DependencyViolation", "resource " + id + " has a dependent object"}
		}
	}
	delete(s.groups, id)
	return returnResponse{XMLName: name("DeleteSecurityGroupResponse"), Xmlns: xmlns, RequestID: "req-fake", Return: true}, nil
}

func name(local string) xml.Name { return xml.Name{Local: local} }

type xmlSubnet struct {
	ID    string `xml:"subnetId"`
	VPCID string `xml:"vpcId"`
	State string `xml:"state"`
}

type describeSubnetsResponse struct {
	XMLName   struct{}    `xml:"DescribeSubnetsResponse"`
	Xmlns     string      `xml:"xmlns,attr"`
	RequestID string      `xml:"requestId"`
	Subnets   []xmlSubnet `xml:"subnetSet>item"`
}

func (s *Server) describeSubnets(form url.Values) (any, *apiError) {
	ids := list(form, "SubnetId")
	resp := describeSubnetsResponse{Xmlns: xmlns, RequestID: "req-fake"}
	for _, id := range ids {
		vpc, ok := s.subnets[id]
		if !ok {
			return nil, invalid("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", id)
		}
		resp.Subnets = append(resp.Subnets, xmlSubnet{ID: id, VPCID: vpc, State: "available"})
	}
	if len(ids) == 0 {
		for _, id := range slices.Sorted(maps.Keys(s.subnets)) {
			resp.Subnets = append(resp.Subnets, xmlSubnet{ID: id, VPCID: s.subnets[id], State: "available"})
		}
	}
	return resp, nil
}
