package deployed_test

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// A pod here is a container of a shipped workload run as a process of this machine, the
// way a kubelet would run it: the command and args of the manifest, with $(VAR) expanded,
// the environment from envFrom, env, field and Secret references, Secret volumes written
// to a directory of the pod's own, and a kubeconfig that acts as its ServiceAccount when
// the pod mounts that account's token. What a cluster's network gives a pod is given here
// by rewriting, and nothing else is: each declared container port is a free port of
// 127.0.0.1 (flags that listen on ":N" listen there), and a headless Service's pod DNS name
// is that pod's address.
type pod struct {
	name      string
	namespace string
	labels    map[string]string
	spec      corev1.PodSpec
	subdomain string // the StatefulSet's serviceName, for the pod's DNS name

	dir   string           // the pod's files: volumes, kubeconfig, home
	ports map[int32]int    // container port -> port of 127.0.0.1
	named map[string]int32 // port name -> container port
	proc  *process
}

// podsOf returns the pods of the Deployments and StatefulSets named, as many as each
// manifest asks for, named as their controllers would name them.
func podsOf(t *testing.T, c *cluster, deployments, statefulSets []string) []*pod {
	t.Helper()
	var pods []*pod
	add := func(name string, tmpl corev1.PodTemplateSpec, subdomain string) {
		p := &pod{name: name, namespace: systemNS, labels: tmpl.Labels, spec: *tmpl.Spec.DeepCopy(), subdomain: subdomain,
			dir: t.TempDir(), ports: map[int32]int{}, named: map[string]int32{}}
		for _, ctr := range p.spec.Containers {
			for _, cp := range ctr.Ports {
				free, err := testenv.FreePorts(1)
				require.NoError(t, err)
				p.ports[cp.ContainerPort] = free[0]
				if cp.Name != "" {
					p.named[cp.Name] = cp.ContainerPort
				}
			}
		}
		pods = append(pods, p)
	}
	for _, name := range deployments {
		var d appsv1.Deployment
		require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: systemNS, Name: name}, &d))
		require.NotNil(t, d.Spec.Replicas, name)
		for i := range int(*d.Spec.Replicas) {
			add(fmt.Sprintf("%s-test-%d", name, i), d.Spec.Template, "")
		}
	}
	for _, name := range statefulSets {
		var s appsv1.StatefulSet
		require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: systemNS, Name: name}, &s))
		require.NotNil(t, s.Spec.Replicas, name)
		for i := range int(*s.Spec.Replicas) {
			add(fmt.Sprintf("%s-%d", name, i), s.Spec.Template, s.Spec.ServiceName)
		}
	}
	return pods
}

// start runs the pod's one container; waitReady waits for its readiness probe. A
// StatefulSet with podManagementPolicy Parallel (discovery's) starts its pods together, and
// its replicas wait for each other before they are ready, so a test starts every pod
// before it waits for any.
func (p *pod) start(t *testing.T, c *cluster, all []*pod) {
	t.Helper()
	require.Len(t, p.spec.Containers, 1, "%s: one container per pod", p.name)
	require.Empty(t, p.spec.InitContainers, "%s: init containers are not run here", p.name)
	ctr := p.spec.Containers[0]
	require.NotEmpty(t, ctr.Command, "%s: the manifest names the binary", p.name)
	bin, ok := c.binaries[filepath.Base(ctr.Command[0])]
	require.True(t, ok, "%s: command %s is not one of the image's binaries", p.name, ctr.Command[0])

	mounts := p.mountVolumes(t, c, ctr)
	env := p.environment(t, c, ctr)
	sa := p.serviceAccount(t, c)
	p.awsIdentity(t, c, sa, env)
	var args []string
	for _, a := range append(slices.Clone(ctr.Command[1:]), ctr.Args...) {
		// Kubernetes passes a reference to a variable the container lacks on as it is
		// written; the binary would take "$(X)" for a value. Here it fails.
		require.Empty(t, unresolved(a, env), "%s: argument %q names variables the container's environment lacks", p.name, a)
		args = append(args, expand(a, env))
	}
	rewrite := func(s string) string { return p.network(t, c, all, mounts.rewrite(s)) }
	for i, a := range args {
		args[i] = rewrite(a)
	}
	environ := []string{"PATH=/usr/bin:/bin", "HOME=" + filepath.Join(p.dir, "home")}
	require.NoError(t, os.MkdirAll(filepath.Join(p.dir, "home"), 0o755))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		environ = append(environ, k+"="+rewrite(env[k]))
	}
	if kc := p.serviceAccountKubeconfig(t, c, sa); kc != "" {
		environ = append(environ, "KUBECONFIG="+kc)
	}
	p.proc = startProcess(t, p.name, bin, environ, args)
}

