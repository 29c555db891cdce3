package kubernetes

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

func baseRequest() provider.CreateRequest {
	return provider.CreateRequest{
		Name:         "px-abc-0",
		ProxyUID:     "0b7c0d1e-8a2f-4c55-9d3e-5f6a7b8c9d0e",
		Installation: "prod",
		Namespace:    "proxies",
		Port:         3128,
		Spec: v1alpha1.ProxySpec{
			Provider:   v1alpha1.ProviderKubernetes,
			Kubernetes: &v1alpha1.KubernetesSpec{},
		},
		Credentials: proxyauth.Credentials{Username: proxyauth.ManagedUsername, Password: passwordCanary},
		KeyID:       "0123abcd",
	}
}

// passwordCanary is baseRequest's password: it must appear in nothing the provider builds.
const passwordCanary = "pod-canary-Zq7x"

func TestBuildPod(t *testing.T) {
	resources := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
	}
	tests := []struct {
		name      string
		edit      func(*provider.CreateRequest)
		namespace string
		image     string
		port      int32
		resources corev1.ResourceRequirements
		// secret and key of the user's configuration, mounted beside the rendered one;
		// empty for none.
		secret, key string
	}{
		{
			name:      "defaults",
			edit:      func(*provider.CreateRequest) {},
			namespace: "proxies",
			image:     v1alpha1.DefaultSquidImage,
			port:      3128,
		},
		{
			name: "image, namespace, port and resources from the spec",
			edit: func(r *provider.CreateRequest) {
				r.Spec.Kubernetes = &v1alpha1.KubernetesSpec{
					Image: "registry.example/squid:7", Namespace: "egress", Resources: resources,
				}
				r.Spec.Port, r.Port = 8080, 8080
			},
			namespace: "egress",
			image:     "registry.example/squid:7",
			port:      8080,
			resources: resources,
		},
		{
			name: "no kubernetes block and no port in the request",
			edit: func(r *provider.CreateRequest) {
				r.Spec.Kubernetes, r.Port = nil, 0
			},
			namespace: "proxies",
			image:     v1alpha1.DefaultSquidImage,
			port:      v1alpha1.DefaultManagedPort,
		},
		{
			name: "cloud-init Secret mounted as the included file; its data ignored",
			edit: func(r *provider.CreateRequest) {
				r.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "squid-cfg", Key: "conf"}}
				r.CloudInit = []byte("http_port 3128 # secret")
			},
			namespace: "proxies",
			image:     v1alpha1.DefaultSquidImage,
			port:      3128,
			secret:    "squid-cfg",
			key:       "conf",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := baseRequest()
			tc.edit(&req)
			pod := buildPod(req)

			assert.Equal(t, req.Name, pod.Name)
			assert.Equal(t, tc.namespace, pod.Namespace)
			assert.Equal(t, wantLabels(req), pod.Labels)

			spec := pod.Spec
			assert.Equal(t, corev1.RestartPolicyAlways, spec.RestartPolicy)
			require.NotNil(t, spec.AutomountServiceAccountToken)
			assert.False(t, *spec.AutomountServiceAccountToken)
			require.NotNil(t, spec.TerminationGracePeriodSeconds)
			assert.LessOrEqual(t, *spec.TerminationGracePeriodSeconds, int64(30))

			require.Len(t, spec.Containers, 1)
			c := spec.Containers[0]
			assert.Equal(t, "squid", c.Name)
			assert.Equal(t, tc.image, c.Image)
			assert.Equal(t, []corev1.ContainerPort{{Name: "proxy", ContainerPort: tc.port, Protocol: corev1.ProtocolTCP}}, c.Ports)
			assert.Equal(t, tc.resources, c.Resources)
			assert.Empty(t, c.Env, "nothing, and no Secret data, goes through the environment")
			assert.Empty(t, c.Command, "the image's entrypoint starts Squid")

			require.NotNil(t, c.ReadinessProbe)
			require.NotNil(t, c.ReadinessProbe.TCPSocket)
			assert.Equal(t, tc.port, c.ReadinessProbe.TCPSocket.Port.IntVal)

			sc := c.SecurityContext
			require.NotNil(t, sc)
			require.NotNil(t, sc.AllowPrivilegeEscalation)
			assert.False(t, *sc.AllowPrivilegeEscalation)
			require.NotNil(t, sc.Capabilities)
			assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
			assert.ElementsMatch(t, []corev1.Capability{"SETUID", "SETGID"}, sc.Capabilities.Add)
			require.NotNil(t, sc.SeccompProfile)
			assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type)

			// Every pod reads the configuration rendered for it, from its own Secret.
			mode := int32(0o444)
			volumes := []corev1.Volume{{
				Name: "squid-config",
				VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName: req.Name + "-squid", DefaultMode: &mode,
				}},
			}}
			mounts := []corev1.VolumeMount{
				{Name: "squid-config", MountPath: "/etc/squid/squid.conf", SubPath: "squid.conf", ReadOnly: true},
				{Name: "squid-config", MountPath: "/etc/squid/passwd", SubPath: "passwd", ReadOnly: true},
			}
			if tc.secret != "" {
				volumes = append(volumes, corev1.Volume{
					Name: "squid-user-config",
					VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
						SecretName:  tc.secret,
						Items:       []corev1.KeyToPath{{Key: tc.key, Path: "proxyfleet-user.conf"}},
						DefaultMode: &mode,
					}},
				})
				mounts = append(mounts, corev1.VolumeMount{
					Name: "squid-user-config", MountPath: "/etc/squid/proxyfleet-user.conf", SubPath: "proxyfleet-user.conf", ReadOnly: true,
				})
			}
			assert.Equal(t, volumes, spec.Volumes)
			assert.Equal(t, mounts, c.VolumeMounts)

			raw, err := json.Marshal(pod)
			require.NoError(t, err)
			assert.NotContains(t, string(raw), passwordCanary)
			assert.NotContains(t, string(raw), "# secret", "the cloud-init data is the kubelet's to mount, not the pod spec's")
		})
	}
}

