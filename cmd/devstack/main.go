// Command devstack is `make dev`: the whole system on 127.0.0.1, until Ctrl-C.
package main

import (
	"context"
	"flag"
	"os"
	"path/filepath"

	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/internal/devstack"
)

func main() {
	// devstack also starts some servers through itself, so they die with it.
	devstack.RunTied()
	root, _ := os.Getwd()
	cfg := devstack.Config{Root: root, Out: os.Stdout}
	flag.StringVar(&cfg.StateDir, "state-dir", filepath.Join(root, ".state"), "where logs and the kubeconfig go")
	flag.IntVar(&cfg.Proxies, "proxies", 3, "sample local Proxies to apply")
	// Fixed by default, so the printed commands stay the same from run to run.
	flag.IntVar(&cfg.TemporalPort, "temporal-port", 7233, "Temporal dev server's frontend port")
	flag.IntVar(&cfg.UIPort, "ui-port", 8233, "Temporal Web UI's port")
	flag.IntVar(&cfg.DiscoveryPort, "discovery-port", 8090, "discovery API's port")
	flag.IntVar(&cfg.GatewayPort, "gateway-port", 8091, "discovery gateway's port")
	flag.IntVar(&cfg.DaemonPort, "daemon-port", 8089, "localproxyd's port")
	cmdline.Main("devstack", func(ctx context.Context, _ *cmdline.Process) error {
		ctx, stop := devstack.Signals(ctx)
		defer stop()
		// After Ctrl-C, a part that does not stop cleanly is not worth a failed `make dev`.
		if err := devstack.Run(ctx, cfg); err != nil && ctx.Err() == nil {
			return err
		}
		return nil
	})
}
