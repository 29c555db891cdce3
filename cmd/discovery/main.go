// Command discovery serves the crawler-facing API: list, lease, renew, release and report.
// It reads proxy state from Temporal only, never from Kubernetes.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/internal/cmdline"
)

func main() {
	temporal := cmdline.TemporalFlags()
	var cfg discovery.ServiceConfig
	listen := flag.String("listen", cmdline.Env("DISCOVERY_LISTEN", "127.0.0.1:8090"), "address of the API, /healthz, /readyz and /metrics (env DISCOVERY_LISTEN)")
	flag.DurationVar(&cfg.API.DefaultTTL, "default-ttl", discovery.DefaultTTL, "lease TTL when a request gives none")
	flag.DurationVar(&cfg.API.MaxTTL, "max-ttl", discovery.DefaultMaxTTL, "longest TTL a lease or renewal may ask for")
	flag.DurationVar(&cfg.API.CooldownRateLimited, "cooldown-rate-limited", discovery.DefaultCooldownRateLimited, "cooldown of a proxy for a target after a rate_limited report")
	flag.DurationVar(&cfg.API.CooldownBanned, "cooldown-banned", discovery.DefaultCooldownBanned, "cooldown of a proxy for a target after a banned report")
	flag.DurationVar(&cfg.RefreshInterval, "refresh-interval", discovery.DefaultRefreshInterval, "how often the index reads what changed in Temporal")
	flag.DurationVar(&cfg.FullResyncInterval, "full-resync-interval", discovery.DefaultFullResyncInterval, "how often the index re-reads every proxy")
	cmdline.ListVar(&cfg.API.TrustedProxies, "trusted-proxies", cmdline.Env("DISCOVERY_TRUSTED_PROXIES", ""),
		"comma-separated addresses or CIDRs of load balancers whose X-Forwarded-For names the client in logs (default: none) (env DISCOVERY_TRUSTED_PROXIES)")
	fleetKey := cmdline.FleetKeyVar()

	cmdline.Main("discovery", func(ctx context.Context, p *cmdline.Process) error {
		// The token comes from the environment only, so it never shows in a process listing.
		cfg.API.Token = os.Getenv("DISCOVERY_TOKEN")
		// Required: without the key no proxy that takes credentials could be leased, and
		// every Managed proxy does.
		for _, p := range cfg.API.TrustedProxies {
			if _, err := netip.ParsePrefix(p); err != nil {
				if _, err := netip.ParseAddr(p); err != nil {
					return fmt.Errorf("--trusted-proxies: %q is neither an address nor a CIDR", p)
				}
			}
		}
		kr, err := fleetKey()
		if err != nil {
			return err
		}
		cfg.Keyring = kr
		cfg.Namespace = temporal.Namespace
		reg := cmdline.NewMetrics()
		tc, err := temporal.Dial(p, true, nil)
		if err != nil {
			return err
		}
		defer tc.Close()
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		p.Log.Info("discovery listening", "addr", ln.Addr().String(), "temporal", temporal.Address, "fleetKeyIDs", kr.IDs())
		return discovery.NewService(cfg, tc, p.Log, reg).Serve(ctx, ln)
	})
}
