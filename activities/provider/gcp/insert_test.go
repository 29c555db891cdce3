package gcp

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// testPassword is a canary: no error, log line or API response a test sees may carry it.
const testPassword = "canary-9d2f6b1e-proxy-password"

var testCredentials = proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: testPassword}

func gcpRequest(name string, g *v1alpha1.GCPSpec) provider.CreateRequest {
	return provider.CreateRequest{
		Name:         name,
		ProxyUID:     "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
		Installation: "prod-eu",
		Namespace:    "crawl",
		Port:         3128,
		Spec:         v1alpha1.ProxySpec{Provider: v1alpha1.ProviderGCP, GCP: g},
		Credentials:  testCredentials,
		KeyID:        "0a1b2c3d",
	}
}

// minimalSpec is the least a Proxy that went through the API server has: an external IP
// (the default) needs the ranges crawlers connect from.
func minimalSpec() *v1alpha1.GCPSpec {
	return &v1alpha1.GCPSpec{
		Zone:                "europe-west1-b",
		MachineType:         "e2-micro",
		Image:               "projects/debian-cloud/global/images/family/debian-12",
		AllowedSourceRanges: []v1alpha1.CIDR{"203.0.113.0/24"},
	}
}

// wantScript is the startup script squid's own API renders for cfg (port 3128 and the
// test credentials unless cfg says otherwise) followed by userScript: what the instance
// must boot with.
func wantScript(t *testing.T, cfg squid.Config, userScript []byte) string {
	t.Helper()
	if cfg.Port == 0 {
		cfg.Port = 3128
	}
	if cfg.Credentials.Empty() {
		cfg.Credentials = testCredentials
	}
	files, err := squid.Render(cfg)
	require.NoError(t, err)
	script, err := squid.StartupScript(files, userScript)
	require.NoError(t, err)
	return string(script)
}

// metadataOf is the instance's metadata as a map.
func metadataOf(inst *computepb.Instance) map[string]string {
	m := map[string]string{}
	for _, item := range inst.GetMetadata().GetItems() {
		m[item.GetKey()] = item.GetValue()
	}
	return m
}

const ownershipLabels = `
	"proxyfleet-uid": "0b6d1c1e-8a7e-4d0c-9d57-6f1e3c2a9b10",
	"proxyfleet-installation": "prod-eu",
	"proxyfleet-managed-by": "proxyfleet",
	"proxyfleet-key-id": "0a1b2c3d"`

