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
	root, _ := os.Getwd()
	cfg := devstack.Config{Root: root, Out: os.Stdout, TemporalPort: 7233, UIPort: 8233, DiscoveryPort: 8090, GatewayPort: 8091, DaemonPort: 8089}
	flag.StringVar(&cfg.StateDir, "state-dir", filepath.Join(root, ".state"), "where logs and the kubeconfig go")
	flag.IntVar(&cfg.Proxies, "proxies", 3, "sample local Proxies to apply")
	cmdline.Main("devstack", func(ctx context.Context, _ *cmdline.Process) error {
		// After Ctrl-C, a part that does not stop cleanly is not worth a failed `make dev`.
		if err := devstack.Run(ctx, cfg); err != nil && ctx.Err() == nil {
			return err
		}
		return nil
	})
}
