// Command discovery serves the crawler-facing API: list, lease, renew, release and report.
// It reads proxy state from Temporal only, never from Kubernetes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/discovery"
	"github.com/proxyfleet/proxyfleet/discovery/gateway"
	"github.com/proxyfleet/proxyfleet/discovery/service"
	"github.com/proxyfleet/proxyfleet/discovery/temporal"
	"github.com/proxyfleet/proxyfleet/internal/cmdline"
)

func main() {
	tflags := cmdline.TemporalFlags()
	var cfg service.Config
	listen := flag.String("listen", cmdline.Env("DISCOVERY_LISTEN", "127.0.0.1:8090"), "address of the API, /healthz, /readyz and /metrics (env DISCOVERY_LISTEN)")
	flag.DurationVar(&cfg.API.DefaultTTL, "default-ttl", discovery.DefaultTTL, "lease TTL when a request gives none")
	flag.DurationVar(&cfg.API.MaxTTL, "max-ttl", discovery.DefaultMaxTTL, "longest TTL a lease or renewal may ask for")
	flag.DurationVar(&cfg.API.MaxAcquireWait, "max-acquire-wait", discovery.DefaultMaxAcquireWait, "longest an acquire may wait for a proxy when none can take it (its waitSeconds; more is a 400)")
	flag.DurationVar(&cfg.API.CooldownRateLimited, "cooldown-rate-limited", discovery.DefaultCooldownRateLimited, "cooldown of a proxy for a target after a rate_limited report")
	flag.DurationVar(&cfg.API.CooldownBanned, "cooldown-banned", discovery.DefaultCooldownBanned, "cooldown of a proxy for a target after a banned report")
	flag.DurationVar(&cfg.RefreshInterval, "refresh-interval", temporal.DefaultRefreshInterval, "how often the index reads what changed in Temporal")
	flag.DurationVar(&cfg.FullResyncInterval, "full-resync-interval", temporal.DefaultFullResyncInterval, "how often the index re-reads every proxy")
	cmdline.ListVar(&cfg.API.TrustedProxies, "trusted-proxies", cmdline.Env("DISCOVERY_TRUSTED_PROXIES", ""),
		"comma-separated addresses or CIDRs of load balancers whose X-Forwarded-For names the client in logs (default: none) (env DISCOVERY_TRUSTED_PROXIES)")
	flag.StringVar(&cfg.ClientsFile, "clients-file", cmdline.Env("DISCOVERY_CLIENTS_FILE", ""),
		"file of named clients, each with its token (or its SHA-256) and optional limits; reloaded while discovery runs. Replaces DISCOVERY_TOKEN (env DISCOVERY_CLIENTS_FILE)")
	flag.DurationVar(&cfg.ClientsReload, "clients-reload-interval", 5*time.Second, "how often the clients file is read again")
	insecure := flag.Bool("insecure-no-auth", false,
		"serve without authentication when DISCOVERY_TOKEN is empty; allowed only on a loopback --listen address (development)")
	fleetKey := cmdline.FleetKeyVar()
	cmdline.ListVar(&cfg.Replicas.Peers, "peers", cmdline.Env("DISCOVERY_PEERS", ""),
		"comma-separated base URLs of every discovery replica, this one included, in replica-number order; empty runs alone, and leases do not survive a restart (env DISCOVERY_PEERS)")
	gatewayListen := flag.String("gateway-listen", cmdline.Env("DISCOVERY_GATEWAY_LISTEN", "127.0.0.1:8091"),
		"address of the gateway, the fleet as one forward proxy (HTTP and CONNECT) that crawlers set as HTTP_PROXY; empty turns it off (env DISCOVERY_GATEWAY_LISTEN)")
	var reportStatuses []string
	cmdline.ListVar(&reportStatuses, "gateway-report-statuses", "403,429",
		"comma-separated statuses of plain HTTP answers through the gateway that report the proxy for the site: 429 as rate_limited, others as banned")
	flag.IntVar(&cfg.Gateway.Attempts, "gateway-attempts", gateway.DefaultAttempts,
		"fleet proxies one gateway request or tunnel tries when a proxy refuses before anything was sent")
	flag.DurationVar(&cfg.Gateway.Wait, "gateway-wait", gateway.DefaultWait,
		"how long a gateway request or tunnel waits for a proxy when none can take it now (every one full or resting, or none matching or healthy yet) (0: the default; negative: answer 503 at once)")
	flag.DurationVar(&cfg.Gateway.GrowWait, "gateway-grow-wait", gateway.DefaultGrowWait,
		"how long a gateway request or tunnel waits when no proxy matches it yet, or none is healthy, but a ProxyPool's autoscaler watches the proxies it asks for (a pool scaled to zero starting one)")
	flag.DurationVar(&cfg.Gateway.LeaseTTL, "gateway-lease-ttl", gateway.DefaultLeaseTTL,
		"TTL of the lease each gateway request or tunnel holds, renewed while it lasts")
	flag.IntVar(&cfg.Gateway.Loops, "gateway-loops", 0,
		"event loops that serve the gateway's CONNECT tunnels on Linux, each from its head to its end without a goroutine of its own (0: one per CPU Go uses; negative: none, a goroutine per connection)")
	replica := flag.String("replica", cmdline.Env("DISCOVERY_REPLICA", "0"),
		"this replica's number in --peers, or a StatefulSet pod name ending in it, such as discovery-2 (env DISCOVERY_REPLICA)")

	cmdline.Main("discovery", func(ctx context.Context, p *cmdline.Process) error {
		// The token comes from the environment only, so it never shows in a process listing.
		cfg.API.Token = os.Getenv("DISCOVERY_TOKEN")
		if err := checkAuth(cfg.API.Token, cfg.ClientsFile, *insecure, *listen); err != nil {
			return err
		}
		if *gatewayListen != "" {
			// Without authentication the gateway is an open proxy: loopback only, too.
			if err := checkAuth(cfg.API.Token, cfg.ClientsFile, *insecure, *gatewayListen); err != nil {
				return fmt.Errorf("--gateway-listen: %w", err)
			}
		}
		var err error
		if cfg.Gateway.ReportStatuses, err = parseStatuses(reportStatuses); err != nil {
			return err
		}
		if err := cfg.Gateway.Validate(); err != nil {
			return err
		}
		if cfg.ClientsFile != "" {
			clients, err := discovery.LoadClients(cfg.ClientsFile)
			if err != nil {
				return err
			}
			cfg.API.Clients = clients
			p.Log.Info("clients loaded", "clients", clients.Names())
		}
		for _, p := range cfg.API.TrustedProxies {
			if _, err := netip.ParsePrefix(p); err != nil {
				if _, err := netip.ParseAddr(p); err != nil {
					return fmt.Errorf("--trusted-proxies: %q is neither an address nor a CIDR", p)
				}
			}
		}
		// Required: without the key no proxy that takes credentials could be leased, and
		// every Managed proxy does.
		kr, err := fleetKey()
		if err != nil {
			return err
		}
		cfg.Keyring = kr
		if cfg.Replicas.Self, err = replicaNumber(*replica); err != nil {
			return err
		}
		cfg.Replicas.Tokens = kr.PeerTokens()
		if err := cfg.Replicas.Validate(); err != nil {
			return err
		}
		cfg.Namespace = tflags.Namespace
		reg := cmdline.NewMetrics()
		tc, err := tflags.Dial(p, true, nil)
		if err != nil {
			return err
		}
		defer tc.Close()
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return fmt.Errorf("--listen: %w", err)
		}
		var gw net.Listener
		if *gatewayListen != "" {
			if gw, err = gateway.Listen(ctx, *gatewayListen); err != nil {
				return fmt.Errorf("--gateway-listen: %w", err)
			}
			p.Log.Info("gateway listening", "addr", gw.Addr().String())
		}
		p.Log.Info("discovery listening", "addr", ln.Addr().String(), "temporal", tflags.Address, "fleetKeyIDs", kr.IDs())
		return service.New(cfg, tc, p.Log, reg).ServeWithGateway(ctx, ln, gw)
	})
}