// The expected bodies are the JSON the client puts on the wire, so a change in the VM's
// shape shows up here as a readable diff. The startup script, too long to read in a diff,
// is checked on its own against what the squid package renders for the request.
func TestBuildInsert(t *testing.T) {
	tests := []struct {
		name     string
		req      func() provider.CreateRequest
		project  string
		wantZone string
		wantBody string
		// squid is the Squid configuration the script must carry (port and credentials
		// default to the request's), user the cloud-init data it must run after it.
		squid squid.Config
		user  []byte
	}{
		{
			name:     "minimal spec",
			req:      func() provider.CreateRequest { return gcpRequest("px-a", minimalSpec()) },
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-a",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
				"tags": {"items": ["$RULE"]},
				"description": "$DESC",
				"labels": {` + ownershipLabels + `, "proxyfleet-firewall": "$RULE"}
			}`,
		},
		{
			name: "full spec with cloud-init",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.Network = "crawl-net"
				g.Subnetwork = "crawl-sub"
				g.Tags = []v1alpha1.NetworkTag{"squid", "egress"}
				g.Labels = map[string]v1alpha1.GCPLabelValue{"team": "crawl"}
				r := gcpRequest("px-b", g)
				r.CloudInit = []byte("#!/bin/sh\necho hi\n")
				return r
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-b",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{
					"network": "global/networks/crawl-net",
					"subnetwork": "regions/europe-west1/subnetworks/crawl-sub",
					"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]
				}],
				"tags": {"items": ["squid", "egress", "$RULE"]},
				"description": "$DESC",
				"labels": {"team": "crawl",` + ownershipLabels + `, "proxyfleet-firewall": "$RULE"}
			}`,
			user: []byte("#!/bin/sh\necho hi\n"),
		},
		{
			name: "paths and URLs are kept as written (a Shared VPC: no ranges, no rule)",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.ExternalIP = proto.Bool(false)
				g.AllowedSourceRanges = nil
				g.MachineType = "zones/europe-west1-b/machineTypes/n2-custom-2-4096"
				g.Image = "https://www.googleapis.com/compute/v1/projects/my-images/global/images/squid-7"
				g.Network = "projects/host-proj/global/networks/shared"
				g.Subnetwork = "projects/host-proj/regions/europe-west1/subnetworks/shared-sub"
				return gcpRequest("px-c", g)
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-c",
				"machineType": "zones/europe-west1-b/machineTypes/n2-custom-2-4096",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "https://www.googleapis.com/compute/v1/projects/my-images/global/images/squid-7"}}],
				"networkInterfaces": [{
					"network": "projects/host-proj/global/networks/shared",
					"subnetwork": "projects/host-proj/regions/europe-west1/subnetworks/shared-sub"
				}],
				"labels": {` + ownershipLabels + `}
			}`,
		},
		{
			name: "user labels cannot override ownership labels",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.Labels = map[string]v1alpha1.GCPLabelValue{
					provider.LabelProxyUID:     "someone-else",
					provider.LabelInstallation: "other",
					provider.LabelManagedBy:    "terraform",
					"env":                      "prod",
				}
				return gcpRequest("px-d", g)
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-d",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
				"tags": {"items": ["$RULE"]},
				"description": "$DESC",
				"labels": {"env": "prod",` + ownershipLabels + `, "proxyfleet-firewall": "$RULE"}
			}`,
		},
		{
			name: "no external IP: no access config",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.ExternalIP = proto.Bool(false)
				g.AllowedSourceRanges = nil
				return gcpRequest("px-e", g)
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-e",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{}],
				"labels": {` + ownershipLabels + `}
			}`,
		},
		{
			name: "external IP asked for explicitly; a user tag equal to the rule's is not repeated",
			req: func() provider.CreateRequest {
				g := minimalSpec()
				g.ExternalIP = proto.Bool(true)
				g.Tags = []v1alpha1.NetworkTag{v1alpha1.NetworkTag(minimalRule), "px-f", "squid"}
				return gcpRequest("px-f", g)
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-f",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
				"tags": {"items": ["px-f", "squid", "$RULE"]},
				"description": "$DESC",
				"labels": {` + ownershipLabels + `, "proxyfleet-firewall": "$RULE"}
			}`,
		},
		{
			name: "egress, port and cloud-init reach the script",
			req: func() provider.CreateRequest {
				r := gcpRequest("px-g", minimalSpec())
				r.Port = 8080
				r.Spec.Egress = &v1alpha1.Egress{
					AllowedDestinations: []v1alpha1.CIDR{"10.20.0.0/16", "fd00:1::/32"},
					Ports:               []v1alpha1.PortNumber{443, 8443},
				}
				r.CloudInit = []byte("#!/bin/sh\necho 'http_access deny all' > /etc/squid/extra.conf\n")
				return r
			},
			project:  "proj-a",
			wantZone: "europe-west1-b",
			wantBody: `{
				"name": "px-g",
				"machineType": "zones/europe-west1-b/machineTypes/e2-micro",
				"disks": [{"autoDelete": true, "boot": true,
					"initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"}}],
				"networkInterfaces": [{"accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}],
				"tags": {"items": ["$RULE"]},
				"description": "$DESC",
				"labels": {` + ownershipLabels + `, "proxyfleet-firewall": "$RULE"}
			}`,
			squid: squid.Config{
				Port:    8080,
				Ports:   []int32{443, 8443},
				Allowed: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("fd00:1::/32")},
			},
			user: []byte("#!/bin/sh\necho 'http_access deny all' > /etc/squid/extra.conf\n"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req()
			got, err := buildInsert(req, tc.project)
			require.NoError(t, err)
			assert.Equal(t, tc.project, got.GetProject())
			assert.Equal(t, tc.wantZone, got.GetZone())

			inst := proto.CloneOf(got.GetInstanceResource())
			assert.Equal(t, map[string]string{metadataStartupScript: wantScript(t, tc.squid, tc.user)}, metadataOf(inst),
				"the startup script is squid's rendering for the request, the cloud-init data run after it")
			inst.Metadata = nil
			body, err := protojson.Marshal(inst)
			require.NoError(t, err)
			want := tc.wantBody
			if rule, err := ruleConfigFor(req, tc.project); err == nil && rule != nil {
				want = strings.NewReplacer("$RULE", rule.name(), "$DESC", rule.instanceDescription()).Replace(want)
			}
			assert.JSONEq(t, want, string(body))
			assert.NotContains(t, string(body), testPassword)
		})
	}
}

