// Command worker hosts ProxyWorkflow, GCWorkflow and their activities on the task queue
// (default "proxies"), and keeps the proxy-gc schedule in step with its flags. It is the
// only process that talks to providers and the only writer of Proxy status.
package main

import (
	"k8s.io/apimachinery/pkg/labels"

	"context"
	"flag"
	"fmt"

	"github.com/proxyfleet/proxyfleet/activities/provider/kubernetes"
	"github.com/proxyfleet/proxyfleet/activities/provider/registry"
	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/internal/worker"
	"github.com/proxyfleet/proxyfleet/operator/api/v1alpha1"
	"github.com/proxyfleet/proxyfleet/workflows"
)

func main() {
	temporal := cmdline.TemporalFlags()
	var cfg worker.Config
	cmdline.TaskQueueVar(&cfg.TaskQueue, "task queue")
	cmdline.InstallationVar(&cfg.Installation, "installation id put on every instance")
	providers := flag.String("providers", cmdline.Env("PROXYFLEET_PROVIDERS", "local,kubernetes"), "comma-separated providers to enable: "+registry.Join(registry.Available)+" (env PROXYFLEET_PROVIDERS)")
	flag.StringVar(&cfg.Providers.GCP.DefaultProject, "gcp-project", cmdline.Env("GOOGLE_CLOUD_PROJECT", ""), "default GCP project for the gcp provider; credentials come from Application Default Credentials (env GOOGLE_CLOUD_PROJECT)")
	flag.StringVar(&cfg.Providers.AWSRegion, "aws-region", cmdline.Env("AWS_REGION", ""), "default region of the aws provider; credentials come from the AWS SDK's default chain (env AWS_REGION)")
	cmdline.ListVar(&cfg.Providers.AWS.Regions, "aws-sweep-regions", cmdline.Env("PROXYFLEET_AWS_SWEEP_REGIONS", ""),
		"comma-separated regions the orphan sweep lists for the aws provider (default: --aws-region alone); name every region Proxies use (env PROXYFLEET_AWS_SWEEP_REGIONS)")
	flag.StringVar(&cfg.Providers.LocalDaemonURL, "local-daemon", cmdline.Env("LOCAL_DAEMON_URL", "http://127.0.0.1:8089"), "control API of localproxyd, for the local provider (env LOCAL_DAEMON_URL)")
	httpAddr := flag.String("http-address", cmdline.Env("HTTP_ADDRESS", "127.0.0.1:9090"), "address of /metrics and /healthz (env HTTP_ADDRESS)")
	flag.IntVar(&cfg.MaxConcurrentActivities, "max-concurrent-activities", worker.DefaultMaxConcurrentActivities, "activity slots; each monitor shard, and each proxy watched by a workflow of version 3 or older, holds one for its whole life")
	flag.IntVar(&cfg.MonitorShards, "monitor-shards", worker.DefaultMonitorShards, "monitor shards watching the task queue's proxies; every worker of a task queue must be given the same count")
	flag.DurationVar(&cfg.GC.Every, "gc-interval", workflows.DefaultGCInterval, "how often the proxy-gc schedule sweeps orphaned instances (0 leaves the schedule alone)")
	flag.DurationVar(&cfg.GC.MinAge, "gc-min-age", workflows.DefaultGCMinAge, "instances younger than this are never swept (0: the default)")
	flag.BoolVar(&cfg.GC.DryRun, "gc-dry-run", false, "report orphans without deleting them")
	cmdline.ListVar(&cfg.GC.Namespaces, "gc-namespaces", "", "comma-separated namespaces the worker can see Proxies in (empty: all)")
	flag.BoolVar(&cfg.GC.AllowPartialView, "gc-allow-partial-view", false, "sweep even though --gc-namespaces limits the view (only if this installation's instances all belong to those namespaces)")

	cmdline.ListVar(&cfg.Providers.KubernetesAllow.Namespaces, "kubernetes-allowed-namespaces", cmdline.Env("PROXYFLEET_KUBERNETES_ALLOWED_NAMESPACES", ""),
		"comma-separated namespaces the kubernetes provider may put a Proxy's pod in besides the Proxy's own (\"*\": any) (env PROXYFLEET_KUBERNETES_ALLOWED_NAMESPACES)")
	cmdline.ListVar(&cfg.Providers.KubernetesAllow.Images, "kubernetes-allowed-images", cmdline.Env("PROXYFLEET_KUBERNETES_ALLOWED_IMAGES", ""),
		"comma-separated images the kubernetes provider may run; a trailing * matches a prefix (default: only "+v1alpha1.DefaultSquidImage+") (env PROXYFLEET_KUBERNETES_ALLOWED_IMAGES)")
	workerNamespace := flag.String("kubernetes-worker-namespace", cmdline.Env("POD_NAMESPACE", ""),
		"namespace of the worker's pods, admitted by every Squid pod's NetworkPolicy so probes get through; empty admits none (env POD_NAMESPACE)")
	workerLabels := flag.String("kubernetes-worker-labels", cmdline.Env("PROXYFLEET_WORKER_LABELS", "app.kubernetes.io/name=proxyfleet,app.kubernetes.io/component=worker"),
		"labels of the worker's pods, as key=value pairs separated by commas (env PROXYFLEET_WORKER_LABELS)")
	fleetKey := cmdline.FleetKeyVar()

	cmdline.Main("worker", func(ctx context.Context, p *cmdline.Process) error {
		var err error
		if cfg.Providers.Enabled, err = registry.ParseNames(*providers); err != nil {
			return fmt.Errorf("--providers: %w", err)
		}
		if cfg.Keyring, err = fleetKey(); err != nil {
			return err
		}
		workerSel, err := labels.ConvertSelectorToLabelsMap(*workerLabels)
		if err != nil {
			return fmt.Errorf("--kubernetes-worker-labels: %w", err)
		}
		cfg.Providers.KubernetesProbeFrom = kubernetes.WorkerPeer(*workerNamespace, workerSel)
		return worker.Run(ctx, p, temporal, cfg, *httpAddr)
	})
}
