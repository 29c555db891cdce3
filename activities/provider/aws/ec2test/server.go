// Package ec2test is an in-memory EC2 API on 127.0.0.1 speaking the EC2 query protocol the
// AWS SDK for Go v2 sends (form-encoded actions, XML answers, EC2's error documents), so
// the SDK's own serializers, deserializers, retries and paginators run against it in
// tests. It keeps instances and security groups, honours RunInstances' ClientToken (the
// same token returns the same reservation; different parameters under it are refused as
// EC2 refuses them), filters by tags and states, pages DescribeInstances, and lets a test
// fail the next call of an action, refuse for capacity, and interrupt a Spot instance.
//
// Regions are kept apart as EC2 keeps them: a request is served by the region its
// signature names, each with instances and groups of its own. What it does not model is
// said where it matters: there is one VPC and one subnet per region unless a test adds
// more, no eventual consistency (a new instance is listed at once), and an instance is
// pending until it has been described PendingPolls times (and booted, when Boot is set).
package ec2test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Actions the fake answers, as FailNext and Requests name them.
const (
	ActionRunInstances                  = "RunInstances"
	ActionDescribeInstances             = "DescribeInstances"
	ActionTerminateInstances            = "TerminateInstances"
	ActionCreateTags                    = "CreateTags"
	ActionCreateSecurityGroup           = "CreateSecurityGroup"
	ActionDescribeSecurityGroups        = "DescribeSecurityGroups"
	ActionAuthorizeSecurityGroupIngress = "AuthorizeSecurityGroupIngress"
	ActionRevokeSecurityGroupIngress    = "RevokeSecurityGroupIngress"
	ActionDeleteSecurityGroup           = "DeleteSecurityGroup"
	ActionDescribeSubnets               = "DescribeSubnets"
)

// DebianParameter is the public SSM parameter of Debian 12's current AMI, which the fake
// resolves to DebianAMI from the start.
const (
	DebianParameter = "/aws/service/debian/release/12/latest/amd64"
	DebianAMI       = "ami-0debian12000000001"
)

// Region is the fake's default region (Config's); DefaultVPC and DefaultSubnet exist from
// the start in it and in every other region a request is signed for (see InRegion).
const (
	Region        = "eu-west-1"
	DefaultVPC    = "vpc-0fa4e0000000000a1"
	DefaultSubnet = "subnet-0fa4e0000000000b1"
	ownerID       = "123456789012"
)

// Instance is a snapshot of one stored instance.
type Instance struct {
	ID, ImageID, InstanceType, SubnetID, VPCID string
	// State is EC2's state name: pending, running, shutting-down, terminated, stopping,
	// stopped. StateReason is its stateReason code ("" when none).
	State, StateReason  string
	PrivateIP, PublicIP string
	ClientToken         string
	Tags                map[string]string
	SecurityGroupIDs    []string
	// UserData is as sent: base64 of the script.
	UserData string
	// HTTPTokens, HopLimit and MetadataEndpoint are the instance metadata options.
	HTTPTokens       string
	HopLimit         int
	MetadataEndpoint string
	// Spot is set for a Spot instance; Interruption is its interruption behaviour.
	Spot         bool
	Interruption string
	// InstanceProfile is the IAM instance profile's name or ARN ("" when none).
	InstanceProfile string
	// PublicIPAssociated is what the request asked of its network interface.
	PublicIPAssociated bool
	LaunchTime         time.Time
}

// SecurityGroup is a snapshot of one stored security group.
type SecurityGroup struct {
	ID, Name, Description, VPCID string
	Tags                         map[string]string
	// Ingress rules as "tcp:3128:203.0.113.0/24", sorted.
	Ingress []string
}

// Server is the fake API. Its zero value is not usable; call NewServer.
type Server struct {
	*httptest.Server
	t testing.TB

	// PendingPolls is how many DescribeInstances answers show a new instance pending
	// before it is running with an address (default 1).
	PendingPolls int

	// Boot, when set, boots each new instance as a test wants (a real Squid run from its
	// user data, say) and returns the address it serves on, instead of a TEST-NET one, and
	// a function that stops it. The instance stays pending until Boot returns; stop is
	// called when it is terminated, stopped or interrupted. Set it before the first
	// request.
	Boot func(Instance) (address string, stop func(), err error)

	mu        sync.Mutex
	region    string
	regions   map[string]*Server // the other regions' state, on the default region's Server
	seq       int
	instances map[string]*instance
	order     []string // instance IDs in creation order
	groups    map[string]*group
	subnets   map[string]string // subnet ID → VPC ID
	params    map[string]string // SSM parameters RunInstances resolves (resolve:ssm:)
	tokens    map[string]token
	failures  map[string][]apiError
	requests  map[string]int
	forms     map[string][]url.Values
	auths     map[string]string // the last Authorization header of each action
	lose      map[string]int    // answers to do and then lose, by action
}