func TestBuildInsertRefuses(t *testing.T) {
	tooManyTags := minimalSpec()
	for i := range maxInstanceTags {
		tooManyTags.Tags = append(tooManyTags.Tags, v1alpha1.NetworkTag(fmt.Sprintf("tag-%d", i)))
	}
	tests := []struct {
		name      string
		req       func() provider.CreateRequest
		project   string
		wantError string
	}{
		{"no gcp block", func() provider.CreateRequest { return gcpRequest("px-e", nil) }, "proj-a", "spec.gcp"},
		{"no project anywhere", func() provider.CreateRequest { return gcpRequest("px-e", minimalSpec()) }, "", "spec.gcp.project"},
		{"missing zone", func() provider.CreateRequest {
			g := minimalSpec()
			g.Zone = ""
			return gcpRequest("px-e", g)
		}, "proj-a", "spec.gcp.zone"},
		{"missing machine type", func() provider.CreateRequest {
			g := minimalSpec()
			g.MachineType = ""
			return gcpRequest("px-e", g)
		}, "proj-a", "spec.gcp.machineType"},
		{"missing image", func() provider.CreateRequest {
			g := minimalSpec()
			g.Image = ""
			return gcpRequest("px-e", g)
		}, "proj-a", "spec.gcp.image"},
		{"missing name", func() provider.CreateRequest { return gcpRequest("", minimalSpec()) }, "proj-a", "name"},
		{"no credentials", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Credentials = proxyauth.Credentials{}
			return r
		}, "proj-a", "open proxy"},
		{"no password", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Credentials.Password = ""
			return r
		}, "proj-a", "open proxy"},
		{"no user name", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Credentials.Username = ""
			return r
		}, "proj-a", "open proxy"},
		{"egress destination not a CIDR", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Spec.Egress = &v1alpha1.Egress{AllowedDestinations: []v1alpha1.CIDR{"10.0.0.0/8", "10.1.2.3"}}
			return r
		}, "proj-a", "spec.egress.allowedDestinations[1]"},
		{"egress port out of range", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Spec.Egress = &v1alpha1.Egress{Ports: []v1alpha1.PortNumber{443, 70000}}
			return r
		}, "proj-a", "70000"},
		{"no port", func() provider.CreateRequest {
			r := gcpRequest("px-e", minimalSpec())
			r.Port = 0
			return r
		}, "proj-a", "port"},
		{"too many tags with the instance's own", func() provider.CreateRequest { return gcpRequest("px-e", tooManyTags) }, "proj-a", "spec.gcp.tags"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := buildInsert(tc.req(), tc.project)
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), tc.wantError)
			assert.NotContains(t, err.Error(), testPassword)
		})
	}
}

// A retried create must send GCE the very same instance: the request ID says "the same
// request", and the script holds a password hash whose salt must not vary.
func TestBuildInsertIsDeterministic(t *testing.T) {
	req := gcpRequest("px-a", minimalSpec())
	req.CloudInit = []byte("#!/bin/sh\necho hi\n")
	req.Spec.Egress = &v1alpha1.Egress{AllowedDestinations: []v1alpha1.CIDR{"10.20.0.0/16", "10.0.0.0/8"}, Ports: []v1alpha1.PortNumber{8443, 443}}
	first, err := buildInsert(req, "proj-a")
	require.NoError(t, err)
	for range 3 {
		again, err := buildInsert(req, "proj-a")
		require.NoError(t, err)
		assert.True(t, proto.Equal(first, again), "same request, same insert")
		assert.Equal(t, startupScriptOf(first), startupScriptOf(again))
	}

	other := req
	other.Credentials.Password = testPassword + "-other"
	differs, err := buildInsert(other, "proj-a")
	require.NoError(t, err)
	assert.NotEqual(t, startupScriptOf(first), startupScriptOf(differs), "the script carries the credentials")
}

