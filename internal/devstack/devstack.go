// Package devstack runs the whole system on one machine for `make dev`: a Temporal dev
// server with its Web UI, etcd + kube-apiserver with the CRD, the local proxy host, and the
// operator, worker and discovery binaries, all on 127.0.0.1, with sample Proxies applied.
// Everything it starts, it stops on Ctrl-C; logs go to files in its state directory.
package devstack

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
	"github.com/proxyfleet/proxyfleet/operator/api"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Config says where things are and where they listen.
type Config struct {
	Root     string // repository root (bin/, deploy/)
	StateDir string // logs and kubeconfig
	Out      io.Writer
	// Fixed ports, so the printed commands stay the same from run to run.
	TemporalPort, UIPort, DiscoveryPort, GatewayPort, DaemonPort int
	// Proxies is how many sample local Proxies to apply.
	Proxies int
}

// Signals readies the devstack process for the ways it is ended, beside Ctrl-C and
// SIGTERM: the returned context also ends when the terminal goes away (SIGHUP), and
// output that can no longer be written stops nothing (SIGPIPE is handled: a write fails
// instead of killing the process). `make dev | tee dev.log` ends that way: Ctrl-C ends tee
// too, and the next line devstack printed killed it before it stopped its children.
func Signals(ctx context.Context) (context.Context, context.CancelFunc) {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	return signal.NotifyContext(ctx, syscall.SIGHUP)
}

// Run starts everything, prints how to use it, and stops everything when ctx ends.
func Run(ctx context.Context, cfg Config) (err error) {
	s := &stack{cfg: cfg}
	defer func() { err = errors.Join(err, s.stop()) }()
	if err := s.start(ctx); err != nil {
		return err
	}
	s.printUsage()
	<-ctx.Done()
	fmt.Fprintln(cfg.Out, "\nstopping…")
	return nil
}

type stack struct {
	cfg      Config
	logs     string
	temporal *testsuite.DevServer
	kube     *envtest.Environment
	kc       ctrlclient.Client
	procs    []*exec.Cmd
	token    string
	kubecfg  string
	// firstURL is local-1's proxy URL with its credentials, for the printed fetch line.
	firstURL string
}

func (s *stack) bin(parts ...string) string {
	return filepath.Join(append([]string{s.cfg.Root, "bin"}, parts...)...)
}