// mounts maps mount paths in the container to directories of the pod.
type mounts map[string]string

// rewrite replaces a mount path at the start of s (a flag's value, a path in a variable).
func (m mounts) rewrite(s string) string {
	paths := slices.Sorted(maps.Keys(m))
	slices.Reverse(paths) // longest first
	for _, mp := range paths {
		if rest, ok := strings.CutPrefix(s, mp); ok && (rest == "" || rest[0] == '/') {
			return m[mp] + rest
		}
		// --flag=/mount/path/file
		if i := strings.Index(s, "="+mp); i >= 0 {
			if rest := s[i+1+len(mp):]; rest == "" || rest[0] == '/' {
				return s[:i+1] + m[mp] + rest
			}
		}
	}
	return s
}

// mountVolumes writes the pod's Secret and emptyDir volumes into its directory, as a
// kubelet projects them, and returns where each mount path went.
func (p *pod) mountVolumes(t *testing.T, c *cluster, ctr corev1.Container) mounts {
	t.Helper()
	m := mounts{}
	for _, vm := range ctr.VolumeMounts {
		i := slices.IndexFunc(p.spec.Volumes, func(v corev1.Volume) bool { return v.Name == vm.Name })
		require.GreaterOrEqual(t, i, 0, "%s: volume %s is not declared", p.name, vm.Name)
		v := p.spec.Volumes[i]
		host := filepath.Join(p.dir, "volumes", v.Name)
		require.NoError(t, os.MkdirAll(host, 0o755))
		switch {
		case v.Secret != nil:
			var s corev1.Secret
			require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: p.namespace, Name: v.Secret.SecretName}, &s),
				"%s: volume %s needs Secret %s", p.name, v.Name, v.Secret.SecretName)
			mode := os.FileMode(0o644)
			if v.Secret.DefaultMode != nil {
				mode = os.FileMode(*v.Secret.DefaultMode)
			}
			// The binaries run as this test's user, which owns the files; in a pod they
			// run as the manifest's user, and the kubelet's files belong to root.
			require.NoError(t, secretVolumeReadable(p.spec, ctr, *v.Secret), "%s: volume %s", p.name, v.Name)
			for k, data := range s.Data {
				require.NoError(t, os.WriteFile(filepath.Join(host, k), data, mode))
			}
		case v.EmptyDir != nil:
		default:
			t.Fatalf("%s: volume %s: only Secret and emptyDir volumes are run here", p.name, v.Name)
		}
		if vm.SubPath != "" {
			host = filepath.Join(host, vm.SubPath)
		}
		m[vm.MountPath] = host
	}
	return m
}

// environment is the container's environment as Kubernetes builds it: envFrom first, then
// env in order, each value's $(VAR) expanded from what came before it.
func (p *pod) environment(t *testing.T, c *cluster, ctr corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range ctr.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			var cm corev1.ConfigMap
			require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: p.namespace, Name: from.ConfigMapRef.Name}, &cm),
				"%s: envFrom ConfigMap %s", p.name, from.ConfigMapRef.Name)
			for k, v := range cm.Data {
				env[from.Prefix+k] = v
			}
		case from.SecretRef != nil:
			var s corev1.Secret
			require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: p.namespace, Name: from.SecretRef.Name}, &s),
				"%s: envFrom Secret %s", p.name, from.SecretRef.Name)
			for k, v := range s.Data {
				env[from.Prefix+k] = string(v)
			}
		}
	}
	for _, e := range ctr.Env {
		switch vf := e.ValueFrom; {
		case vf == nil:
			require.Empty(t, unresolved(e.Value, env), "%s: env %s names variables defined neither before it nor through envFrom", p.name, e.Name)
			env[e.Name] = expand(e.Value, env)
		case vf.FieldRef != nil:
			switch vf.FieldRef.FieldPath {
			case "metadata.name":
				env[e.Name] = p.name
			case "metadata.namespace":
				env[e.Name] = p.namespace
			default:
				t.Fatalf("%s: env %s: field %s is not given here", p.name, e.Name, vf.FieldRef.FieldPath)
			}
		case vf.SecretKeyRef != nil:
			var s corev1.Secret
			require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: p.namespace, Name: vf.SecretKeyRef.Name}, &s),
				"%s: env %s: Secret %s", p.name, e.Name, vf.SecretKeyRef.Name)
			v, ok := s.Data[vf.SecretKeyRef.Key]
			require.True(t, ok, "%s: env %s: Secret %s has no key %s", p.name, e.Name, vf.SecretKeyRef.Name, vf.SecretKeyRef.Key)
			env[e.Name] = string(v)
		case vf.ConfigMapKeyRef != nil:
			var cm corev1.ConfigMap
			require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: p.namespace, Name: vf.ConfigMapKeyRef.Name}, &cm))
			env[e.Name] = cm.Data[vf.ConfigMapKeyRef.Key]
		default:
			t.Fatalf("%s: env %s: this kind of valueFrom is not given here", p.name, e.Name)
		}
	}
	return env
}