// parseStatuses reads --gateway-report-statuses.
func parseStatuses(list []string) ([]int, error) {
	out := []int{}
	for _, s := range list {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("--gateway-report-statuses: %q is not a status code", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// replicaNumber reads --replica: a number, or a pod name whose last dash-separated part
// is one (a StatefulSet names its pods so, and the downward API passes the name).
func replicaNumber(s string) (int, error) {
	n, err := strconv.Atoi(s[strings.LastIndex(s, "-")+1:])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("--replica %q is neither a replica number nor a pod name ending in one", s)
	}
	return n, nil
}

// checkAuth fails closed: an empty token (a Secret created empty, a variable not passed
// through) must not quietly open the API, which hands out proxy credentials. Running
// without one takes --insecure-no-auth, and only where no one else can connect.
func checkAuth(token, clientsFile string, insecure bool, listen string) error {
	switch {
	case token != "" && clientsFile != "":
		return errors.New("both DISCOVERY_TOKEN and --clients-file are set: put the token in the clients file (as a client of its own) and drop DISCOVERY_TOKEN")
	case (token != "" || clientsFile != "") && insecure:
		return errors.New("--insecure-no-auth is set but crawlers' credentials are configured (DISCOVERY_TOKEN or --clients-file): drop one of them")
	case token != "" || clientsFile != "":
		return nil
	case !insecure:
		return errors.New("DISCOVERY_TOKEN is empty and there is no --clients-file: set one to the credentials crawlers present, or pass --insecure-no-auth to serve without authentication on a loopback --listen address")
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--insecure-no-auth serves without authentication and is allowed only on a loopback address; --listen is %q", listen)
	}
	return nil
}