type instance struct {
	Instance
	polls int
	// booting and booted follow Boot; stop is what it returned, until called.
	booting, booted bool
	stop            func()
	// forgotten is set once EC2 no longer lists the (terminated) instance (Forget).
	forgotten bool
}

// halt stops what Boot started for in, once.
func (in *instance) halt() {
	if in.stop != nil {
		in.stop()
		in.stop = nil
	}
}

type group struct {
	SecurityGroup
	rules map[string]bool
}

type token struct {
	params string
	ids    []string
}

// apiError is an error document EC2 answers with.
type apiError struct {
	status        int
	code, message string
}

// NewServer starts a fake on 127.0.0.1 that is closed when the test ends.
func NewServer(t testing.TB) *Server {
	s := newRegion(t, Region, 0)
	s.regions = map[string]*Server{}
	s.Server = httptest.NewServer(http.HandlerFunc(s.route))
	t.Cleanup(s.Close)
	return s
}

// newRegion is one region's state; its IDs start at base, apart from other regions'.
func newRegion(t testing.TB, region string, base int) *Server {
	return &Server{
		t:            t,
		region:       region,
		seq:          base,
		PendingPolls: 1,
		instances:    map[string]*instance{},
		groups:       map[string]*group{},
		subnets:      map[string]string{DefaultSubnet: DefaultVPC},
		params:       map[string]string{DebianParameter: DebianAMI},
		tokens:       map[string]token{},
		failures:     map[string][]apiError{},
		requests:     map[string]int{},
		forms:        map[string][]url.Values{},
		auths:        map[string]string{},
		lose:         map[string]int{},
	}
}

// InRegion is the fake's state for region, made on first use, for a test to look at or
// change as it does the default region's (whose Server this must be).
func (s *Server) InRegion(region string) *Server {
	if region == s.region {
		return s
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.regions[region]
	if r == nil {
		r = newRegion(s.t, region, (len(s.regions)+1)<<24)
		r.PendingPolls, r.Boot = s.PendingPolls, s.Boot
		s.regions[region] = r
	}
	return r
}

// route serves a request in the region its Signature Version 4 credential scope names
// (Credential=<key>/<date>/<region>/ec2/aws4_request), as EC2's regional endpoints do.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	region := s.region
	if _, cred, ok := strings.Cut(r.Header.Get("Authorization"), "Credential="); ok {
		if scope := strings.Split(strings.SplitN(cred, ",", 2)[0], "/"); len(scope) == 5 && scope[2] != "" {
			region = scope[2]
		}
	}
	s.InRegion(region).serve(w, r)
}

// FailNext makes the next call of action fail with EC2's error code and message, and an
// HTTP status (400 for client errors, 503 for throttling and unavailability, as EC2).
func (s *Server) FailNext(action string, status int, code, message string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[action] = append(s.failures[action], apiError{status: status, code: code, message: message})
}

// LoseNextAnswer makes the next call of action do what it asks and then answer 500
// InternalError, as when the answer is lost on its way (a connection reset, a worker
// killed mid-call): whoever asked cannot tell it was done.
func (s *Server) LoseNextAnswer(action string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lose[action]++
}

// RefuseCapacity makes the next RunInstances fail as EC2 does when a zone has no capacity
// for the instance type.
func (s *Server) RefuseCapacity() {
	s.FailNext(ActionRunInstances, http.StatusInternalServerError, "InsufficientInstanceCapacity",
		"We currently do not have sufficient capacity in the Availability Zone you requested.")
}

// Requests is how many calls of action reached the fake, failed ones included.
func (s *Server) Requests(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[action]
}

// Forms are the decoded form bodies of every call of action, in the order received.
func (s *Server) Forms(action string) []url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.forms[action])
}

// Authorizations is the Authorization header of the last call of action: how it was
// signed (the access key and the credential scope).
func (s *Server) Authorizations(action string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.auths[action]
}