// unresolved names the variables s refers to as $(VAR) that env lacks.
func unresolved(s string, env map[string]string) []string {
	var missing []string
	for i := 0; i+1 < len(s); i++ {
		if s[i] != '$' {
			continue
		}
		switch s[i+1] {
		case '$':
			i++
		case '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				return missing
			}
			if name := s[i+2 : i+end]; !hasKey(env, name) {
				missing = append(missing, name)
			}
			i += end
		}
	}
	return missing
}

// secretVolumeReadable reports whether the container can read the files of a Secret
// volume as a kubelet lays them out: owned by root, in group fsGroup (with group read
// added) when the pod sets one, else in root's group with the volume's mode alone.
func secretVolumeReadable(spec corev1.PodSpec, ctr corev1.Container, vol corev1.SecretVolumeSource) error {
	var uid, gid int64
	var groups []int64
	var fsGroup *int64
	if psc := spec.SecurityContext; psc != nil {
		fsGroup = psc.FSGroup
		uid, gid = deref(psc.RunAsUser, 0), deref(psc.RunAsGroup, 0)
		groups = append(groups, psc.SupplementalGroups...)
	}
	if csc := ctr.SecurityContext; csc != nil {
		uid, gid = deref(csc.RunAsUser, uid), deref(csc.RunAsGroup, gid)
	}
	if uid == 0 {
		return nil
	}
	fileGroup := int64(0)
	if fsGroup != nil {
		fileGroup = *fsGroup
		groups = append(groups, *fsGroup)
	}
	modes := []int32{0o644}
	if vol.DefaultMode != nil {
		modes[0] = *vol.DefaultMode
	}
	for _, it := range vol.Items {
		if it.Mode != nil {
			modes = append(modes, *it.Mode)
		}
	}
	for _, m := range modes {
		mode := os.FileMode(m)
		if fsGroup != nil {
			mode |= 0o440
		}
		inGroup := gid == fileGroup || slices.Contains(groups, fileGroup)
		if mode&0o004 == 0 && !(inGroup && mode&0o040 != 0) {
			return fmt.Errorf("Secret %s's files (mode %#o, owner 0, group %d) cannot be read by user %d, group %d, groups %v",
				vol.SecretName, mode, fileGroup, uid, gid, groups)
		}
	}
	return nil
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

func deref(p *int64, def int64) int64 {
	if p == nil {
		return def
	}
	return *p
}

// expand replaces $(VAR) by VAR's value where VAR is defined and $$ by $, as Kubernetes
// does in env values, command and args.
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

var (
	// listenValue is a flag value that listens on every address of the pod.
	listenValue = regexp.MustCompile(`^(=?)(?:0\.0\.0\.0|\[::\])?:(\d+)$`)
	// podDNS is a URL or host:port that names a pod through its headless Service.
	podDNS = regexp.MustCompile(`\b([a-z0-9][a-z0-9-]*)\.([a-z0-9][a-z0-9-]*)\.([a-z0-9][a-z0-9-]*)\.svc(?:\.cluster\.local)?:(\d+)\b`)
	// serviceDNS is a URL or host:port that names a Service (a virtual address).
	serviceDNS = regexp.MustCompile(`(^|[^a-z0-9.-])([a-z0-9][a-z0-9-]*)\.([a-z0-9][a-z0-9-]*)\.svc(?:\.cluster\.local)?:(\d+)\b`)
)

// network rewrites what the pod network decides: a listen address ":N" of a declared
// container port becomes this pod's port of 127.0.0.1, a pod's DNS name through its
// headless Service becomes that pod's address for the Service port, and a Service's DNS
// name becomes the address of a pod it selects.
func (p *pod) network(t *testing.T, c *cluster, all []*pod, s string) string {
	t.Helper()
	name, value, hasFlag := strings.Cut(s, "=")
	if !hasFlag {
		value = s
	}
	if m := listenValue.FindStringSubmatch(value); m != nil {
		port, _ := strconv.Atoi(m[2])
		host, ok := p.ports[int32(port)]
		require.True(t, ok, "%s: %q listens on port %d, which the container does not declare", p.name, s, port)
		addr := fmt.Sprintf("127.0.0.1:%d", host)
		if hasFlag {
			return name + "=" + addr
		}
		return addr
	}
	s = podDNS.ReplaceAllStringFunc(s, func(host string) string {
		m := podDNS.FindStringSubmatch(host)
		podName, svcName, ns := m[1], m[2], m[3]
		port, _ := strconv.Atoi(m[4])
		i := slices.IndexFunc(all, func(q *pod) bool { return q.name == podName && q.namespace == ns })
		require.GreaterOrEqual(t, i, 0, "%s: %s names pod %s, which no workload has", p.name, host, podName)
		target := all[i]
		require.Equal(t, svcName, target.subdomain, "%s: %s: pod %s is reached through its StatefulSet's serviceName", p.name, host, podName)
		var svc corev1.Service
		require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: ns, Name: svcName}, &svc), "%s: %s: Service %s", p.name, host, svcName)
		require.Equal(t, corev1.ClusterIPNone, svc.Spec.ClusterIP, "%s: %s: pod DNS names need a headless Service", p.name, host)
		require.True(t, labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(target.labels)),
			"%s: %s: Service %s does not select pod %s", p.name, host, svcName, podName)
		sp := slices.IndexFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return int(sp.Port) == port })
		require.GreaterOrEqual(t, sp, 0, "%s: %s: Service %s has no port %d", p.name, host, svcName, port)
		tp := svc.Spec.Ports[sp].TargetPort
		cport := int32(tp.IntValue())
		if tp.StrVal != "" {
			var ok bool
			cport, ok = target.named[tp.StrVal]
			require.True(t, ok, "%s: %s: pod %s has no port named %s", p.name, host, podName, tp.StrVal)
		}
		hp, ok := target.ports[cport]
		require.True(t, ok, "%s: %s: pod %s does not declare port %d", p.name, host, podName, cport)
		return fmt.Sprintf("127.0.0.1:%d", hp)
	})
	// A Service's name is one of the pods it selects, as kube-proxy would pick one: the
	// first by name, with the Service's port mapped to that pod's.
	return serviceDNS.ReplaceAllStringFunc(s, func(match string) string {
		m := serviceDNS.FindStringSubmatch(match)
		lead, svcName, ns := m[1], m[2], m[3]
		port, _ := strconv.Atoi(m[4])
		var svc corev1.Service
		require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: ns, Name: svcName}, &svc), "%s: %s: Service %s", p.name, match, svcName)
		sp := slices.IndexFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return int(sp.Port) == port })
		require.GreaterOrEqual(t, sp, 0, "%s: %s: Service %s has no port %d", p.name, match, svcName, port)
		var target *pod
		for _, q := range all {
			if q.namespace == ns && labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(q.labels)) &&
				(target == nil || q.name < target.name) {
				target = q
			}
		}
		require.NotNil(t, target, "%s: %s: Service %s selects no pod", p.name, match, svcName)
		tp := svc.Spec.Ports[sp].TargetPort
		cport := int32(tp.IntValue())
		if tp.StrVal != "" {
			var ok bool
			cport, ok = target.named[tp.StrVal]
			require.True(t, ok, "%s: %s: pod %s has no port named %s", p.name, match, target.name, tp.StrVal)
		}
		hp, ok := target.ports[cport]
		require.True(t, ok, "%s: %s: pod %s does not declare port %d", p.name, match, target.name, cport)
		return fmt.Sprintf("%s127.0.0.1:%d", lead, hp)
	})
}