// minimalRule is the name of the rule gcpRequest(_, minimalSpec()) needs in proj-a. It is
// written out, not computed: the name must stay the same from version to version, or an
// upgrade would give every configuration a second rule.
const minimalRule = "proxyfleet-fw-fed32018b827c945"

// The rule ruleConfigFor wants, as a table: ranges, network, port, target and ownership.
func TestBuildFirewall(t *testing.T) {
	const desc = sharedRuleDescriptionPrefix + " proxyfleet-installation=prod-eu"
	tests := []struct {
		name     string
		edit     func(*provider.CreateRequest)
		wantBody string // "" for no rule; $RULE is the rule's name
	}{
		{
			name: "minimal spec",
			edit: func(*provider.CreateRequest) {},
			wantBody: `{
				"name": "$RULE", "description": "` + desc + `",
				"network": "projects/proj-a/global/networks/default", "direction": "INGRESS", "priority": 1000,
				"sourceRanges": ["203.0.113.0/24"],
				"allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}],
				"targetTags": ["$RULE"]
			}`,
		},
		{
			name: "ranges canonical, sorted, once; the spec's network and port",
			edit: func(r *provider.CreateRequest) {
				r.Port = 8080
				r.Spec.GCP.Network = "crawl-net"
				r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "198.51.100.7/24", "192.0.2.1/32", "203.0.113.9/24"}
			},
			wantBody: `{
				"name": "$RULE", "description": "` + desc + `",
				"network": "projects/proj-a/global/networks/crawl-net", "direction": "INGRESS", "priority": 1000,
				"sourceRanges": ["192.0.2.1/32", "198.51.100.0/24", "203.0.113.0/24"],
				"allowed": [{"IPProtocol": "tcp", "ports": ["8080"]}],
				"targetTags": ["$RULE"]
			}`,
		},
		{
			name: "a network URL in the instance's project",
			edit: func(r *provider.CreateRequest) {
				r.Spec.GCP.Network = "https://www.googleapis.com/compute/v1/projects/proj-a/global/networks/crawl-net"
			},
			wantBody: `{
				"name": "$RULE", "description": "` + desc + `",
				"network": "projects/proj-a/global/networks/crawl-net",
				"direction": "INGRESS", "priority": 1000,
				"sourceRanges": ["203.0.113.0/24"],
				"allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}],
				"targetTags": ["$RULE"]
			}`,
		},
		{
			name: "internal address with ranges still gets a rule",
			edit: func(r *provider.CreateRequest) {
				r.Spec.GCP.ExternalIP = proto.Bool(false)
				r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"10.8.0.0/14"}
			},
			wantBody: `{
				"name": "$RULE", "description": "` + desc + `",
				"network": "projects/proj-a/global/networks/default", "direction": "INGRESS", "priority": 1000,
				"sourceRanges": ["10.8.0.0/14"],
				"allowed": [{"IPProtocol": "tcp", "ports": ["3128"]}],
				"targetTags": ["$RULE"]
			}`,
		},
		{
			name: "internal address without ranges: the VPC's rules decide",
			edit: func(r *provider.CreateRequest) {
				r.Spec.GCP.ExternalIP = proto.Bool(false)
				r.Spec.GCP.AllowedSourceRanges = nil
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := gcpRequest("px-a", minimalSpec())
			tc.edit(&req)
			got, err := ruleConfigFor(req, "proj-a")
			require.NoError(t, err)
			if tc.wantBody == "" {
				assert.Nil(t, got)
				return
			}
			name := got.name()
			assert.Regexp(t, `^proxyfleet-fw-[0-9a-f]{16}$`, name, "a valid rule name and network tag")
			body, err := protojson.Marshal(got.firewall())
			require.NoError(t, err)
			assert.JSONEq(t, strings.ReplaceAll(tc.wantBody, "$RULE", name), string(body))
			inst, ok := parseSharedRuleOwner(got.firewall().GetDescription())
			require.True(t, ok, "the description parses back")
			assert.Equal(t, "prod-eu", inst)
		})
	}
}

