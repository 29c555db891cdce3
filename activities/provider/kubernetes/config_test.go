package kubernetes

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid/squidtest"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// includeLine is how the rendered squid.conf pulls in the user's cloud-init file.
const includeLine = "include /etc/squid/proxyfleet-user.conf\n"

func TestRenderConfig(t *testing.T) {
	tests := []struct {
		name string
		edit func(*provider.CreateRequest)
		// want are lines the squid.conf holds; absent are lines it must not.
		want, absent []string
		include      bool
	}{
		{
			name: "defaults",
			edit: func(*provider.CreateRequest) {},
			want: []string{
				"http_port 3128",
				"acl proxyfleet_ports port 80 443",
				"http_access deny proxyfleet_denied",
			},
			absent: []string{"acl proxyfleet_allowed dst"},
		},
		{
			name: "port from the spec when the request has none",
			edit: func(r *provider.CreateRequest) { r.Port, r.Spec.Port = 0, 8080 },
			want: []string{"http_port 8080"},
		},
		{
			name: "egress ports and allowed destinations",
			edit: func(r *provider.CreateRequest) {
				r.Spec.Egress = &v1alpha1.Egress{
					Ports:               []v1alpha1.PortNumber{8443, 443, 80},
					AllowedDestinations: []v1alpha1.CIDR{"10.20.0.0/16", "fd00:1::/64"},
				}
			},
			want: []string{
				"acl proxyfleet_ports port 80 443 8443",
				"acl proxyfleet_allowed dst 10.20.0.0/16 fd00:1::/64",
				"http_access deny proxyfleet_denied !proxyfleet_allowed",
			},
			absent: []string{"acl proxyfleet_ports port 80 443\n"},
		},
		{
			name: "cloud-init becomes an include",
			edit: func(r *provider.CreateRequest) {
				r.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "s", Key: "k"}}
				r.CloudInit = []byte("acl secret-looking-data src all\n")
			},
			include: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := baseRequest()
			tc.edit(&req)
			files, err := renderConfig(req)
			require.NoError(t, err)
			conf := string(files.Conf)

			// Whatever the spec, the rules that make it a closed proxy are there, in order:
			// credentials first, then the refusals, then (if any) the user's additions, then
			// the only allow.
			order := []string{
				"auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/passwd\n",
				"http_access deny !proxyfleet_users\n",
				"http_access deny !proxyfleet_ports\n",
				"http_access deny proxyfleet_denied",
				"http_access allow proxyfleet_users\n",
				"http_access deny all\n",
			}
			if tc.include {
				order = append(order[:4], append([]string{includeLine}, order[4:]...)...)
			} else {
				assert.NotContains(t, conf, "include ")
			}
			at := 0
			for _, l := range order {
				i := strings.Index(conf[at:], l)
				require.GreaterOrEqual(t, i, 0, "%q missing or out of order in:\n%s", l, conf)
				at += i + len(l)
			}
			for _, l := range tc.want {
				assert.Contains(t, conf, l+"\n")
			}
			for _, l := range tc.absent {
				assert.NotContains(t, conf, l)
			}
			assert.NotContains(t, conf, "secret-looking-data", "the provider never reads the cloud-init data")

			assert.True(t, strings.HasPrefix(string(files.Passwd), proxyauth.ManagedUsername+":$1$"), "an MD5-crypt line: %q", files.Passwd)
			for _, f := range [][]byte{files.Conf, files.Passwd} {
				assert.NotContains(t, string(f), passwordCanary)
			}
		})
	}
}

func TestRenderConfigRefusesWhatSquidCannotEnforce(t *testing.T) {
	for _, cidr := range []v1alpha1.CIDR{"10.20.0.0", "not a network", "::ffff:0:0/80"} {
		t.Run(string(cidr), func(t *testing.T) {
			req := baseRequest()
			req.Spec.Egress = &v1alpha1.Egress{AllowedDestinations: []v1alpha1.CIDR{cidr}}
			_, err := renderConfig(req)
			assert.Error(t, err)
		})
	}
	req := baseRequest()
	req.Credentials.Password = ""
	_, err := renderConfig(req)
	assert.Error(t, err, "no password")
}

func TestBuildConfigSecret(t *testing.T) {
	req := baseRequest()
	req.Spec.Kubernetes.Namespace = "egress"
	files, err := renderConfig(req)
	require.NoError(t, err)
	secret := buildConfigSecret(req, files)

	assert.Equal(t, "px-abc-0-squid", secret.Name)
	assert.Equal(t, "egress", secret.Namespace, "beside the pod, which can mount only Secrets of its namespace")
	assert.Equal(t, corev1.SecretTypeOpaque, secret.Type)
	assert.Equal(t, map[string][]byte{"squid.conf": files.Conf, "passwd": files.Passwd}, secret.Data)
	assert.Equal(t, wantLabels(req), secret.Labels)
}

