// Command localproxyd runs real forward proxies on 127.0.0.1 for the local provider: the
// worker asks it for instances over a JSON control API, and each instance is an HTTP proxy
// (absolute-URI requests and CONNECT) on its own loopback port.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/localproxy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "localproxyd:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:8089", "control API address (loopback only)")
	stateFile := flag.String("state-file", "", "file that keeps instances across restarts (empty: memory only)")
	delay := flag.Duration("provision-delay", 0, "how long new instances stay Provisioning before they listen")
	allowRemote := flag.Bool("allow-remote", false, "let proxies reach targets beyond loopback")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--listen must be a loopback address, got %q", host)
	}
	d, err := localproxy.NewDaemon(localproxy.DaemonOptions{StateFile: *stateFile, ProvisionDelay: *delay, AllowRemote: *allowRemote, Log: log})
	if err != nil {
		return err
	}
	defer d.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Info("localproxyd listening", "addr", ln.Addr().String(), "stateFile", *stateFile, "provisionDelay", delay.String())
	// Print the bound address on stdout so a parent that passed port 0 can find it.
	fmt.Printf("listening on %s\n", ln.Addr())
	start := time.Now()
	err = d.Serve(ctx, ln)
	log.Info("localproxyd stopped", "uptime", time.Since(start).Round(time.Second).String())
	return err
}
