package v1alpha1_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m, testenv.Options{Kube: true}))
}

// newNamespace gives each test its own namespace so objects never collide.
func newNamespace(t *testing.T) string {
	t.Helper()
	k := testenv.Kube(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "validation-"}}
	require.NoError(t, k.Client.Create(context.Background(), ns))
	return ns.Name
}

// readObjects decodes every document of a multi-document YAML file.
func readObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs
		}
		require.NoError(t, err, path)
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

func TestSamplesAreAccepted(t *testing.T) {
	k := testenv.Kube(t)
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	files, err := filepath.Glob(filepath.Join(root, "deploy", "samples", "*.yaml"))
	require.NoError(t, err)

	// The design promises one sample per way of running a proxy.
	seen := map[string]bool{}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			ns := newNamespace(t)
			for _, obj := range readObjects(t, file) {
				obj.SetNamespace(ns)
				require.NoError(t, k.Client.Create(context.Background(), obj), "%s %s", obj.GetKind(), obj.GetName())
				if obj.GetKind() != "Proxy" {
					continue
				}
				var p v1alpha1.Proxy
				require.NoError(t, k.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), &p))
				kind := string(p.Spec.Mode)
				if p.Spec.Mode == v1alpha1.ModeManaged {
					kind += "/" + string(p.Spec.Provider)
				}
				seen[kind] = true
				// Defaults are applied by the API server, so every consumer sees them.
				assert.Equal(t, int32(2), p.Spec.HealthCheck.SuccessThreshold)
				assert.Equal(t, int32(3), p.Spec.HealthCheck.FailureThreshold)
				assert.Equal(t, int32(200), p.Spec.HealthCheck.ExpectedStatus)
				assert.NotEmpty(t, p.Spec.HealthCheck.Interval)
				assert.NotEmpty(t, p.Spec.HealthCheck.Timeout)
				assert.GreaterOrEqual(t, p.Spec.MaxLeases, int32(1))
			}
		})
	}
	for _, want := range []string{"Managed/aws", "Managed/gcp", "Managed/kubernetes", "Managed/local", "External"} {
		assert.True(t, seen[want], "no sample for %s in deploy/samples", want)
	}
}

// createProxy creates a Proxy whose spec is given as YAML and returns the API server's error.
func createProxy(t *testing.T, ns, name, specYAML string) error {
	t.Helper()
	var spec map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(specYAML), &spec))
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "Proxy",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
	return testenv.Kube(t).Client.Create(context.Background(), u)
}

func TestDefaults(t *testing.T) {
	k := testenv.Kube(t)
	ns := newNamespace(t)
	require.NoError(t, createProxy(t, ns, "minimal", `
provider: kubernetes
kubernetes: {}
healthCheck: {url: "http://127.0.0.1:1/"}
`))
	var p v1alpha1.Proxy
	require.NoError(t, k.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "minimal"}, &p))
	assert.Equal(t, v1alpha1.ModeManaged, p.Spec.Mode)
	// The schema's defaults are the ones code applies to specs built without the API server.
	interval, err := p.Spec.HealthCheck.Interval.ParseDuration(0)
	require.NoError(t, err)
	assert.Equal(t, v1alpha1.DefaultHealthCheckInterval, interval)
	timeout, err := p.Spec.HealthCheck.Timeout.ParseDuration(0)
	require.NoError(t, err)
	assert.Equal(t, v1alpha1.DefaultHealthCheckTimeout, timeout)
	assert.EqualValues(t, v1alpha1.DefaultSuccessThreshold, p.Spec.HealthCheck.SuccessThreshold)
	assert.EqualValues(t, v1alpha1.DefaultFailureThreshold, p.Spec.HealthCheck.FailureThreshold)
	assert.EqualValues(t, v1alpha1.DefaultExpectedStatus, p.Spec.HealthCheck.ExpectedStatus)
	assert.EqualValues(t, v1alpha1.DefaultMaxLeases, p.Spec.MaxLeases)
	assert.Equal(t, v1alpha1.DefaultSquidImage, p.Spec.Kubernetes.Image)
	assert.Equal(t, v1alpha1.DefaultManagedPort, p.Spec.EffectivePort())
}