func TestBuildNetworkPolicy(t *testing.T) {
	tcp := corev1.ProtocolTCP
	// The default peer: every pod of the Proxy's namespace.
	proxyNamespace := networkingv1.NetworkPolicyPeer{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "proxies"}},
		PodSelector:       &metav1.LabelSelector{},
	}
	crawlers := networkingv1.NetworkPolicyPeer{
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "crawler"}},
	}
	office := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24"}}
	worker := WorkerPeer("fleet", map[string]string{"app": "proxyfleet-worker"})
	tests := []struct {
		name      string
		edit      func(*provider.CreateRequest)
		probeFrom []networkingv1.NetworkPolicyPeer
		namespace string
		port      int32
		from      []networkingv1.NetworkPolicyPeer
	}{
		{
			name:      "defaults: the Proxy's namespace",
			edit:      func(*provider.CreateRequest) {},
			namespace: "proxies", port: 3128,
			from: []networkingv1.NetworkPolicyPeer{proxyNamespace},
		},
		{
			name:      "no kubernetes block; the worker probes",
			edit:      func(r *provider.CreateRequest) { r.Spec.Kubernetes, r.Port, r.Spec.Port = nil, 0, 8080 },
			probeFrom: worker,
			namespace: "proxies", port: 8080,
			from: []networkingv1.NetworkPolicyPeer{proxyNamespace, worker[0]},
		},
		{
			// Still the Proxy's namespace: its pods are the Proxy's clients, wherever the
			// Squid pod runs.
			name:      "pod in another namespace",
			edit:      func(r *provider.CreateRequest) { r.Spec.Kubernetes.Namespace = "egress" },
			probeFrom: worker,
			namespace: "egress", port: 3128,
			from: []networkingv1.NetworkPolicyPeer{proxyNamespace, worker[0]},
		},
		{
			name: "allowed clients replace the default",
			edit: func(r *provider.CreateRequest) {
				r.Spec.Kubernetes.AllowedClients = []networkingv1.NetworkPolicyPeer{crawlers, office}
			},
			probeFrom: worker,
			namespace: "proxies", port: 3128,
			from: []networkingv1.NetworkPolicyPeer{crawlers, office, worker[0]},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := baseRequest()
			tc.edit(&req)
			policy := buildNetworkPolicy(req, tc.probeFrom)

			assert.Equal(t, req.Name, policy.Name)
			assert.Equal(t, tc.namespace, policy.Namespace)
			assert.Equal(t, req.ProxyUID, policy.Labels[provider.LabelProxyUID])
			assert.Equal(t, req.Installation, policy.Labels[provider.LabelInstallation])
			port := intstr.FromInt32(tc.port)
			assert.Equal(t, networkingv1.NetworkPolicySpec{
				// This instance's pod only: during a replacement the Proxy's other pod has
				// a policy of its own.
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"proxyfleet-instance": req.Name}},
				// Ingress only: where Squid may connect is squid.conf's business.
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
					From:  tc.from,
				}},
			}, policy.Spec)
			assert.Equal(t, req.Name, buildPod(req).Labels["proxyfleet-instance"], "the pod carries what the policy selects")
		})
	}
}

func TestBuildNetworkPolicyDoesNotAlias(t *testing.T) {
	req := baseRequest()
	req.Spec.Kubernetes.AllowedClients = []networkingv1.NetworkPolicyPeer{{
		PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "crawler"}},
	}}
	probeFrom := WorkerPeer("fleet", map[string]string{"app": "worker"})
	policy := buildNetworkPolicy(req, probeFrom)
	for _, p := range policy.Spec.Ingress[0].From {
		p.PodSelector.MatchLabels["app"] = "changed"
	}
	assert.Equal(t, "crawler", req.Spec.Kubernetes.AllowedClients[0].PodSelector.MatchLabels["app"])
	assert.Equal(t, "worker", probeFrom[0].PodSelector.MatchLabels["app"])
}

func TestWorkerPeer(t *testing.T) {
	assert.Nil(t, WorkerPeer("", map[string]string{"app": "worker"}), "a worker outside the cluster has no peer")
	assert.Equal(t, []networkingv1.NetworkPolicyPeer{{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "fleet"}},
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "worker"}},
	}}, WorkerPeer("fleet", map[string]string{"app": "worker"}))
}

// TestRenderedConfigParses: the real Squid accepts what a typical pod runs, without a
// warning (Squid warns, and drops a range, when an ACL's ranges overlap).
func TestRenderedConfigParses(t *testing.T) {
	req := baseRequest()
	req.Port = v1alpha1.DefaultManagedPort
	req.Spec.Egress = &v1alpha1.Egress{
		Ports:               []v1alpha1.PortNumber{80, 443, 8080},
		AllowedDestinations: []v1alpha1.CIDR{"10.20.0.0/16"},
	}
	req.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "squid-extra", Key: "conf"}}
	files, err := renderConfig(req)
	require.NoError(t, err)

	// Squid refuses an include that matches no file, and the pod's include path is the
	// kubelet's mount, absent here: only that path is pointed at a file of the test's,
	// holding what a user might add. Everything else is parsed as the pod gets it.
	user := filepath.Join(t.TempDir(), "proxyfleet-user.conf")
	require.NoError(t, os.WriteFile(user, []byte("acl office src 192.0.2.0/24\nhttp_access deny !office\n"), 0o644))
	require.Equal(t, 1, bytes.Count(files.Conf, []byte(includeLine)))
	conf := bytes.Replace(files.Conf, []byte(includeLine), []byte("include "+user+"\n"), 1)

	out := squidtest.Parse(t, conf)
	for l := range strings.Lines(out) {
		if strings.Contains(l, "HTTP requires the use of Via") {
			continue // via off is the point
		}
		for _, bad := range []string{"WARNING", "ERROR", "FATAL"} {
			assert.NotContains(t, l, bad)
		}
	}
}