func (s *stack) start(ctx context.Context) error {
	cfg := s.cfg
	s.logs = filepath.Join(cfg.StateDir, "logs")
	if err := os.MkdirAll(s.logs, 0o755); err != nil {
		return err
	}
	for _, b := range []string{s.bin("temporal"), s.bin("k8s", "kube-apiserver"), s.bin("k8s", "etcd"), s.bin("operator"), s.bin("worker"), s.bin("discovery"), s.bin("localproxyd")} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s is missing: run `make tools build` (make dev does)", b)
		}
	}
	for _, p := range []int{cfg.TemporalPort, cfg.UIPort, cfg.DiscoveryPort, cfg.GatewayPort, cfg.DaemonPort} {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return fmt.Errorf("port %d is taken (is another `make dev` running?): %w", p, err)
		}
		ln.Close()
	}
	step := func(what string) { fmt.Fprintf(cfg.Out, "• %s\n", what) }

	step("Temporal dev server with its Web UI")
	tlogFile, err := os.Create(filepath.Join(s.logs, "temporal.log"))
	if err != nil {
		return err
	}
	quiet := slog.New(slog.NewTextHandler(tlogFile, nil))
	// The servers below are started by libraries; tied, they die with devstack.
	tied := filepath.Join(cfg.StateDir, "tied")
	temporalBin, err := tie(tied, "temporal", s.bin("temporal"))
	if err != nil {
		return err
	}
	s.temporal, err = testsuite.StartDevServer(ctx, testsuite.DevServerOptions{
		ExistingPath:     temporalBin,
		ClientOptions:    &client.Options{HostPort: fmt.Sprintf("127.0.0.1:%d", cfg.TemporalPort), Namespace: "default", Logger: tlog.NewStructuredLogger(quiet)},
		EnableUI:         true,
		UIPort:           fmt.Sprint(cfg.UIPort),
		SearchAttributes: contract.SearchAttributes(),
		LogLevel:         "warn",
		Stdout:           tlogFile, Stderr: tlogFile,
	})
	if err != nil {
		return fmt.Errorf("temporal dev server: %w", err)
	}

	step("etcd and kube-apiserver with the Proxy CRD")
	scheme := api.NewScheme()
	etcd, err := tie(tied, "etcd", s.bin("k8s", "etcd"))
	if err != nil {
		return err
	}
	apiserver, err := tie(tied, "kube-apiserver", s.bin("k8s", "kube-apiserver"))
	if err != nil {
		return err
	}
	s.kube = &envtest.Environment{
		ControlPlane:          envtest.ControlPlane{Etcd: &envtest.Etcd{Path: etcd}, APIServer: &envtest.APIServer{Path: apiserver}},
		BinaryAssetsDirectory: s.bin("k8s"),
		CRDDirectoryPaths:     []string{filepath.Join(cfg.Root, "deploy", "crd")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	rest, err := s.kube.Start()
	if err != nil {
		s.kube = nil
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	admin, err := s.kube.AddUser(envtest.User{Name: "dev", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return err
	}
	raw, err := admin.KubeConfig()
	if err != nil {
		return err
	}
	s.kubecfg = filepath.Join(cfg.StateDir, "kubeconfig")
	if err := os.WriteFile(s.kubecfg, raw, 0o600); err != nil {
		return err
	}
	if s.kc, err = ctrlclient.New(rest, ctrlclient.Options{Scheme: scheme}); err != nil {
		return err
	}
	// bin/kubectl talks to this stack unless KUBECONFIG says otherwise.
	wrapper := fmt.Sprintf("#!/bin/sh\n# Written by make dev: the pinned kubectl, pointed at the dev stack by default.\nexec \"$(dirname \"$0\")/k8s/kubectl\" --kubeconfig \"${KUBECONFIG:-%s}\" \"$@\"\n", s.kubecfg)
	_ = os.Remove(s.bin("kubectl"))
	if err := os.WriteFile(s.bin("kubectl"), []byte(wrapper), 0o755); err != nil {
		return err
	}

	temporalFlags := []string{"--temporal-address", s.temporal.FrontendHostPort(), "--installation", "dev"}
	daemonAddr := fmt.Sprintf("127.0.0.1:%d", cfg.DaemonPort)
	step("local proxy host (localproxyd)")
	if err := s.spawn("localproxyd", nil, "--listen", daemonAddr, "--state-file", filepath.Join(cfg.StateDir, "localproxyd.json")); err != nil {
		return err
	}
	step("operator, worker and discovery")
	keyPath, err := fleetKey(cfg.StateDir)
	if err != nil {
		return err
	}
	kenv := []string{"KUBECONFIG=" + s.kubecfg}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	s.token = hex.EncodeToString(tok)
	discoveryURL := fmt.Sprintf("http://127.0.0.1:%d", cfg.DiscoveryPort)
	// The operator's autoscaler reads pools' demand from discovery, with the crawlers' token.
	if err := s.spawn("operator", append(kenv, "DISCOVERY_TOKEN="+s.token), append(temporalFlags, "--metrics-bind-address", "127.0.0.1:0",
		"--health-probe-bind-address", "127.0.0.1:0", "--discovery-url", discoveryURL)...); err != nil {
		return err
	}
	if err := s.spawn("worker", kenv, append(temporalFlags, "--providers", "local,kubernetes", "--local-daemon", "http://"+daemonAddr, "--http-address", "127.0.0.1:0", "--fleet-key-path", keyPath)...); err != nil {
		return err
	}
	if err := s.spawn("discovery", []string{"DISCOVERY_TOKEN=" + s.token}, "--temporal-address", s.temporal.FrontendHostPort(),
		"--listen", fmt.Sprintf("127.0.0.1:%d", cfg.DiscoveryPort), "--gateway-listen", fmt.Sprintf("127.0.0.1:%d", cfg.GatewayPort),
		"--fleet-key-path", keyPath); err != nil {
		return err
	}

	step(fmt.Sprintf("%d sample Proxies (provider local)", cfg.Proxies))
	for i := 1; i <= cfg.Proxies; i++ {
		p := &v1alpha1.Proxy{}
		p.Namespace, p.Name = "default", fmt.Sprintf("local-%d", i)
		p.Spec = v1alpha1.ProxySpec{
			Provider: v1alpha1.ProviderLocal, Local: &v1alpha1.LocalSpec{},
			Attributes:  map[string]v1alpha1.AttributeValue{"region": "local", "slot": v1alpha1.AttributeValue(fmt.Sprint(i))},
			HealthCheck: v1alpha1.HealthCheck{URL: "http://" + daemonAddr + "/healthz", Interval: "2s", Timeout: "1s"},
		}
		if err := s.kc.Create(ctx, p); err != nil {
			return fmt.Errorf("apply sample Proxy: %w", err)
		}
	}
	step("waiting until they are Ready")
	deadline := time.Now().Add(3 * time.Minute)
	for i := 1; i <= cfg.Proxies; i++ {
		for {
			var p v1alpha1.Proxy
			err := s.kc.Get(ctx, types.NamespacedName{Namespace: "default", Name: fmt.Sprintf("local-%d", i)}, &p)
			if err == nil && p.Status.Phase == v1alpha1.PhaseReady && meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionReady) {
				if i == 1 {
					if s.firstURL, err = proxyURL(keyPath, &p); err != nil {
						return err
					}
				}
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("local-%d is not Ready after 3 minutes (phase %q); see %s", i, p.Status.Phase, s.logs)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	// Discovery reads Temporal on its own schedule: wait until it offers them too, so the
	// printed commands work the moment they are printed.
	dc := dclient.New(fmt.Sprintf("http://127.0.0.1:%d", cfg.DiscoveryPort), s.token)
	healthy := true
	for {
		list, err := dc.ListProxies(ctx, map[string]string{"region": "local"}, &healthy)
		if err == nil && list.Count >= cfg.Proxies {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("discovery does not offer the sample Proxies after 3 minutes (%v); see %s", err, s.logs)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// spawn starts one of the project's binaries with its output in logs/<name>.log. It gets a
// process group of its own, so Ctrl-C reaches it only through stop(), and dies with
// devstack if devstack is killed (childAttr).
func (s *stack) spawn(name string, env []string, args ...string) error {
	f, err := os.Create(filepath.Join(s.logs, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin(name), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	s.procs = append(s.procs, cmd)
	return nil
}

func (s *stack) stop() error {
	var errs []error
	// Reverse order: the parts that use Temporal and the API server go first.
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	if s.kube != nil {
		errs = append(errs, s.kube.Stop())
	}
	if s.temporal != nil {
		errs = append(errs, s.temporal.Stop())
	}
	return errors.Join(errs...)
}

func (s *stack) printUsage() {
	c := s.cfg
	rel := func(p string) string {
		if r, err := filepath.Rel(c.Root, p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
		return p
	}
	lease := fmt.Sprintf(`curl -sS -X POST -H "Authorization: Bearer %s" -d '{"selector":{"region":"local"},"ttlSeconds":300}' http://127.0.0.1:%d/v1/leases`, s.token, c.DiscoveryPort)
	fmt.Fprintf(c.Out, `
proxyfleet is running. Logs: %s

  Web UI:             http://127.0.0.1:%d
  Proxies:            bin/kubectl get proxies        (kubeconfig: %s)
  Lease a proxy:      %s
  Fetch through it:   curl -sS -x %s http://127.0.0.1:%d/healthz
  Or via the gateway: curl -sS -i -x http://%s:%s@127.0.0.1:%d http://127.0.0.1:%d/healthz
  Crawl with Scrapy:  PYTHONPATH=discovery/client/python PROXYFLEET_TOKEN=%s /usr/bin/python3 -m scrapy runspider discovery/client/python/examples/tour_spider.py
  Replace local-1:    bin/temporal workflow signal --address 127.0.0.1:%d --workflow-id %s --name replace --input '{"reason":"manual"}'
  A pool of 0..5:     bin/kubectl apply -f deploy/samples/pool-local.yaml
  Crawl the pool:     seq 60 | xargs -P 8 -I{} curl -sS -o /dev/null -w '%%{http_code} ' -x 'http://%s;pool=tour:%s@127.0.0.1:%d' 'http://127.0.0.1:%d/slow?seconds=2'

(The fetch line uses local-1's address and credentials, derived from the fleet key in
.state; a lease answers with the proxy's url, credentials included. The gateway leases a
proxy for each request itself; its answer names the proxy in Proxyfleet-Proxy. Local
proxies reach loopback targets only. The pool has no proxy until it is crawled: watch it
grow and, 30s after the crawl, shrink with bin/kubectl get proxypool tour -w.) Press Ctrl-C to stop everything.
READY
`, rel(s.logs), c.UIPort, rel(s.kubecfg), lease, s.firstURL, c.DaemonPort, "default", s.token, c.GatewayPort,
		c.DaemonPort, s.token, c.TemporalPort, contract.ProxyWorkflowID("default", "local-1"), "default", s.token, c.GatewayPort, c.DaemonPort)
}

// fleetKey returns the path of the dev stack's fleet key, generating it the first time. It
// lives in the state directory beside localproxyd's instances, whose credentials derive
// from it, so a restarted stack can still use the proxies it left running.
func fleetKey(stateDir string) (string, error) {
	path := filepath.Join(stateDir, "fleet.key")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	key := make([]byte, proxyauth.MinKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return "", err
	}
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write the fleet key: %w", err)
	}
	return path, nil
}

// proxyURL is p's proxy URL with the credentials its instance requires, as a lease would
// hand it out.
func proxyURL(keyPath string, p *v1alpha1.Proxy) (string, error) {
	kr, err := proxyauth.Load(keyPath, "")
	if err != nil {
		return "", err
	}
	creds, err := kr.Managed(kr.PrimaryID(), p.Status.InstanceName)
	if err != nil {
		return "", err
	}
	u := url.URL{Scheme: "http", User: url.UserPassword(creds.Username, creds.Password), Host: net.JoinHostPort(p.Status.IP, fmt.Sprint(p.Status.Port))}
	return u.String(), nil
}
