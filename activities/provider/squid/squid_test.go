package squid

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

var testCreds = proxyauth.Credentials{Username: "proxyfleet", Password: "0123456789abcdefABCDEF-_ghijklmn"}

// contains reports whether any prefix in ps holds a.
func contains(ps []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}

// TestDefaultDenied checks addresses against the list only; nothing is sent anywhere.
func TestDefaultDenied(t *testing.T) {
	for _, tc := range []struct {
		addr   string
		denied bool
	}{
		{"169.254.169.254", true}, // the cloud metadata server
		{"10.0.0.1", true},
		{"10.255.255.254", true},
		{"172.16.0.1", true},
		{"172.31.255.1", true},
		{"192.168.1.1", true},
		{"127.0.0.1", true},
		{"127.1.2.3", true},
		{"100.64.0.1", true},
		{"0.0.0.0", true},
		{"224.0.0.1", true},
		{"255.255.255.255", true},
		{"::1", true},
		{"::", true},
		{"fe80::1", true},
		{"fd00::1", true},
		{"fd20:ce::254", true}, // GCP's metadata server on IPv6
		{"fc00::1", true},
		{"ff02::1", true},
		{"64:ff9b::a9fe:a9fe", true}, // 169.254.169.254 through NAT64
		{"64:ff9b::a00:1", true},     // 10.0.0.1 through NAT64
		{"64:ff9b:1::1", true},

		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"172.32.0.1", false},
		{"100.128.0.1", false},
		{"192.169.0.1", false},
		{"2001:4860::1", false},
		{"2606:4700::1111", false},
		{"64:ff9b::808:808", false}, // 8.8.8.8 through NAT64
	} {
		assert.Equal(t, tc.denied, contains(DefaultDenied, netip.MustParseAddr(tc.addr)), tc.addr)
	}
	normalized, err := normalizePrefixes("denied", DefaultDenied)
	require.NoError(t, err)
	assert.ElementsMatch(t, DefaultDenied, normalized, "the defaults neither overlap nor need masking")
}

func TestRenderDefault(t *testing.T) {
	f, err := Render(Config{Port: 3128, Credentials: testCreds})
	require.NoError(t, err)
	conf := string(f.Conf)
	assert.Equal(t, DefaultPaths, f.Paths)

	lines := strings.Split(conf, "\n")
	assert.Contains(t, lines, "http_port 3128", "every address")
	assert.Contains(t, lines, "auth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid/passwd")
	assert.Contains(t, lines, "acl proxyfleet_ports port 80 443")
	assert.Contains(t, lines, "acl proxyfleet_denied dst 0.0.0.0/8 10.0.0.0/8 100.64.0.0/10 127.0.0.0/8 169.254.0.0/16 172.16.0.0/12 192.0.0.0/24 192.0.2.0/24")
	assert.NotContains(t, conf, "proxyfleet_allowed")
	assert.NotContains(t, conf, "include")
	for _, want := range []string{
		"forwarded_for delete", "via off", "httpd_suppress_version_string on", "cache deny all",
		"access_log none", "icp_port 0", "htcp_port 0",
		"request_header_access X-Forwarded-For deny all", "request_header_access Via deny all",
		"request_header_access Forwarded deny all", "request_header_access Proxy-Authorization deny all",
	} {
		assert.Contains(t, lines, want)
	}
	assert.NotContains(t, conf, "cache_dir")
	assert.Equal(t, []string{
		"http_access deny !proxyfleet_users",
		"http_access deny manager",
		"http_access deny !proxyfleet_web !CONNECT",
		"http_access deny !proxyfleet_ports",
		"http_access deny proxyfleet_denied",
		"http_access allow proxyfleet_users",
		"http_access deny all",
	}, accessRules(conf), "authentication first, the only allow last")

	again, err := Render(Config{Port: 3128, Credentials: testCreds})
	require.NoError(t, err)
	assert.Equal(t, f, again, "rendering is deterministic")
	assert.NotContains(t, conf, testCreds.Password)
	assert.NotContains(t, string(f.Passwd), testCreds.Password)
}

