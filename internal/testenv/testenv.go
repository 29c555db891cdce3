package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/testsuite"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	ctrlclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/proxyfleet/proxyfleet/operator/api"
	"github.com/proxyfleet/proxyfleet/workflows/contract"
)

// Options says which servers a test package needs.
type Options struct {
	Temporal bool
	// TemporalRestartable runs the dev server as a plain child process on a database file,
	// so fault tests can kill it (TemporalEnv.KillServer) and start it again with its data
	// (TemporalEnv.StartServer).
	TemporalRestartable bool
	Kube                bool
	// TemporalArgs are added to the dev server's command line (with Temporal), e.g. a
	// --dynamic-config-value that lowers a limit for the package's tests.
	TemporalArgs []string
}

// TemporalEnv is a running Temporal dev server.
type TemporalEnv struct {
	// HostPort is the frontend's gRPC address.
	HostPort string
	// Namespace is the namespace registered on the server.
	Namespace string
	// Client is a client connected to the server, shared by the package's tests.
	Client client.Client
	// Binary is the temporal CLI, for tests that drive it like an operator would.
	Binary string
	// MetricsURL is the server's Prometheus endpoint (…/metrics), where it counts the
	// billable actions it served (see Actions).
	MetricsURL string

	dev *devServer // set with Options.TemporalRestartable
}

// KubeEnv is a running kube-apiserver with the project's CRDs installed.
type KubeEnv struct {
	Config *rest.Config
	Client ctrlclient.Client
	Scheme *runtime.Scheme
	// Kubectl is the pinned kubectl binary.
	Kubectl string

	kubeconfig []byte
	apiserver  apiServer
}

var (
	temporalEnv *TemporalEnv
	kubeEnv     *KubeEnv
)

// Temporal returns the package's Temporal server; it fails the test if TestMain did not
// start one.
func Temporal(t testing.TB) *TemporalEnv {
	t.Helper()
	if temporalEnv == nil {
		t.Fatal("testenv: Temporal was not started; call testenv.Run(m, testenv.Options{Temporal: true}) in TestMain")
	}
	return temporalEnv
}

// Kube returns the package's kube-apiserver; it fails the test if TestMain did not start one.
func Kube(t testing.TB) *KubeEnv {
	t.Helper()
	if kubeEnv == nil {
		t.Fatal("testenv: kube-apiserver was not started; call testenv.Run(m, testenv.Options{Kube: true}) in TestMain")
	}
	return kubeEnv
}

// Run starts the servers in opts, runs the package's tests and stops the servers. Its result
// is the process exit code.
func Run(m *testing.M, opts Options) int {
	code, err := run(m, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	return code
}

func run(m *testing.M, opts Options) (code int, err error) {
	root, err := RepoRoot()
	if err != nil {
		return 0, err
	}
	defer func() {
		if commandsDir != "" { // built by Command for these tests
			err = errors.Join(err, os.RemoveAll(commandsDir))
		}
	}()
	if opts.TemporalRestartable {
		env, err := startRestartableTemporal(root)
		if err != nil {
			return 0, err
		}
		temporalEnv = env
		defer func() {
			env.Client.Close()
			err = errors.Join(err, env.dev.proc.Stop(10*time.Second), os.RemoveAll(env.dev.dir))
		}()
	} else if opts.Temporal {
		srv, env, err := startTemporal(root, opts.TemporalArgs)
		if err != nil {
			return 0, err
		}
		temporalEnv = env
		defer func() {
			env.Client.Close()
			err = errors.Join(err, srv.Stop())
		}()
	}
	if opts.Kube {
		te, env, err := startKube(root)
		if err != nil {
			return 0, err
		}
		kubeEnv = env
		defer func() {
			env.apiserver.stop() // one a fault test restarted; envtest stops its own
			err = errors.Join(err, te.Stop())
		}()
	}
	return m.Run(), nil
}

// RepoRoot finds the module root by walking up from the working directory, which go test
// sets to the package's folder.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Binary returns the path of a pinned tool in bin/, or an error telling how to build it.
func Binary(root, rel string) (string, error) {
	p := filepath.Join(root, "bin", rel)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s is missing: run `make tools` (it builds the pinned tools into bin/)", p)
	}
	return p, nil
}