func TestInvalidProxiesAreRejected(t *testing.T) {
	ns := newNamespace(t)
	const hc = `healthCheck: {url: "http://127.0.0.1:1/"}`
	cases := []struct {
		name, spec, want string
	}{
		{"external without endpoint", "mode: External\n" + hc,
			"External proxies need spec.endpoint (host and port)"},
		{"external with provider", "mode: External\nendpoint: {host: a.example, port: 8080}\nprovider: local\n" + hc,
			"External proxies take no spec.provider"},
		{"external with cloudInit", "mode: External\nendpoint: {host: a.example, port: 8080}\ncloudInit: {secretRef: {name: s, key: k}}\n" + hc,
			"spec.cloudInit is for Managed proxies only"},
		{"external with provider block", "mode: External\nendpoint: {host: a.example, port: 8080}\ngcp: {zone: us-central1-a, machineType: e2-micro, image: img}\n" + hc,
			"External proxies take no provider block"},
		{"external with port", "mode: External\nendpoint: {host: a.example, port: 8080}\nport: 3128\n" + hc,
			"spec.port is for Managed proxies; External proxies set spec.endpoint.port"},
		{"external with lifecycle", "mode: External\nendpoint: {host: a.example, port: 8080}\nlifecycle: {maxAge: 1h}\n" + hc,
			"spec.lifecycle is for Managed proxies only"},
		{"external endpoint is a URL", "mode: External\nendpoint: {host: 'http://a.example', port: 8080}\n" + hc,
			"endpoint.host must be a DNS name or an IP address"},
		{"external endpoint is host:port", "mode: External\nendpoint: {host: 'a.example:8080', port: 8080}\n" + hc,
			"endpoint.host must be a DNS name or an IP address"},
		{"external endpoint in brackets", "mode: External\nendpoint: {host: '[::1]', port: 8080}\n" + hc,
			"endpoint.host must be a DNS name or an IP address (IPv6 without brackets)"},
		{"external endpoint with an empty label", "mode: External\nendpoint: {host: 'a..example', port: 8080}\n" + hc,
			"endpoint.host must be a DNS name or an IP address"},
		{"duration too large to evaluate", "provider: local\nlocal: {}\nlifecycle: {maxAge: 99999999999h}\n" + hc,
			"spec.lifecycle.maxAge in body should match"},
		{"duration too long", "provider: local\nlocal: {}\nlifecycle: {maxAge: 1h1h1h1h1h1h1h1h1h}\n" + hc,
			"spec.lifecycle.maxAge: Too long"},
		{"managed without provider", "local: {}\n" + hc,
			"Managed proxies need spec.provider"},
		{"managed with endpoint", "provider: local\nlocal: {}\nendpoint: {host: a.example, port: 8080}\n" + hc,
			"spec.endpoint is for External proxies"},
		{"gcp without block", "provider: gcp\n" + hc,
			"provider gcp needs the spec.gcp block"},
		{"kubernetes without block", "provider: kubernetes\n" + hc,
			"provider kubernetes needs the spec.kubernetes block"},
		{"local without block", "provider: local\n" + hc,
			"provider local needs the spec.local block"},
		{"two provider blocks", "provider: local\nlocal: {}\nkubernetes: {}\n" + hc,
			"set only the block of spec.provider"},
		{"unknown provider", "provider: azure\n" + hc,
			`Unsupported value: "azure"`},
		{"aws without block", "provider: aws\n" + hc,
			"provider aws needs the spec.aws block"},
		{"aws without region", "provider: aws\naws: {associatePublicIP: false}\n" + hc,
			"spec.aws.region: Required value"},
		{"aws region not a region", "provider: aws\naws: {region: eu-west-1a, associatePublicIP: false}\n" + hc,
			"spec.aws.region in body should match"},
		{"aws public IP without source ranges", "provider: aws\naws: {region: eu-west-1}\n" + hc,
			"spec.aws.allowedSourceRanges is required when the instance has a public IP"},
		{"aws public IP with empty source ranges", "provider: aws\naws: {region: eu-west-1, associatePublicIP: true, allowedSourceRanges: []}\n" + hc,
			"spec.aws.allowedSourceRanges is required when the instance has a public IP"},
		{"aws source range not a CIDR", "provider: aws\naws: {region: eu-west-1, allowedSourceRanges: ['203.0.113.7']}\n" + hc,
			`spec.aws.allowedSourceRanges[0]: Invalid value: "203.0.113.7": must be a CIDR`},
		{"aws ami neither ID nor parameter", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, ami: debian-12}\n" + hc,
			"spec.aws.ami must be an image ID such as ami-0123456789abcdef0 or an SSM parameter name"},
		{"aws ami with a short ID", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, ami: ami-123}\n" + hc,
			"spec.aws.ami must be an image ID"},
		{"aws instance type", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, instanceType: 'T3 micro'}\n" + hc,
			"spec.aws.instanceType in body should match"},
		{"aws subnet", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, subnetID: my-subnet}\n" + hc,
			"spec.aws.subnetID in body should match"},
		{"aws security group", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, securityGroupIDs: [default]}\n" + hc,
			"spec.aws.securityGroupIDs[0] in body should match"},
		{"aws too many security groups", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, securityGroupIDs: [sg-00000001, sg-00000002, sg-00000003, sg-00000004, sg-00000005]}\n" + hc,
			"spec.aws.securityGroupIDs: Too many"},
		{"aws instance profile", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, instanceProfile: 'my profile'}\n" + hc,
			"spec.aws.instanceProfile in body should match"},
		{"aws reserved tag", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, tags: {proxyfleet-uid: x}}\n" + hc,
			"not start with the reserved prefixes proxyfleet- or aws:"},
		{"aws tag of AWS's", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, tags: {'aws:cloudformation:stack-name': x}}\n" + hc,
			"not start with the reserved prefixes proxyfleet- or aws:"},
		{"aws Name tag", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, tags: {Name: x}}\n" + hc,
			"nor be Name"},
		{"aws tag value too long", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false, tags: {team: '" + strings.Repeat("x", 257) + "'}}\n" + hc,
			"aws.tags values must be at most 256 characters"},
		{"aws and gcp blocks", "provider: aws\naws: {region: eu-west-1, associatePublicIP: false}\ngcp: {zone: us-central1-a, machineType: e2-micro, image: img, externalIP: false}\n" + hc,
			"set only the block of spec.provider (one of aws, gcp, kubernetes, local)"},
		{"external with aws block", "mode: External\nendpoint: {host: a.example, port: 8080}\naws: {region: eu-west-1}\n" + hc,
			"External proxies take no provider block (aws, gcp, kubernetes, local)"},
		{"gcp without zone", "provider: gcp\ngcp: {machineType: e2-micro, image: img, externalIP: false}\n" + hc,
			"spec.gcp.zone: Required value"},
		{"gcp external IP without source ranges", "provider: gcp\ngcp: {zone: us-central1-a, machineType: e2-micro, image: img}\n" + hc,
			"spec.gcp.allowedSourceRanges is required when the instance has an external IP"},
		{"gcp external IP with empty source ranges", "provider: gcp\ngcp: {zone: us-central1-a, machineType: e2-micro, image: img, externalIP: true, allowedSourceRanges: []}\n" + hc,
			"spec.gcp.allowedSourceRanges is required when the instance has an external IP"},
		{"gcp subnetwork without network", "provider: gcp\ngcp: {zone: us-central1-a, machineType: e2-micro, image: img, subnetwork: crawl-sub, allowedSourceRanges: ['203.0.113.0/24']}\n" + hc,
			"spec.gcp.network is required with spec.gcp.subnetwork and spec.gcp.allowedSourceRanges"},
		{"gcp source range not a CIDR", "provider: gcp\ngcp: {zone: us-central1-a, machineType: e2-micro, image: img, allowedSourceRanges: ['203.0.113.7']}\n" + hc,
			`spec.gcp.allowedSourceRanges[0]: Invalid value: "203.0.113.7": must be a CIDR`},
		{"gcp reserved label", "provider: gcp\ngcp: {zone: us-central1-a, machineType: e2-micro, image: img, allowedSourceRanges: ['203.0.113.0/24'], labels: {proxyfleet-uid: x}}\n" + hc,
			"not start with the reserved prefix proxyfleet-"},
		{"port too large", "provider: local\nlocal: {}\nport: 70000\n" + hc,
			"spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535"},
		{"endpoint port zero", "mode: External\nendpoint: {host: a.example, port: 0}\n" + hc,
			"spec.endpoint.port in body should be greater than or equal to 1"},
		{"timeout not below interval", "provider: local\nlocal: {}\nhealthCheck: {url: 'http://127.0.0.1:1/', interval: 5s, timeout: 5s}",
			"healthCheck.timeout must be shorter than healthCheck.interval"},
		{"interval below 1s", "provider: local\nlocal: {}\nhealthCheck: {url: 'http://127.0.0.1:1/', interval: 500ms, timeout: 100ms}",
			"healthCheck.interval must be at least 1s"},
		{"duration not parseable", "provider: local\nlocal: {}\nhealthCheck: {url: 'http://127.0.0.1:1/', interval: 10 seconds}",
			"spec.healthCheck.interval in body should match"},
		{"url not http", "provider: local\nlocal: {}\nhealthCheck: {url: 'ftp://127.0.0.1/x'}",
			"healthCheck.url must be an absolute http or https URL"},
		{"url relative", "provider: local\nlocal: {}\nhealthCheck: {url: '/healthz'}",
			"healthCheck.url must be an absolute http or https URL"},
		{"health check missing", "provider: local\nlocal: {}",
			"spec.healthCheck: Required value"},
		{"failure threshold zero", "provider: local\nlocal: {}\nhealthCheck: {url: 'http://127.0.0.1:1/', failureThreshold: 0}",
			"spec.healthCheck.failureThreshold in body should be greater than or equal to 1"},
		{"success threshold zero", "provider: local\nlocal: {}\nhealthCheck: {url: 'http://127.0.0.1:1/', successThreshold: 0}",
			"spec.healthCheck.successThreshold in body should be greater than or equal to 1"},
		{"expected status out of range", "provider: local\nlocal: {}\nhealthCheck: {url: 'http://127.0.0.1:1/', expectedStatus: 700}",
			"spec.healthCheck.expectedStatus in body should be less than or equal to 599"},
		{"maxAge below 10m", "provider: local\nlocal: {}\nlifecycle: {maxAge: 5m}\n" + hc,
			"lifecycle.maxAge must be at least 10m"},
		{"banWindow without targets", "provider: local\nlocal: {}\nlifecycle: {banWindow: 1h}\n" + hc,
			"lifecycle.banWindow needs lifecycle.banReplaceTargets"},
		{"banReplaceTargets zero", "provider: local\nlocal: {}\nlifecycle: {banReplaceTargets: 0}\n" + hc,
			"spec.lifecycle.banReplaceTargets in body should be greater than or equal to 1"},
		{"banReplaceTargets above what a workflow keeps", "provider: local\nlocal: {}\nlifecycle: {banReplaceTargets: 257}\n" + hc,
			"spec.lifecycle.banReplaceTargets in body should be less than or equal to 256"},
		{"attribute key invalid", "provider: local\nlocal: {}\nattributes: {'Region!': x}\n" + hc,
			"attribute keys must be 1-63 lowercase alphanumerics"},
		{"attribute value invalid", "provider: local\nlocal: {}\nattributes: {region: 'us central'}\n" + hc,
			"attribute values must be at most 63 alphanumerics"},
		{"maxLeases zero", "provider: local\nlocal: {}\nmaxLeases: 0\n" + hc,
			"spec.maxLeases in body should be greater than or equal to 1"},
		{"external with egress", "mode: External\nendpoint: {host: a.example, port: 8080}\negress: {ports: [443]}\n" + hc,
			"spec.egress is for Managed proxies only"},
		{"egress destination not a CIDR", "provider: local\nlocal: {}\negress: {allowedDestinations: ['10.0.0.1']}\n" + hc,
			`spec.egress.allowedDestinations[0]: Invalid value: "10.0.0.1": must be a CIDR`},
		{"egress destination a hostname", "provider: local\nlocal: {}\negress: {allowedDestinations: ['10.0.0.0/8', 'metadata.google.internal']}\n" + hc,
			`spec.egress.allowedDestinations[1]: Invalid value: "metadata.google.internal": must be a CIDR`},
		{"egress port zero", "provider: local\nlocal: {}\negress: {ports: [443, 0]}\n" + hc,
			"spec.egress.ports[1] in body should be greater than or equal to 1"},
		{"egress port too large", "provider: local\nlocal: {}\negress: {ports: [65536]}\n" + hc,
			"spec.egress.ports[0] in body should be less than or equal to 65535"},
		{"egress port twice", "provider: local\nlocal: {}\negress: {ports: [443, 443]}\n" + hc,
			"spec.egress.ports[1]: Duplicate value: 443"},
		{"credentials Secret name invalid", "mode: External\nendpoint: {host: a.example, port: 8080, credentialsSecretRef: {name: 'Not_A_Name'}}\n" + hc,
			"spec.endpoint.credentialsSecretRef.name in body should match"},
		{"credentials Secret without name", "mode: External\nendpoint: {host: a.example, port: 8080, credentialsSecretRef: {}}\n" + hc,
			"spec.endpoint.credentialsSecretRef.name: Required value"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := createProxy(t, ns, "invalid-"+strconv.Itoa(i), tc.spec)
			require.Error(t, err, "the API server accepted an invalid Proxy")
			assert.True(t, apierrors.IsInvalid(err), "want 422 Invalid, got %v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestModeIsImmutable(t *testing.T) {
	k := testenv.Kube(t)
	ns := newNamespace(t)
	require.NoError(t, createProxy(t, ns, "flip", "provider: local\nlocal: {}\nhealthCheck: {url: 'http://127.0.0.1:1/'}"))
	var p v1alpha1.Proxy
	require.NoError(t, k.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "flip"}, &p))
	p.Spec = v1alpha1.ProxySpec{
		Mode:        v1alpha1.ModeExternal,
		Endpoint:    &v1alpha1.Endpoint{Host: "a.example", Port: 8080},
		HealthCheck: p.Spec.HealthCheck,
		MaxLeases:   p.Spec.MaxLeases,
	}
	err := k.Client.Update(context.Background(), &p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.mode is immutable; create a new Proxy instead")

	// Other edits remain allowed.
	require.NoError(t, k.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "flip"}, &p))
	p.Spec.Attributes = map[string]v1alpha1.AttributeValue{"region": "local"}
	require.NoError(t, k.Client.Update(context.Background(), &p))
}

