package discovery

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
	"sigs.k8s.io/yaml"
)

// ClientConfig is one named crawler identity of the clients file.
type ClientConfig struct {
	// Name appears in logs and metrics (a label value), never the token.
	Name string `json:"name"`
	// Token is the bearer token the client presents; TokenSHA256 is its SHA-256 in hex
	// instead, so that the file need not hold the token itself. Exactly one is set.
	Token       string `json:"token,omitempty"`
	TokenSHA256 string `json:"tokenSHA256,omitempty"`
	// MaxLeases caps the client's live leases (0: no cap beyond the fleet's capacity).
	MaxLeases int `json:"maxLeases,omitempty"`
	// RequestsPerSecond caps the client's requests to each replica, with bursts of Burst
	// (default: one second's worth, at least 1); 0 sets no rate limit.
	RequestsPerSecond float64 `json:"requestsPerSecond,omitempty"`
	Burst             int     `json:"burst,omitempty"`
}

type clientsFile struct {
	Clients []ClientConfig `json:"clients"`
}

// maxClients bounds the clients of one file, and so the label values of the per-client
// metrics.
const maxClients = 256

var clientNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$`)

// ParseClients reads a clients file (YAML or JSON):
//
//	clients:
//	  - name: shop-crawler
//	    tokenSHA256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//	    maxLeases: 50
//	    requestsPerSecond: 20
//
// It refuses unknown fields, duplicate names or tokens, tokens under 16 characters and
// negative limits, naming the client and the field.
func ParseClients(data []byte) ([]ClientConfig, error) {
	var f clientsFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("clients file: %w", err)
	}
	if len(f.Clients) == 0 {
		return nil, errors.New("clients file: no clients: list at least one under clients")
	}
	if len(f.Clients) > maxClients {
		return nil, fmt.Errorf("clients file: %d clients; at most %d", len(f.Clients), maxClients)
	}
	names, hashes := map[string]bool{}, map[[32]byte]string{}
	for i, c := range f.Clients {
		at := fmt.Sprintf("clients[%d]", i)
		if c.Name != "" {
			at = fmt.Sprintf("client %q", c.Name)
		}
		switch {
		case !clientNameRE.MatchString(c.Name):
			return nil, fmt.Errorf("%s: name must be 1-63 lowercase alphanumerics, '-', '_' or '.'", at)
		case names[c.Name]:
			return nil, fmt.Errorf("%s: name is used twice", at)
		case (c.Token == "") == (c.TokenSHA256 == ""):
			return nil, fmt.Errorf("%s: set exactly one of token and tokenSHA256", at)
		case c.Token != "" && len(c.Token) < 16:
			return nil, fmt.Errorf("%s: token is %d characters; use at least 16 (for example openssl rand -hex 32)", at, len(c.Token))
		case c.MaxLeases < 0 || c.RequestsPerSecond < 0 || c.Burst < 0:
			return nil, fmt.Errorf("%s: maxLeases, requestsPerSecond and burst must not be negative", at)
		}
		h, err := c.tokenHash()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", at, err)
		}
		if other, dup := hashes[h]; dup {
			return nil, fmt.Errorf("%s: has the same token as client %q", at, other)
		}
		names[c.Name], hashes[h] = true, c.Name
	}
	return f.Clients, nil
}

func (c ClientConfig) tokenHash() ([32]byte, error) {
	if c.Token != "" {
		return sha256.Sum256([]byte(c.Token)), nil
	}
	var h [32]byte
	b, err := hex.DecodeString(c.TokenSHA256)
	if err != nil || len(b) != len(h) {
		return h, errors.New("tokenSHA256 must be 64 hexadecimal characters (sha256sum of the token)")
	}
	copy(h[:], b)
	return h, nil
}

// Client is a configured identity at run time: what a request's token authenticates.
type Client struct {
	name      string
	maxLeases int
	// limiter is nil without a rate limit.
	limiter *rate.Limiter
}

// Name names the client in logs, metrics and its leases.
func (c *Client) Name() string { return c.name }

// MaxLeases is how many live leases the client may hold at once (0: no cap).
func (c *Client) MaxLeases() int { return c.maxLeases }

// clientSet is one version of the clients, replaced whole on a reload.
type clientSet struct {
	byHash map[[32]byte]*Client
	names  []string
}

// Clients are the crawler identities discovery admits, from DISCOVERY_TOKEN (one client,
// "default") or a clients file that Watch reloads while discovery runs.
type Clients struct {
	set atomic.Pointer[clientSet]
	// mu serialises reloads, which reuse the limiters of clients that stay, so that a
	// reload does not hand every client a fresh burst. last is the file as last applied.
	mu   sync.Mutex
	last []byte
}

// DefaultClientName names the client of DISCOVERY_TOKEN.
const DefaultClientName = "default"

// NewClients admits cfgs (already checked by ParseClients).
func NewClients(cfgs []ClientConfig) *Clients {
	c := &Clients{}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.replaceLocked(cfgs)
	return c
}

// singleClient admits one token as the client "default", without limits.
func singleClient(token string) *Clients {
	return NewClients([]ClientConfig{{Name: DefaultClientName, Token: token}})
}

// LoadClients reads a clients file.
func LoadClients(path string) (*Clients, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("clients file: %w", err)
	}
	cfgs, err := ParseClients(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c := NewClients(cfgs)
	c.last = data
	return c, nil
}

// replaceLocked installs cfgs; c.mu is held.
func (c *Clients) replaceLocked(cfgs []ClientConfig) {
	old := map[string]*Client{}
	if cur := c.set.Load(); cur != nil {
		for _, cl := range cur.byHash {
			old[cl.name] = cl
		}
	}
	next := &clientSet{byHash: map[[32]byte]*Client{}}
	for _, cfg := range cfgs {
		h, _ := cfg.tokenHash()
		cl := &Client{name: cfg.Name, maxLeases: cfg.MaxLeases}
		if cfg.RequestsPerSecond > 0 {
			burst := cfg.Burst
			if burst == 0 {
				burst = max(1, int(cfg.RequestsPerSecond))
			}
			if prev := old[cfg.Name]; prev != nil && prev.limiter != nil {
				cl.limiter = prev.limiter
				cl.limiter.SetLimit(rate.Limit(cfg.RequestsPerSecond))
				cl.limiter.SetBurst(burst)
			} else {
				cl.limiter = rate.NewLimiter(rate.Limit(cfg.RequestsPerSecond), burst)
			}
		}
		next.byHash[h] = cl
		next.names = append(next.names, cfg.Name)
	}
	sort.Strings(next.names)
	c.set.Store(next)
}

// lookup finds the client a bearer token belongs to. Tokens are compared by their SHA-256:
// a map lookup on the hash reveals nothing usable about the token through its timing.
func (c *Clients) lookup(token string) *Client {
	return c.set.Load().byHash[sha256.Sum256([]byte(token))]
}

// Names lists the configured clients' names, sorted.
func (c *Clients) Names() []string { return c.set.Load().names }

// Reload reads the clients file again and applies it if it changed. A file that no longer
// parses is an error and changes nothing: the clients admitted so far stay admitted.
func (c *Clients) Reload(path string) (changed bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("clients file: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if bytes.Equal(data, c.last) {
		return false, nil
	}
	cfgs, err := ParseClients(data)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	c.replaceLocked(cfgs)
	c.last = data
	return true, nil
}

// Watch reloads the clients file every interval until ctx ends. A mounted Secret changes
// by a swap of symlinks, which polling sees as surely as any notification would.
func (c *Clients) Watch(ctx context.Context, path string, interval time.Duration, log *slog.Logger, failed func()) {
	every(ctx, interval, func() {
		changed, err := c.Reload(path)
		switch {
		case err != nil:
			log.Error("clients file not reloaded; the clients loaded before stay in force", "error", err)
			if failed != nil {
				failed()
			}
		case changed:
			log.Info("clients file reloaded", "clients", c.Names())
		}
	})
}