func TestBuildPodDoesNotAliasTheRequest(t *testing.T) {
	req := baseRequest()
	req.Spec.Kubernetes.Resources = corev1.ResourceRequirements{
		Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")},
	}
	pod := buildPod(req)
	pod.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("2")
	assert.Equal(t, "1", req.Spec.Kubernetes.Resources.Limits.Cpu().String())
}

func TestToInstance(t *testing.T) {
	created := metav1.NewTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ready := func(s corev1.ConditionStatus) []corev1.PodCondition {
		return []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}, {Type: corev1.PodReady, Status: s}}
	}
	tests := []struct {
		name     string
		status   corev1.PodStatus
		deleting bool
		state    provider.State
		ip       string
		port     int32
	}{
		{name: "phase not set yet", state: provider.StateProvisioning},
		{name: "pending", status: corev1.PodStatus{Phase: corev1.PodPending}, state: provider.StateProvisioning},
		{
			name:   "running, ready, with IP",
			status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionTrue)},
			state:  provider.StateRunning, ip: "10.1.2.3", port: 8080,
		},
		{
			name:   "running, not ready",
			status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionFalse)},
			state:  provider.StateProvisioning,
		},
		{
			name:   "running without a Ready condition",
			status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3"},
			state:  provider.StateProvisioning,
		},
		{
			name:   "running and ready without IP",
			status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: ready(corev1.ConditionTrue)},
			state:  provider.StateProvisioning,
		},
		{name: "succeeded", status: corev1.PodStatus{Phase: corev1.PodSucceeded}, state: provider.StateStopped},
		{name: "failed (evicted)", status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted"}, state: provider.StateStopped},
		{name: "unknown", status: corev1.PodStatus{Phase: corev1.PodUnknown}, state: provider.StateProvisioning},
		{
			name:     "deleting while running",
			status:   corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.2.3", Conditions: ready(corev1.ConditionTrue)},
			deleting: true,
			state:    provider.StateDeleting,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := baseRequest()
			req.Port = 8080
			pod := buildPod(req)
			pod.CreationTimestamp = created
			pod.Status = tc.status
			if tc.deleting {
				pod.DeletionTimestamp = &created
			}
			inst := toInstance(pod)
			assert.Equal(t, provider.Instance{
				Name: "px-abc-0", ProviderID: "proxies/px-abc-0", State: tc.state,
				IP: tc.ip, Port: tc.port, CreatedAt: created.Time, Labels: pod.Labels,
			}, inst)
			assert.Equal(t, req.ProxyUID, inst.ProxyUID())
		})
	}
}