// Interrupt takes a Spot instance back as EC2 does, by its interruption behaviour: stop
// (stopped) or terminate (terminated), with the reason Server.SpotInstanceTermination and
// no public address. The test fails for an instance that is not Spot.
func (s *Server) Interrupt(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[id]
	if in == nil || !in.Spot {
		s.t.Errorf("ec2test: Interrupt(%s): not a Spot instance", id)
		return
	}
	in.State = "terminated"
	if in.Interruption == "stop" {
		in.State = "stopped"
	}
	in.StateReason, in.PublicIP = "Server.SpotInstanceTermination", ""
	in.halt()
}

// SetState sets an instance's state as if changed outside the code under test.
func (s *Server) SetState(id, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in := s.instances[id]; in != nil {
		in.State = state
		if state != "pending" && state != "running" {
			in.halt()
		}
	}
}

// AddInstance stores an instance directly, as if made outside the code under test; its
// ID is returned.
func (s *Server) AddInstance(in Instance) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in.ID == "" {
		in.ID = s.newID("i")
	}
	if in.State == "" {
		in.State = "running"
	}
	in.Tags = maps.Clone(in.Tags)
	s.instances[in.ID] = &instance{Instance: in, polls: s.PendingPolls}
	s.order = append(s.order, in.ID)
	return in.ID
}

// Instances is a snapshot of every stored instance, terminated ones included, in creation
// order.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Instance, 0, len(s.order))
	for _, id := range s.order {
		in := s.instances[id].Instance
		in.Tags = maps.Clone(in.Tags)
		in.SecurityGroupIDs = slices.Clone(in.SecurityGroupIDs)
		out = append(out, in)
	}
	return out
}

// Live is the instances that are not terminated or being terminated, in creation order.
func (s *Server) Live() []Instance {
	var out []Instance
	for _, in := range s.Instances() {
		if in.State != "terminated" && in.State != "shutting-down" {
			out = append(out, in)
		}
	}
	return out
}

// SecurityGroups is a snapshot of every stored security group, by ID.
func (s *Server) SecurityGroups() []SecurityGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SecurityGroup, 0, len(s.groups))
	for _, id := range slices.Sorted(maps.Keys(s.groups)) {
		g := s.groups[id].SecurityGroup
		g.Tags = maps.Clone(g.Tags)
		g.Ingress = slices.Sorted(maps.Keys(s.groups[id].rules))
		out = append(out, g)
	}
	return out
}

// SetParameter sets an SSM parameter that RunInstances resolves for an image given as
// resolve:ssm:<name>, as EC2 does at launch.
func (s *Server) SetParameter(name, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.params[name] = value
}

// AddSubnet adds a subnet of vpc, beside DefaultSubnet.
func (s *Server) AddSubnet(id, vpc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnets[id] = vpc
}

// SetIngress replaces a group's ingress rules ("tcp:3128:10.0.0.0/8"), as an edit made
// outside the code under test would.
func (s *Server) SetIngress(id string, rules ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[id]; g != nil {
		g.rules = map[string]bool{}
		for _, r := range rules {
			g.rules[r] = true
		}
	}
}

// Forget makes a terminated instance vanish from DescribeInstances, as EC2 does about an
// hour after a termination, while its client token still answers RunInstances with it
// (EC2 keeps a token for a day or more). The test fails for an instance not terminated.
func (s *Server) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := s.instances[id]
	if in == nil || in.State != "terminated" {
		s.t.Errorf("ec2test: Forget(%s): not a terminated instance", id)
		return
	}
	in.forgotten = true
}

// SetTags sets tags on an instance or group, as an edit made outside the code under test
// would.
func (s *Server) SetTags(id string, tags map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if in := s.instances[id]; in != nil {
		maps.Copy(in.Tags, tags)
	}
	if g := s.groups[id]; g != nil {
		maps.Copy(g.Tags, tags)
	}
}