// TemporalBinary is the pinned temporal CLI; TEMPORAL_CLI overrides it.
func TemporalBinary(root string) (string, error) {
	if p := os.Getenv("TEMPORAL_CLI"); p != "" {
		return p, nil
	}
	return Binary(root, "temporal")
}

func startTemporal(root string, extra []string) (*testsuite.DevServer, *TemporalEnv, error) {
	bin, err := TemporalBinary(root)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out io.Writer = io.Discard
	if os.Getenv("TESTENV_VERBOSE") != "" {
		out = os.Stderr
	}
	ports, err := FreePorts(1)
	if err != nil {
		return nil, nil, err
	}
	const namespace = "default"
	srv, err := testsuite.StartDevServer(ctx, testsuite.DevServerOptions{
		ExtraArgs:    append([]string{"--metrics-port", strconv.Itoa(ports[0])}, extra...),
		ExistingPath: bin,
		ClientOptions: &client.Options{
			Namespace: namespace,
			Logger:    log.NewStructuredLogger(quietLogger()),
		},
		SearchAttributes: contract.SearchAttributes(),
		LogLevel:         "error",
		Stdout:           out,
		Stderr:           out,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("start temporal dev server: %w", err)
	}
	return srv, &TemporalEnv{
		HostPort:   srv.FrontendHostPort(),
		Namespace:  namespace,
		Client:     srv.Client(),
		Binary:     bin,
		MetricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0]),
	}, nil
}

func startRestartableTemporal(root string) (*TemporalEnv, error) {
	bin, err := TemporalBinary(root)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "testenv-temporal-")
	if err != nil {
		return nil, err
	}
	var out io.Writer = io.Discard
	if os.Getenv("TESTENV_VERBOSE") != "" {
		out = os.Stderr
	}
	dev, err := newDevServer(bin, dir, out)
	if err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dev.start(ctx); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	const namespace = "default"
	c, err := client.Dial(client.Options{HostPort: dev.hostPort, Namespace: namespace, Logger: log.NewStructuredLogger(quietLogger())})
	if err != nil {
		return nil, errors.Join(err, dev.proc.Stop(10*time.Second), os.RemoveAll(dir))
	}
	return &TemporalEnv{HostPort: dev.hostPort, Namespace: namespace, Client: c, Binary: bin, MetricsURL: dev.metricsURL, dev: dev}, nil
}

func startKube(root string) (*envtest.Environment, *KubeEnv, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin", "k8s")
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, nil, fmt.Errorf("%s is missing from %s: run `make tools`", b, assets)
		}
	}
	scheme := api.NewScheme()
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join(root, "deploy", "crd")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := te.Start()
	if err != nil {
		return nil, nil, fmt.Errorf("start kube-apiserver (envtest): %w", err)
	}
	c, err := ctrlclient.New(cfg, ctrlclient.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, errors.Join(err, te.Stop())
	}
	admin, err := te.AddUser(envtest.User{Name: "testenv-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, nil, errors.Join(err, te.Stop())
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		return nil, nil, errors.Join(err, te.Stop())
	}
	return te, &KubeEnv{
		Config: cfg, Client: c, Scheme: scheme,
		Kubectl: filepath.Join(assets, "kubectl"), kubeconfig: kubeconfig,
	}, nil
}

// Kubeconfig writes a kubeconfig for the test's kube-apiserver into a temp dir and returns
// its path, for tests that drive kubectl or a binary like a user would.
func (k *KubeEnv) Kubeconfig(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, k.kubeconfig, 0o600); err != nil {
		t.Fatalf("testenv: kubeconfig: %v", err)
	}
	return p
}

// RunKubectl runs the pinned kubectl against the test's kube-apiserver and returns its
// combined output.
func (k *KubeEnv) RunKubectl(t testing.TB, stdin io.Reader, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(k.Kubectl, append([]string{"--kubeconfig", k.Kubeconfig(t)}, args...)...)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// quietLogger keeps the SDK's chatter out of test output: stopping a worker at the end of
// each test cancels its monitors, which the SDK logs as errors. TESTENV_VERBOSE=1 shows all.
func quietLogger() *slog.Logger {
	level := slog.LevelError + 4
	if os.Getenv("TESTENV_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}