func TestProviderID(t *testing.T) {
	p := &Provider{}
	req := baseRequest()
	assert.Equal(t, "proxies/px-abc-0", p.ProviderID(req))
	req.Spec.Kubernetes.Namespace = "egress"
	assert.Equal(t, "egress/px-abc-0", p.ProviderID(req))
	req.Spec.Kubernetes = nil
	assert.Equal(t, "proxies/px-abc-0", p.ProviderID(req))
}

func TestParseID(t *testing.T) {
	tests := []struct {
		id, namespace, name string
		ok                  bool
	}{
		{id: "proxies/px-abc-0", namespace: "proxies", name: "px-abc-0", ok: true},
		{id: "px-abc-0"},
		{id: "/px-abc-0"},
		{id: "proxies/"},
		{id: "proxies/px/abc"},
		{id: "Proxies/px-abc-0"},
		{id: "zones/us-central1-a/instances/px-abc-0"},
		{id: ""},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			key, err := parseID(tc.id)
			if !tc.ok {
				require.Error(t, err)
				assert.Equal(t, provider.KindPermanent, provider.Class(err))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.namespace, key.Namespace)
			assert.Equal(t, tc.name, key.Name)
		})
	}
}

func TestCheckRequest(t *testing.T) {
	tests := []struct {
		name string
		edit func(*provider.CreateRequest)
		ok   bool
	}{
		{name: "plain", edit: func(*provider.CreateRequest) {}, ok: true},
		{name: "empty name", edit: func(r *provider.CreateRequest) { r.Name = "" }},
		{name: "name with a slash", edit: func(r *provider.CreateRequest) { r.Name = "a/b" }},
		{name: "no namespace", edit: func(r *provider.CreateRequest) { r.Namespace = "" }},
		{name: "image with a space inside", edit: func(r *provider.CreateRequest) { r.Spec.Kubernetes.Image = "ubuntu/squid: 6" }},
		{name: "image with a tab", edit: func(r *provider.CreateRequest) { r.Spec.Kubernetes.Image = "ubuntu/squid\t" }},
		{
			name: "cloud-init in the Proxy's namespace",
			edit: func(r *provider.CreateRequest) {
				r.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "s", Key: "k"}}
				r.Spec.Kubernetes.Namespace = r.Namespace
			},
			ok: true,
		},
		{
			// The pod could only mount a Secret of its own namespace, not the one the worker
			// checked.
			name: "cloud-init with the pod in another namespace",
			edit: func(r *provider.CreateRequest) {
				r.Spec.CloudInit = &v1alpha1.CloudInit{SecretRef: v1alpha1.SecretKeyRef{Name: "s", Key: "k"}}
				r.Spec.Kubernetes.Namespace = "egress"
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := baseRequest()
			tc.edit(&req)
			err := checkRequest(req)
			if tc.ok {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, provider.KindPermanent, provider.Class(err))
		})
	}
}

// wantLabels are the labels every object the provider makes for req carries: the owner
// labels ListOwned and Delete select on, and the instance's.
func wantLabels(req provider.CreateRequest) map[string]string {
	return map[string]string{
		provider.LabelProxyUID:         req.ProxyUID,
		provider.LabelInstallation:     req.Installation,
		provider.LabelManagedBy:        provider.ManagedByValue,
		provider.LabelKeyID:            req.KeyID,
		"proxyfleet-instance":          req.Name,
		"app.kubernetes.io/name":       "squid-proxy",
		"app.kubernetes.io/managed-by": "proxyfleet",
	}
}
