// Command localproxyd runs real forward proxies on 127.0.0.1 for the local provider: the
// worker asks it for instances over a JSON control API, and each instance is an HTTP proxy
// (absolute-URI requests and CONNECT, basic proxy credentials required) on its own
// loopback port.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"runtime"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/cmdline"
	"github.com/proxyfleet/proxyfleet/internal/localproxy"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8089", "control API address (loopback only)")
	var opts localproxy.DaemonOptions
	flag.StringVar(&opts.StateFile, "state-file", "", "file that keeps instances across restarts (empty: memory only)")
	flag.DurationVar(&opts.ProvisionDelay, "provision-delay", 0, "how long new instances stay Provisioning before they listen")
	flag.BoolVar(&opts.AllowRemote, "allow-remote", false, "let proxies reach targets beyond loopback")
	flag.BoolVar(&opts.DistinctEgress, "distinct-egress", runtime.GOOS == "linux",
		"connect each instance to targets from a loopback address of its own (127.88.x.y), so local sites tell proxies apart by IP (Linux)")
	cmdline.Main("localproxyd", func(ctx context.Context, p *cmdline.Process) error {
		opts.Log = p.Log
		return run(ctx, *listen, opts)
	})
}

func run(ctx context.Context, listen string, opts localproxy.DaemonOptions) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	// The control API has no authentication: it must not be reachable from elsewhere.
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen must be a loopback address, got %q", host)
	}
	d, err := localproxy.NewDaemon(opts)
	if err != nil {
		return err
	}
	defer d.Close()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	opts.Log.Info("localproxyd listening", "addr", ln.Addr().String(), "stateFile", opts.StateFile, "provisionDelay", opts.ProvisionDelay.String())
	// Print the bound address on stdout so a parent that passed port 0 can find it.
	fmt.Printf("listening on %s\n", ln.Addr())
	start := time.Now()
	err = d.Serve(ctx, ln)
	opts.Log.Info("localproxyd stopped", "uptime", time.Since(start).Round(time.Second).String())
	return err
}
