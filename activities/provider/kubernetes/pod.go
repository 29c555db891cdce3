package kubernetes

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
)

// What every Squid pod carries. Get reads the port back by name, so the pod alone says where
// the proxy listens.
const (
	containerName = "squid"
	portName      = "proxy"

	// Recommended Kubernetes labels, so kubectl users and dashboards can tell our pods apart
	// without knowing the proxyfleet-* ownership labels.
	labelAppName      = "app.kubernetes.io/name"
	labelAppManagedBy = "app.kubernetes.io/managed-by"
	appName           = "squid-proxy"

	configVolume = "squid-config"
	configFile   = "squid.conf"
	// configPath is where the Ubuntu Squid image reads its configuration.
	configPath = "/etc/squid/" + configFile

	// terminationGrace is short because a pod is only deleted after its replacement is
	// ready (make-before-break) or when its Proxy goes away; draining open tunnels for
	// Squid's full shutdown_lifetime (30s) would only delay the workflow.
	terminationGrace int64 = 10
)

// podNamespace is where req's pod lives: spec.kubernetes.namespace, else the Proxy's.
func podNamespace(req provider.CreateRequest) string {
	if k := req.Spec.Kubernetes; k != nil && k.Namespace != "" {
		return k.Namespace
	}
	return req.Namespace
}

// podImage is the Squid image of req's pod.
func podImage(req provider.CreateRequest) string {
	if k := req.Spec.Kubernetes; k != nil && k.Image != "" {
		return k.Image
	}
	// The schema defaults it; Proxies built in code may not have gone through the schema.
	return v1alpha1.DefaultSquidImage
}

// buildPod is the pod that runs req's instance. It is pure, so everything the provider puts
// into the cluster is covered by table tests.
//
// Squid must listen on req.Port (spec.port): the image's default configuration listens on
// 3128, which is also the default spec.port, so a Proxy that sets another port needs a
// spec.cloudInit Secret whose squid.conf has a matching http_port. Otherwise the readiness
// probe never passes and the instance never leaves Provisioning.
func buildPod(req provider.CreateRequest) *corev1.Pod {
	var resources corev1.ResourceRequirements
	if k := req.Spec.Kubernetes; k != nil {
		resources = *k.Resources.DeepCopy() // the pod must not share maps with the request
	}
	port := req.Port
	if port == 0 {
		port = req.Spec.EffectivePort()
	}

	labels := req.Labels()
	labels[labelAppName] = appName
	labels[labelAppManagedBy] = provider.ManagedByValue

	squid := corev1.Container{
		Name:  containerName,
		Image: podImage(req),
		Ports: []corev1.ContainerPort{{
			Name: portName, ContainerPort: port, Protocol: corev1.ProtocolTCP,
		}},
		Resources: resources,
		// Ready means Squid accepts connections; the workflow's probe through the proxy
		// decides whether it is healthy.
		ReadinessProbe: &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{
				TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)},
			},
			PeriodSeconds: 5,
		},
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: new(false),
			Capabilities: &corev1.Capabilities{
				Drop: []corev1.Capability{"ALL"},
				// The image starts Squid as root, and Squid then switches to its
				// cache_effective_user (proxy) with setgid, initgroups and setresuid; a failed
				// setresuid is fatal to Squid, so without these two it exits at start. Nothing
				// else is added: ports below 1024 (NET_BIND_SERVICE) are not supported, and
				// the image's log tailers may not read Squid's log files (DAC_READ_SEARCH),
				// which costs pod logs, not traffic. Namespaces enforcing the "restricted" Pod
				// Security level refuse this pod (root and these capabilities); "baseline"
				// admits it.
				Add: []corev1.Capability{"SETUID", "SETGID"},
			},
			SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      req.Name,
			Namespace: podNamespace(req),
			Labels:    labels,
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{squid},
			// A crashed Squid is restarted in place; the workflow replaces the pod only when
			// it stops for good (evicted, node lost).
			RestartPolicy: corev1.RestartPolicyAlways,
			// Squid never talks to the Kubernetes API: a token would only be something to
			// steal through the proxy.
			AutomountServiceAccountToken: new(false),
			// Squid reads no service environment variables; in a namespace with many
			// Services they would only bloat its environment.
			EnableServiceLinks:            new(false),
			TerminationGracePeriodSeconds: new(terminationGrace),
		},
	}

	if ci := req.Spec.CloudInit; ci != nil {
		// The kubelet mounts the Secret, so its data never passes through the provider nor
		// appears in the pod spec; req.CloudInit is deliberately ignored. A subPath mount
		// replaces squid.conf alone and keeps the rest of /etc/squid (conf.d, error pages).
		// subPath mounts do not follow Secret updates, which is fine: rotating the Secret
		// changes its hash and the workflow replaces the pod.
		pod.Spec.Volumes = []corev1.Volume{{
			Name: configVolume,
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName: ci.SecretRef.Name,
				Items:      []corev1.KeyToPath{{Key: ci.SecretRef.Key, Path: configFile}},
			}},
		}}
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{
			Name: configVolume, MountPath: configPath, SubPath: configFile, ReadOnly: true,
		}}
	}
	return pod
}

// toInstance reports pod as the workflow sees instances.
func toInstance(pod *corev1.Pod) provider.Instance {
	inst := provider.Instance{
		Name:       pod.Name,
		ProviderID: pod.Namespace + "/" + pod.Name,
		State:      podState(pod),
		CreatedAt:  pod.CreationTimestamp.Time,
		Labels:     pod.Labels,
	}
	if inst.State == provider.StateRunning {
		inst.IP, inst.Port = pod.Status.PodIP, proxyPort(pod)
	}
	return inst
}

// podState maps a pod's phase and readiness to the provider lifecycle. Only a ready pod with
// an IP is Running, so the workflow never hands out an address Squid does not answer on yet.
func podState(pod *corev1.Pod) provider.State {
	if pod.DeletionTimestamp != nil {
		return provider.StateDeleting
	}
	switch pod.Status.Phase {
	case corev1.PodRunning:
		if pod.Status.PodIP != "" && podReady(pod) {
			return provider.StateRunning
		}
		return provider.StateProvisioning
	case corev1.PodSucceeded, corev1.PodFailed:
		// With restartPolicy Always a pod only ends this way when evicted or its node is
		// lost; it will not come back, so the workflow replaces it.
		return provider.StateStopped
	default:
		// Pending, Unknown (node unreachable, may come back) and a phase not set yet.
		return provider.StateProvisioning
	}
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// proxyPort is the port buildPod declared, read from the pod rather than the request
// because Get knows only the provider ID.
func proxyPort(pod *corev1.Pod) int32 {
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.Name == portName {
				return p.ContainerPort
			}
		}
	}
	return 0
}
