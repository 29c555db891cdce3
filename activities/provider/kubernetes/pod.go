package kubernetes

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxyfleet/proxyfleet/activities/provider"
	"github.com/proxyfleet/proxyfleet/activities/provider/squid"
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

	// The rendered configuration: squid.conf and the passwd file, from a Secret of the
	// pod's own (configSecretName), mounted where the Ubuntu Squid image reads them.
	configVolume = "squid-config"
	configFile   = "squid.conf"
	passwdFile   = "passwd"
	// The user's cloud-init Secret, mounted as a file the rendered configuration includes.
	userVolume = "squid-user-config"
	userFile   = "proxyfleet-user.conf"
	userPath   = "/etc/squid/" + userFile

	// labelInstance selects one instance's pod, for its NetworkPolicy: during a
	// make-before-break replacement two pods of one Proxy run, each with its own policy.
	labelInstance = "proxyfleet-instance"

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
// Squid listens on req.Port (spec.port), as the configuration rendered for the instance
// (buildConfig) says.
func buildPod(req provider.CreateRequest) *corev1.Pod {
	var resources corev1.ResourceRequirements
	if k := req.Spec.Kubernetes; k != nil {
		resources = *k.Resources.DeepCopy() // the pod must not share maps with the request
	}
	port := req.Port
	if port == 0 {
		port = req.Spec.EffectivePort()
	}

	labels := objectLabels(req)

	container := corev1.Container{
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
			Containers: []corev1.Container{container},
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

	// Squid reads the configuration rendered for this instance; the kubelet mounts it from
	// the instance's Secret, which holds the passwd file's hash, never the password. 0444:
	// Squid's helper reads the passwd file as the unprivileged proxy user.
	mode := int32(0o444)
	pod.Spec.Volumes = []corev1.Volume{{
		Name: configVolume,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  configSecretName(req.Name),
			DefaultMode: &mode,
		}},
	}}
	paths := squid.DefaultPaths
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
		{Name: configVolume, MountPath: paths.Conf, SubPath: configFile, ReadOnly: true},
		{Name: configVolume, MountPath: paths.Passwd, SubPath: passwdFile, ReadOnly: true},
	}
	if ci := req.Spec.CloudInit; ci != nil {
		// The user's Secret is an addition, included after the rules that require
		// credentials and refuse private destinations. The kubelet mounts it, so its data
		// never passes through the provider nor appears in the pod spec; req.CloudInit is
		// deliberately ignored. subPath mounts do not follow Secret updates, which is fine:
		// rotating the Secret changes its hash and the workflow replaces the pod.
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name: userVolume,
			VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
				SecretName:  ci.SecretRef.Name,
				Items:       []corev1.KeyToPath{{Key: ci.SecretRef.Key, Path: userFile}},
				DefaultMode: &mode,
			}},
		})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{
			Name: userVolume, MountPath: userPath, SubPath: userFile, ReadOnly: true,
		})
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

// objectLabels are the labels of everything an instance is made of (pod, Secret,
// NetworkPolicy): the ownership labels, the instance (which its policy selects by), and the
// recommended Kubernetes labels, so kubectl users and dashboards can tell them apart.
func objectLabels(req provider.CreateRequest) map[string]string {
	labels := req.Labels()
	labels[labelInstance] = req.Name
	labels[labelAppName] = appName
	labels[labelAppManagedBy] = provider.ManagedByValue
	return labels
}

// configSecretName is the name of the Secret holding an instance's rendered configuration.
func configSecretName(instance string) string { return instance + "-squid" }

// renderConfig renders the hardened Squid configuration of req's instance: the
// credentials the system generated for it, the Proxy's egress rules, and the user's
// cloud-init file as an include.
func renderConfig(req provider.CreateRequest) (squid.Files, error) {
	port := req.Port
	if port == 0 {
		port = req.Spec.EffectivePort()
	}
	cfg := squid.Config{Port: port, Credentials: req.Credentials}
	if e := req.Spec.Egress; e != nil {
		for _, p := range e.Ports {
			cfg.Ports = append(cfg.Ports, int32(p))
		}
		for _, c := range e.AllowedDestinations {
			prefix, err := netip.ParsePrefix(string(c))
			if err != nil {
				return squid.Files{}, fmt.Errorf("spec.egress.allowedDestinations: %q is not a CIDR", c)
			}
			cfg.Allowed = append(cfg.Allowed, prefix)
		}
	}
	if req.Spec.CloudInit != nil {
		cfg.Include = userPath
	}
	return squid.Render(cfg)
}

// buildConfigSecret is the Secret the pod mounts its configuration from. It carries the
// ownership labels, so what it belongs to is visible, and is deleted with the pod.
func buildConfigSecret(req provider.CreateRequest, files squid.Files) *corev1.Secret {
	labels := objectLabels(req)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: configSecretName(req.Name), Namespace: podNamespace(req), Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{configFile: files.Conf, passwdFile: files.Passwd},
	}
}

// buildNetworkPolicy admits the proxy port of req's pod from the peers the Proxy names (by
// default the pods of the Proxy's namespace) and from probeFrom (the worker, whose probes
// must get through), and nothing else.
func buildNetworkPolicy(req provider.CreateRequest, probeFrom []networkingv1.NetworkPolicyPeer) *networkingv1.NetworkPolicy {
	port := req.Port
	if port == 0 {
		port = req.Spec.EffectivePort()
	}
	var peers []networkingv1.NetworkPolicyPeer
	if k := req.Spec.Kubernetes; k != nil {
		for _, p := range k.AllowedClients {
			peers = append(peers, *p.DeepCopy())
		}
	}
	if len(peers) == 0 {
		peers = []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: req.Namespace}},
			PodSelector:       &metav1.LabelSelector{},
		}}
	}
	for _, p := range probeFrom {
		peers = append(peers, *p.DeepCopy())
	}
	labels := objectLabels(req)
	tcp := corev1.ProtocolTCP
	target := intstr.FromInt32(port)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: req.Name, Namespace: podNamespace(req), Labels: labels},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{labelInstance: req.Name}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &target}},
				From:  peers,
			}},
		},
	}
}