// TestAWSDefaults: only the region is needed; the API server fills in the smallest
// general-purpose type, Debian 12's image parameter and a public IP, and a private instance
// needs no source ranges.
func TestAWSDefaults(t *testing.T) {
	k := testenv.Kube(t)
	ns := newNamespace(t)
	require.NoError(t, createProxy(t, ns, "aws-private", `
provider: aws
aws: {region: us-gov-west-1, associatePublicIP: false, ami: ami-0123456789abcdef0, securityGroupIDs: [sg-0123456789abcdef0],
  instanceProfile: 'arn:aws:iam::123456789012:instance-profile/proxy', tags: {team: crawl}}
healthCheck: {url: "http://127.0.0.1:1/"}
`))
	require.NoError(t, createProxy(t, ns, "aws-public", `
provider: aws
aws: {region: eu-west-1, allowedSourceRanges: ["203.0.113.0/24", "2001:db8::/32"]}
healthCheck: {url: "http://127.0.0.1:1/"}
`))
	var p v1alpha1.Proxy
	require.NoError(t, k.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "aws-public"}, &p))
	require.NotNil(t, p.Spec.AWS)
	assert.Equal(t, "t3.micro", p.Spec.AWS.InstanceType)
	assert.Equal(t, "/aws/service/debian/release/12/latest/amd64", p.Spec.AWS.AMI)
	assert.True(t, *p.Spec.AWS.AssociatePublicIP)
	assert.Equal(t, v1alpha1.DefaultManagedPort, p.Spec.EffectivePort())
}

// TestCRDPrinterColumns checks that `kubectl get proxies` shows what the docs promise.
func TestCRDPrinterColumns(t *testing.T) {
	root, err := testenv.RepoRoot()
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(root, "deploy", "crd", "crawl.example.com_proxies.yaml"))
	require.NoError(t, err)
	for _, col := range []string{"name: Phase", "name: IP", "name: Healthy", "name: Latency", "name: Age", "- px"} {
		assert.True(t, bytes.Contains(raw, []byte(col)), "CRD lacks %q", col)
	}
}

// TestEndpointHostsThatCanBeDialled: DNS names, IPv4 and IPv6 addresses (without brackets)
// are accepted as an External endpoint's host.
func TestEndpointHostsThatCanBeDialled(t *testing.T) {
	ns := newNamespace(t)
	for i, host := range []string{"proxy.example.com", "proxy-1.eu.example.", "10.1.2.3", "::1", "2001:db8::7", "localhost"} {
		spec := "mode: External\nendpoint: {host: '" + host + "', port: 8080}\nhealthCheck: {url: 'http://127.0.0.1:1/'}"
		assert.NoError(t, createProxy(t, ns, "host-"+strconv.Itoa(i), spec), host)
	}
}