// Instances share a rule exactly when they share its configuration: any other Proxy,
// instance name, zone or spelling of the same thing gives the same rule; another port,
// range, network or installation gives another.
func TestRuleNames(t *testing.T) {
	name := func(edit func(*provider.CreateRequest)) string {
		t.Helper()
		req := gcpRequest("px-a", minimalSpec())
		edit(&req)
		c, err := ruleConfigFor(req, "proj-a")
		require.NoError(t, err)
		return c.name()
	}
	base := name(func(*provider.CreateRequest) {})
	assert.Equal(t, minimalRule, base, "the name of a configuration never changes")
	for desc, edit := range map[string]func(*provider.CreateRequest){
		"another instance":    func(r *provider.CreateRequest) { r.Name = "px-b" },
		"another Proxy":       func(r *provider.CreateRequest) { r.ProxyUID = "ffffffff-0000-0000-0000-000000000000" },
		"another zone":        func(r *provider.CreateRequest) { r.Spec.GCP.Zone = "us-central1-a" },
		"the default network": func(r *provider.CreateRequest) { r.Spec.GCP.Network = "default" },
		"the network as a URL": func(r *provider.CreateRequest) {
			r.Spec.GCP.Network = "https://compute.googleapis.com/compute/v1/projects/proj-a/global/networks/default"
		},
		"the range unmasked": func(r *provider.CreateRequest) { r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.9/24"} },
		"the range twice": func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "203.0.113.0/24"}
		},
		"no external IP":        func(r *provider.CreateRequest) { r.Spec.GCP.ExternalIP = proto.Bool(false) },
		"other tags and labels": func(r *provider.CreateRequest) { r.Spec.GCP.Tags = []v1alpha1.NetworkTag{"squid"} },
	} {
		assert.Equal(t, base, name(edit), desc)
	}
	for desc, edit := range map[string]func(*provider.CreateRequest){
		"another port":  func(r *provider.CreateRequest) { r.Port = 8080 },
		"another range": func(r *provider.CreateRequest) { r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"198.51.100.0/24"} },
		"one more range": func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = append(r.Spec.GCP.AllowedSourceRanges, "198.51.100.0/24")
		},
		"another network":      func(r *provider.CreateRequest) { r.Spec.GCP.Network = "crawl-net" },
		"another installation": func(r *provider.CreateRequest) { r.Installation = "staging" },
	} {
		assert.NotEqual(t, base, name(edit), desc)
	}
}

// An instance's description gives back its rule's configuration, and nothing that does not
// hash to the rule the instance is tagged with does.
func TestParseInstanceRule(t *testing.T) {
	req := gcpRequest("px-a", minimalSpec())
	req.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "198.51.100.0/24"}
	ins, err := buildInsert(req, "proj-a")
	require.NoError(t, err)
	want, err := ruleConfigFor(req, "proj-a")
	require.NoError(t, err)
	got, ok := parseInstanceRule(ins.GetInstanceResource(), "proj-a")
	require.True(t, ok, ins.GetInstanceResource().GetDescription())
	assert.Equal(t, *want, got)

	for name, edit := range map[string]func(*computepb.Instance){
		"no description":        func(i *computepb.Instance) { i.Description = nil },
		"a description by hand": func(i *computepb.Instance) { i.Description = proto.String("squid for the office") },
		"ranges widened": func(i *computepb.Instance) {
			i.Description = proto.String(strings.Replace(i.GetDescription(), "203.0.113.0/24", "0.0.0.0/0", 1))
		},
		"another port": func(i *computepb.Instance) {
			i.Description = proto.String(strings.Replace(i.GetDescription(), "port=3128", "port=22", 1))
		},
		"an unknown field":       func(i *computepb.Instance) { i.Description = proto.String(i.GetDescription() + " x=1") },
		"without the rule's tag": func(i *computepb.Instance) { i.Tags = nil },
		"another installation":   func(i *computepb.Instance) { i.Labels[provider.LabelInstallation] = "staging" },
		"a network in the project": func(i *computepb.Instance) {
			i.Description = proto.String(strings.Replace(i.GetDescription(), "proj-a", "proj-b", 1))
		},
	} {
		t.Run(name, func(t *testing.T) {
			inst := proto.CloneOf(ins.GetInstanceResource())
			edit(inst)
			_, ok := parseInstanceRule(inst, "proj-a")
			assert.False(t, ok, inst.GetDescription())
		})
	}
}