// serviceAccountKubeconfig writes a kubeconfig that acts as the pod's ServiceAccount, if
// the pod mounts that account's token, and returns its path; "" if it mounts none.
func (p *pod) serviceAccountKubeconfig(t *testing.T, c *cluster, sa *corev1.ServiceAccount) string {
	t.Helper()
	mount := true
	if sa.AutomountServiceAccountToken != nil {
		mount = *sa.AutomountServiceAccountToken
	}
	if p.spec.AutomountServiceAccountToken != nil {
		mount = *p.spec.AutomountServiceAccountToken
	}
	if !mount {
		return ""
	}
	cfg, err := clientcmd.LoadFromFile(c.k.Kubeconfig(t))
	require.NoError(t, err)
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + p.namespace + ":" + sa.Name
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + p.namespace, "system:authenticated"}
	}
	path := filepath.Join(p.dir, "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	return path
}

// serviceAccount is the pod's ServiceAccount, as the API server holds it.
func (p *pod) serviceAccount(t *testing.T, c *cluster) *corev1.ServiceAccount {
	t.Helper()
	name := cmp.Or(p.spec.ServiceAccountName, "default")
	var sa corev1.ServiceAccount
	require.NoError(t, c.k.Client.Get(c.ctx, types.NamespacedName{Namespace: p.namespace, Name: name}, &sa),
		"%s: ServiceAccount %s", p.name, name)
	return &sa
}