func (s *Server) newID(prefix string) string {
	s.seq++
	return fmt.Sprintf("%s-%017x", prefix, 0xfa4e0000000+s.seq)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeError(w, apiError{http.StatusBadRequest, "InvalidAction", "the EC2 query protocol is POST"})
		return
	}
	if err := r.ParseForm(); err != nil {
		writeError(w, apiError{http.StatusBadRequest, "MalformedQueryString", err.Error()})
		return
	}
	form := r.PostForm
	action := form.Get("Action")
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests[action]++
	s.forms[action] = append(s.forms[action], form)
	s.auths[action] = r.Header.Get("Authorization")
	if f := s.failures[action]; len(f) > 0 {
		s.failures[action] = f[1:]
		writeError(w, f[0])
		return
	}
	var (
		body any
		err  *apiError
	)
	switch action {
	case ActionRunInstances:
		body, err = s.runInstances(form)
	case ActionDescribeInstances:
		body, err = s.describeInstances(form)
	case ActionTerminateInstances:
		body, err = s.terminateInstances(form)
	case ActionCreateTags:
		body, err = s.createTags(form)
	case ActionCreateSecurityGroup:
		body, err = s.createSecurityGroup(form)
	case ActionDescribeSecurityGroups:
		body, err = s.describeSecurityGroups(form)
	case ActionAuthorizeSecurityGroupIngress:
		body, err = s.changeIngress(form, true)
	case ActionRevokeSecurityGroupIngress:
		body, err = s.changeIngress(form, false)
	case ActionDeleteSecurityGroup:
		body, err = s.deleteSecurityGroup(form)
	case ActionDescribeSubnets:
		body, err = s.describeSubnets(form)
	default:
		err = &apiError{http.StatusBadRequest, "InvalidAction", "the action " + action + " is not valid for this web service"}
	}
	if err == nil && s.lose[action] > 0 {
		s.lose[action]--
		err = &apiError{http.StatusInternalServerError, "InternalError", "An internal error has occurred (the answer was lost)."}
	}
	if err != nil {
		writeError(w, *err)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(body)
}

func writeError(w http.ResponseWriter, e apiError) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(e.status)
	type errDoc struct {
		XMLName xml.Name `xml:"Response"`
		Code    string   `xml:"Errors>Error>Code"`
		Message string   `xml:"Errors>Error>Message"`
		ID      string   `xml:"RequestID"`
	}
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(errDoc{Code: e.code, Message: e.message, ID: "req-fake"})
}

func invalid(code, format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, code, fmt.Sprintf(format, args...)}
}

// list is the values of an EC2 query list: prefix.1, prefix.2, … until one is missing.
func list(form url.Values, prefix string) []string {
	var out []string
	for i := 1; ; i++ {
		v, ok := form[prefix+"."+strconv.Itoa(i)]
		if !ok {
			return out
		}
		out = append(out, v[0])
	}
}

// count is how many members prefix.N.* has.
func count(form url.Values, prefix string) int {
	n := 0
	for i := 1; ; i++ {
		p := prefix + "." + strconv.Itoa(i) + "."
		found := false
		for k := range form {
			if strings.HasPrefix(k, p) {
				found = true
				break
			}
		}
		if !found {
			return n
		}
		n++
	}
}

// tags are the Tag.N.Key/Value pairs under prefix.
func tags(form url.Values, prefix string) map[string]string {
	out := map[string]string{}
	for i := 1; i <= count(form, prefix); i++ {
		p := prefix + "." + strconv.Itoa(i)
		out[form.Get(p+".Key")] = form.Get(p + ".Value")
	}
	return out
}

// filters are the Filter.N.Name / Filter.N.Value.M of a describe call.
func filters(form url.Values) map[string][]string {
	out := map[string][]string{}
	for i := 1; i <= count(form, "Filter"); i++ {
		p := "Filter." + strconv.Itoa(i)
		out[form.Get(p+".Name")] = list(form, p+".Value")
	}
	return out
}

// matchTags applies the tag filters (tag:<key>, tag-key) to tags.
func matchTags(f map[string][]string, t map[string]string) bool {
	for name, values := range f {
		switch {
		case strings.HasPrefix(name, "tag:"):
			if v, ok := t[strings.TrimPrefix(name, "tag:")]; !ok || !slices.Contains(values, v) {
				return false
			}
		case name == "tag-key":
			if !slices.ContainsFunc(values, func(k string) bool { _, ok := t[k]; return ok }) {
				return false
			}
		}
	}
	return true
}

// paramsOf is the identity of a RunInstances request for its ClientToken: everything but
// the token itself.
func paramsOf(form url.Values) string {
	keys := slices.Sorted(maps.Keys(form))
	h := sha256.New()
	for _, k := range keys {
		if k == "ClientToken" {
			continue
		}
		fmt.Fprintf(h, "%s=%s\n", k, strings.Join(form[k], ","))
	}
	return hex.EncodeToString(h.Sum(nil))
}