func TestBuildFirewallRefuses(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(*provider.CreateRequest)
		wantError string
	}{
		{"external IP by default without ranges", func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = nil
		}, "spec.gcp.allowedSourceRanges is required"},
		{"external IP asked for without ranges", func(r *provider.CreateRequest) {
			r.Spec.GCP.ExternalIP = proto.Bool(true)
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{}
		}, "spec.gcp.allowedSourceRanges is required"},
		{"a range that is not a CIDR", func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "crawlers"}
		}, "spec.gcp.allowedSourceRanges[1]"},
		{"an IPv6 range", func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"203.0.113.0/24", "2001:db8::/32"}
		}, "spec.gcp.allowedSourceRanges[1]"},
		{"an IPv4-mapped IPv6 range", func(r *provider.CreateRequest) {
			r.Spec.GCP.AllowedSourceRanges = []v1alpha1.CIDR{"::ffff:203.0.113.0/120"}
		}, "IPv6"},
		{"a Shared VPC network", func(r *provider.CreateRequest) {
			r.Spec.GCP.Network = "projects/host-proj/global/networks/shared"
		}, "host-proj"},
		{"an installation the description could not carry", func(r *provider.CreateRequest) {
			r.Installation = "prod eu"
		}, "label value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := gcpRequest("px-a", minimalSpec())
			tc.edit(&req)
			_, err := ruleConfigFor(req, "proj-a")
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
			assert.Contains(t, err.Error(), tc.wantError)
		})
	}
}

func TestRuleOwnerParsing(t *testing.T) {
	o := ruleOwner{installation: "prod-eu", uid: "u-1", zone: "us-central1-a"}
	got, ok := parseRuleOwner(o.description())
	require.True(t, ok)
	assert.Equal(t, o, got)
	assert.Equal(t, map[string]string{
		provider.LabelInstallation: "prod-eu", provider.LabelProxyUID: "u-1", provider.LabelManagedBy: provider.ManagedByValue,
	}, o.labels())

	for _, d := range []string{
		"",
		"allow squid from the office",
		ruleDescriptionPrefix,
		ruleDescriptionPrefix + " proxyfleet-installation=prod-eu proxyfleet-uid=u-1",
		ruleDescriptionPrefix + " proxyfleet-installation=prod-eu proxyfleet-uid=u-1 proxyfleet-zone=z extra=1",
		"x" + o.description(),
	} {
		_, ok := parseRuleOwner(d)
		assert.False(t, ok, d)
	}
}

// The list filters' literals are regular expressions; the prefixes must be their own
// patterns, and a filter must select exactly what it says, no more.
func TestRuleFilters(t *testing.T) {
	assert.Equal(t, ruleDescriptionPrefix, regexp.QuoteMeta(ruleDescriptionPrefix))
	assert.Equal(t, sharedRuleDescriptionPrefix, regexp.QuoteMeta(sharedRuleDescriptionPrefix))

	match := func(filter, description string) bool {
		t.Helper()
		m := regexp.MustCompile(`^description eq "([^"]*)"$`).FindStringSubmatch(filter)
		require.NotNil(t, m, filter)
		return regexp.MustCompile("^(?:" + m[1] + ")$").MatchString(description)
	}
	mine := ruleOwner{installation: "prod-eu", uid: "u-1", zone: "z"}.description()
	theirs := ruleOwner{installation: "prod-eu", uid: "u-2", zone: "z"}.description()
	staging := ruleOwner{installation: "prod-eu-2", uid: "u-1", zone: "z"}.description()
	proxy := legacyRuleFilter(provider.Owner{Installation: "prod-eu", ProxyUID: "u-1"})
	all := legacyRuleFilter(provider.Owner{Installation: "prod-eu"})
	assert.True(t, match(proxy, mine))
	assert.False(t, match(proxy, theirs), "another Proxy's")
	assert.False(t, match(proxy, staging), "another installation's")
	assert.True(t, match(all, mine))
	assert.True(t, match(all, theirs))
	assert.False(t, match(all, staging), "an installation whose ID starts like this one's")

	shared := sharedRuleFilter("prod-eu")
	assert.True(t, match(shared, sharedRuleDescription("prod-eu")))
	assert.False(t, match(shared, sharedRuleDescription("prod-eu-2")))
	assert.False(t, match(shared, mine))
	assert.False(t, match(all, sharedRuleDescription("prod-eu")))
}