// awsIdentity plays EKS's pod identity webhook and the cluster's way to AWS. A pod whose
// ServiceAccount names an IAM role (eks.amazonaws.com/role-arn) gets what the webhook
// injects: the role and a projected token file (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE),
// for the SDK's default chain to exchange at STS. When the test runs AWS stand-ins, every
// pod reaches EC2 and STS there (the SDK's endpoint variables), and none reaches an
// instance metadata service: this machine's network must not be asked for one.
func (p *pod) awsIdentity(t *testing.T, c *cluster, sa *corev1.ServiceAccount, env map[string]string) {
	t.Helper()
	if c.aws != nil {
		env["AWS_ENDPOINT_URL_EC2"], env["AWS_ENDPOINT_URL_STS"] = c.aws.ec2.URL, c.aws.sts.URL
		env["AWS_EC2_METADATA_DISABLED"] = "true"
	}
	role := sa.Annotations["eks.amazonaws.com/role-arn"]
	if role == "" {
		return
	}
	require.NotNil(t, c.aws, "%s: its ServiceAccount asks for an IAM role, and the test runs no AWS stand-ins", p.name)
	token := filepath.Join(p.dir, "eks.amazonaws.com", "serviceaccount", "token")
	require.NoError(t, os.MkdirAll(filepath.Dir(token), 0o755))
	require.NoError(t, os.WriteFile(token, []byte(c.aws.sts.Token), 0o600))
	env["AWS_ROLE_ARN"], env["AWS_WEB_IDENTITY_TOKEN_FILE"] = role, token
}

// waitReady waits until the container's readiness probe answers 2xx, as the kubelet would
// before the Service sends it traffic.
func (p *pod) waitReady(t *testing.T) {
	t.Helper()
	probe := p.spec.Containers[0].ReadinessProbe
	require.NotNil(t, probe, "%s: a readiness probe", p.name)
	require.NotNil(t, probe.HTTPGet, "%s: an HTTP readiness probe", p.name)
	port := int32(probe.HTTPGet.Port.IntValue())
	if probe.HTTPGet.Port.StrVal != "" {
		port = p.named[probe.HTTPGet.Port.StrVal]
	}
	hp, ok := p.ports[port]
	require.True(t, ok, "%s: the readiness probe's port %s is not declared", p.name, probe.HTTPGet.Port.String())
	url := fmt.Sprintf("http://127.0.0.1:%d%s", hp, probe.HTTPGet.Path)
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode >= 200 && resp.StatusCode < 400 {
				return
			}
		}
		select {
		case <-p.proc.exited:
			t.Fatalf("%s exited before it was ready (%v):\n%s", p.name, p.proc.err, p.proc.logTail())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not ready within 90s (last: %v):\n%s", p.name, url, err, p.proc.logTail())
		}
	}
}

// process is one pod's running binary, in a process group of its own, killed with the test
// process if that dies first.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	exited  chan struct{}
	err     error
}

func startProcess(t *testing.T, name, bin string, environ, args []string) *process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	require.NoError(t, err)
	cmd := exec.Command(bin, args...)
	cmd.Env = environ // exactly the pod's, nothing of the test's
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start(), name)
	p := &process{name: name, cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s log (%s):\n%s", name, logPath, p.logTail())
		}
	})
	return p
}

// stop sends SIGTERM, as a kubelet does, and SIGKILL after the grace period.
func (p *process) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
}

func (p *process) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

func (p *process) logTail() string {
	s := p.log()
	if len(s) > 8000 {
		s = s[len(s)-8000:]
	}
	return s
}
