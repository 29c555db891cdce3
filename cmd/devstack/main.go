// Command devstack is `make dev`: the whole system on 127.0.0.1, until Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/proxyfleet/proxyfleet/internal/devstack"
)

func main() {
	root, _ := os.Getwd()
	state := flag.String("state-dir", filepath.Join(root, ".state"), "where logs and the kubeconfig go")
	proxies := flag.Int("proxies", 3, "sample local Proxies to apply")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := devstack.Run(ctx, devstack.Config{
		Root: root, StateDir: *state, Out: os.Stdout, Proxies: *proxies,
		TemporalPort: 7233, UIPort: 8233, DiscoveryPort: 8090, DaemonPort: 8089,
	})
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "devstack:", err)
		os.Exit(1)
	}
}
