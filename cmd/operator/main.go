// Command operator runs the thin controller: it watches Proxy objects (and cloud-init
// Secrets) and hands each change to the Proxy's workflow in Temporal.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	dclient "github.com/proxyfleet/proxyfleet/discovery/client"
	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/operator/controller"
	"github.com/proxyfleet/proxyfleet/workflows/proxyinput"
)

func main() {
	temporal := cmdline.TemporalFlags()
	var opts controller.Options
	cmdline.TaskQueueVar(&opts.TaskQueue, "task queue of the workflows it starts")
	cmdline.InstallationVar(&opts.Installation, "installation id handed to new workflows")
	flag.StringVar(&opts.MetricsAddress, "metrics-bind-address", "127.0.0.1:8080", "address of /metrics")
	flag.StringVar(&opts.HealthProbeAddress, "health-probe-bind-address", "127.0.0.1:8081", "address of /healthz and /readyz")
	flag.BoolVar(&opts.LeaderElection, "leader-elect", false, "elect a leader, so only one replica reconciles")
	flag.StringVar(&opts.LeaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (default: the pod's)")
	flag.DurationVar(&opts.ResyncInterval, "resync-interval", controller.DefaultResyncInterval,
		"how often the leader starts again the workflows of live Proxies that stopped (terminated, failed); negative turns it off")
	tuning := tuningFlags(flag.CommandLine)
	discoveryURL := flag.String("discovery-url", cmdline.Env("DISCOVERY_URL", ""),
		"base URL of discovery's API, where the autoscaler reads the demand on ProxyPools with spec.autoscale; empty leaves them at their size (env DISCOVERY_URL; the bearer token comes from env DISCOVERY_TOKEN)")
	flag.DurationVar(&opts.AutoscaleInterval, "autoscale-interval", controller.DefaultAutoscaleInterval,
		"how often the leader reads each autoscaled pool's demand: the most it adds to the first request of a pool scaled to zero")

	cmdline.Main("operator", func(ctx context.Context, p *cmdline.Process) error {
		opts.Tuning = *tuning
		// Lazy: the operator starts while Temporal is down; reconciles retry until it is back.
		tc, err := temporal.Dial(p, true, nil)
		if err != nil {
			return err
		}
		defer tc.Close()
		if *discoveryURL != "" {
			if err := checkDiscoveryURL(*discoveryURL); err != nil {
				return err
			}
			// From the environment only, so it never shows in a process listing.
			opts.Discovery = dclient.New(*discoveryURL, os.Getenv("DISCOVERY_TOKEN"))
		}
		p.Log.Info("operator starting", "temporal", temporal.Address, "taskQueue", opts.TaskQueue, "leaderElect", opts.LeaderElection)
		return controller.Run(ctx, opts, tc, p.LogHandler)
	})
}

// tuningFlags registers the workflow timings. They are handed to workflows the operator
// starts (a running workflow keeps its own); 0 keeps the default. Shorter timings recover
// faster from a dead worker at the price of more Temporal traffic; fault tests use them.
func tuningFlags(fs *flag.FlagSet) *proxyinput.Tuning {
	t := &proxyinput.Tuning{}
	def := proxyinput.Tuning{}.WithDefaults()
	for _, f := range []struct {
		name string
		v    *time.Duration
		d    time.Duration
		help string
	}{
		{"tuning-poll-interval", &t.PollInterval, def.PollInterval, "how often activities ask the provider about an instance"},
		{"tuning-retry-base", &t.RetryBase, def.RetryBase, "first backoff after a failure that outlived an activity's retries"},
		{"tuning-retry-max", &t.RetryMax, def.RetryMax, "longest such backoff"},
		{"tuning-quota-retry", &t.QuotaRetry, def.QuotaRetry, "wait after a quota refusal"},
		{"tuning-activity-timeout", &t.ActivityTimeout, def.ActivityTimeout, "bound of one provider call; a worker that dies mid-call is noticed after this long"},
		{"tuning-heartbeat-timeout", &t.HeartbeatTimeout, def.HeartbeatTimeout, "how soon a dead worker's long activities move to another worker"},
		{"tuning-wait-running-max", &t.WaitRunningMax, def.WaitRunningMax, "bound of one wait for an instance to run"},
		{"tuning-drift-interval", &t.DriftInterval, def.DriftInterval, "how often the monitor checks that the instance still exists"},
	} {
		fs.DurationVar(f.v, f.name, 0, fmt.Sprintf("%s (0: %s)", f.help, f.d))
	}
	return t
}

// checkDiscoveryURL refuses a --discovery-url the autoscaler could never use, at start
// rather than in every pool's condition, and one with credentials in it: the token goes in
// DISCOVERY_TOKEN, never on a command line a process listing shows.
func checkDiscoveryURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("--discovery-url is not a URL (%v): use http://host:port", errors.Unwrap(err))
	}
	if u.User != nil {
		return fmt.Errorf("--discovery-url %s carries credentials: give the token in DISCOVERY_TOKEN instead", u.Redacted())
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--discovery-url %s: use http://host:port or https://host:port", u.Redacted())
	}
	return nil
}