// accessRules are conf's http_access and include lines, in order.
func accessRules(conf string) []string {
	var out []string
	for l := range strings.Lines(conf) {
		if strings.HasPrefix(l, "http_access ") || strings.HasPrefix(l, "include ") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

func TestRenderOptions(t *testing.T) {
	f, err := Render(Config{
		Port:        8080,
		Listen:      "::1",
		Credentials: testCreds,
		Ports:       []int32{8443, 80, 8443},
		Denied:      []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.2.3/32")},
		Allowed:     []netip.Prefix{netip.MustParsePrefix("10.9.9.9/32"), netip.MustParsePrefix("::ffff:10.8.0.0/112")},
		Include:     "/etc/squid/proxyfleet.d/*.conf",
		Paths:       Paths{Passwd: "/srv/passwd"},
	})
	require.NoError(t, err)
	conf := string(f.Conf)
	lines := strings.Split(conf, "\n")
	assert.Contains(t, lines, "http_port [::1]:8080")
	assert.Contains(t, lines, "acl proxyfleet_ports port 80 8443", "sorted, without duplicates")
	assert.Contains(t, lines, "acl proxyfleet_denied dst 10.0.0.0/8", "ranges inside another are dropped: Squid would drop the wider one")
	assert.Contains(t, lines, "acl proxyfleet_allowed dst 10.8.0.0/16 10.9.9.9/32", "IPv4-mapped ranges as Squid compares them")
	assert.Contains(t, lines, "auth_param basic program /usr/lib/squid/basic_ncsa_auth /srv/passwd")
	assert.Equal(t, "/srv/passwd", f.Paths.Passwd)
	assert.Equal(t, DefaultPaths.Conf, f.Paths.Conf)
	assert.Equal(t, []string{
		"http_access deny !proxyfleet_users",
		"http_access deny manager",
		"http_access deny !proxyfleet_web !CONNECT",
		"http_access deny !proxyfleet_ports",
		"http_access deny proxyfleet_denied !proxyfleet_allowed",
		"include /etc/squid/proxyfleet.d/*.conf",
		"http_access allow proxyfleet_users",
		"http_access deny all",
	}, accessRules(conf))

	none, err := Render(Config{Port: 3128, Credentials: testCreds, Denied: []netip.Prefix{}})
	require.NoError(t, err)
	assert.NotContains(t, string(none.Conf), "proxyfleet_denied", "an empty, non-nil Denied denies nothing")
}

func TestRenderSplitsLongACLs(t *testing.T) {
	var denied []netip.Prefix
	for i := range 20 {
		denied = append(denied, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16))
	}
	f, err := Render(Config{Port: 3128, Credentials: testCreds, Denied: denied})
	require.NoError(t, err)
	var n int
	for l := range strings.Lines(string(f.Conf)) {
		if strings.HasPrefix(l, "acl proxyfleet_denied dst ") {
			n += len(strings.Fields(l)) - 3
			assert.LessOrEqual(t, len(strings.Fields(l))-3, aclChunk)
		}
	}
	assert.Equal(t, 20, n)
}

func TestRenderRefuses(t *testing.T) {
	ok := Config{Port: 3128, Credentials: testCreds}
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no credentials", func(c *Config) { c.Credentials = proxyauth.Credentials{} }, "credentials"},
		{"bad user", func(c *Config) { c.Credentials.Username = "a:b" }, "user name"},
		{"port 0", func(c *Config) { c.Port = 0 }, "port 0"},
		{"port too large", func(c *Config) { c.Port = 65536 }, "port 65536"},
		{"listen on a name", func(c *Config) { c.Listen = "localhost" }, "listen"},
		{"listen with zone", func(c *Config) { c.Listen = "fe80::1%eth0" }, "listen"},
		{"destination port 0", func(c *Config) { c.Ports = []int32{80, 0} }, "ports: 0"},
		{"destination port negative", func(c *Config) { c.Ports = []int32{-1} }, "ports: -1"},
		{"destination port too large", func(c *Config) { c.Ports = []int32{70000} }, "ports: 70000"},
		{"invalid denied", func(c *Config) { c.Denied = []netip.Prefix{{}} }, "denied[0]"},
		{"invalid allowed", func(c *Config) { c.Allowed = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), {}} }, "allowed[1]"},
		{"IPv6 range holding the IPv4-mapped range", func(c *Config) { c.Denied = []netip.Prefix{netip.MustParsePrefix("::/64")} }, "IPv4-mapped"},
		{"wider than the IPv4-mapped range", func(c *Config) { c.Allowed = []netip.Prefix{netip.MustParsePrefix("::ffff:0:0/80")} }, "IPv4-mapped"},
		{"relative include", func(c *Config) { c.Include = "extra.conf" }, "absolute"},
		{"include with a space", func(c *Config) { c.Include = "/etc/squid/my extra.conf" }, "spaces"},
		{"include with a newline", func(c *Config) { c.Include = "/etc/squid/x\nhttp_access allow all" }, "include"},
		{"relative passwd", func(c *Config) { c.Paths.Passwd = "passwd" }, "paths.passwd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			_, err := Render(c)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
