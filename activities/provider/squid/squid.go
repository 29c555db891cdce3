package squid

import (
	"bytes"
	"cmp"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/proxyfleet/proxyfleet/internal/proxyauth"
)

// Config is what one instance's Squid is rendered from.
type Config struct {
	// Port is the http_port, 1..65535.
	Port int32
	// Listen is the IP address Squid binds; empty means every address (a pod or a VM).
	// Tests set 127.0.0.1.
	Listen string
	// Credentials are the only ones Squid accepts; required.
	Credentials proxyauth.Credentials
	// Ports are the destination ports allowed, for plain HTTP and CONNECT alike; empty
	// means DefaultPorts.
	Ports []int32
	// Denied are the destination ranges refused (403, without connecting). Nil means
	// DefaultDenied; an empty non-nil slice denies no range. A destination given by name is
	// refused when any of the addresses it resolves to is denied.
	Denied []netip.Prefix
	// Allowed are exceptions inside Denied that are reachable after all. Squid's address
	// match is "any of the name's addresses", so a name that resolves to an allowed and a
	// denied address is allowed.
	Allowed []netip.Prefix
	// Include is the absolute path (or glob pattern) of the user's additions, included
	// after the rules above and before clients with valid credentials are allowed: an
	// http_access line there can refuse more, but cannot let in a client without
	// credentials or reach a denied range, because the rules before it have already
	// answered. Squid refuses to start when it names no file, so it must exist (or the
	// pattern match a file) whenever Squid starts. It is trusted like the rest of the
	// user's boot configuration: it could redefine other directives, so its position
	// protects against mistakes, not against its author.
	Include string
	// Paths are where the files live; the zero value is the Debian/Ubuntu package's.
	Paths Paths
}

// Paths are the files Squid reads and writes. Every field left empty takes the Debian and
// Ubuntu package's path (DefaultPaths); tests relocate them into a directory of their own
// so Squid runs without privileges.
type Paths struct {
	// Conf is where squid.conf is written; Squid is started with it.
	Conf string
	// Passwd is the htpasswd file basic_ncsa_auth reads.
	Passwd string
	// AuthHelper is the basic_ncsa_auth program.
	AuthHelper string
	// PidFile is Squid's pid_filename.
	PidFile string
	// CacheLog is Squid's own log (start-up, errors); requests are not logged.
	CacheLog string
}

// DefaultPaths are the paths of Debian's squid package, which Ubuntu's (and so the
// ubuntu/squid image) shares.
var DefaultPaths = Paths{
	Conf:       "/etc/squid/squid.conf",
	Passwd:     "/etc/squid/passwd",
	AuthHelper: "/usr/lib/squid/basic_ncsa_auth",
	PidFile:    "/run/squid.pid",
	CacheLog:   "/var/log/squid/cache.log",
}

// withDefaults fills the empty fields of p from DefaultPaths.
func (p Paths) withDefaults() Paths {
	p.Conf = cmp.Or(p.Conf, DefaultPaths.Conf)
	p.Passwd = cmp.Or(p.Passwd, DefaultPaths.Passwd)
	p.AuthHelper = cmp.Or(p.AuthHelper, DefaultPaths.AuthHelper)
	p.PidFile = cmp.Or(p.PidFile, DefaultPaths.PidFile)
	p.CacheLog = cmp.Or(p.CacheLog, DefaultPaths.CacheLog)
	return p
}

// Files are a rendering: the contents and where each goes.
type Files struct {
	// Conf is squid.conf, to be written at Paths.Conf.
	Conf []byte
	// Passwd is the htpasswd file, to be written at Paths.Passwd, readable by Squid's user
	// (proxy) and nobody else but root.
	Passwd []byte
	// Paths are the rendering's paths, every field set.
	Paths Paths
}

// DefaultPorts are the destination ports a crawler needs: HTTP and HTTPS.
var DefaultPorts = []int32{80, 443}

// deniedIPv4 are the IPv4 ranges no crawl has a reason to reach and whose hosts trust
// their neighbours: the instance itself, its network, its cloud's services. Each entry is
// also denied through the NAT64 prefix (see nat64).
var deniedIPv4 = []netip.Prefix{
	// "This network" (RFC 791); Linux connects 0.0.0.0 to the local host.
	netip.MustParsePrefix("0.0.0.0/8"),
	// Private networks (RFC 1918): the VPC, the cluster's pods and services.
	netip.MustParsePrefix("10.0.0.0/8"),
	// Shared address space (RFC 6598): carrier-grade NAT, and some clusters' pod ranges.
	netip.MustParsePrefix("100.64.0.0/10"),
	// Loopback: the instance's own services (Squid's, a kubelet's, a sidecar's).
	netip.MustParsePrefix("127.0.0.0/8"),
	// Link-local (RFC 3927), home of 169.254.169.254, the metadata server of GCP (and of
	// the other clouds), which hands out the instance's service-account tokens.
	netip.MustParsePrefix("169.254.0.0/16"),
	// Private networks (RFC 1918).
	netip.MustParsePrefix("172.16.0.0/12"),
	// IETF protocol assignments (RFC 6890), such as DS-Lite's 192.0.0.0/29.
	netip.MustParsePrefix("192.0.0.0/24"),
	// Documentation (RFC 5737): never a real destination.
	netip.MustParsePrefix("192.0.2.0/24"),
	// The deprecated 6to4 relay anycast (RFC 7526).
	netip.MustParsePrefix("192.88.99.0/24"),
	// Private networks (RFC 1918).
	netip.MustParsePrefix("192.168.0.0/16"),
	// Benchmarking (RFC 2544), used inside some networks.
	netip.MustParsePrefix("198.18.0.0/15"),
	// Documentation (RFC 5737).
	netip.MustParsePrefix("198.51.100.0/24"),
	// Documentation (RFC 5737).
	netip.MustParsePrefix("203.0.113.0/24"),
	// Multicast (RFC 5771).
	netip.MustParsePrefix("224.0.0.0/4"),
	// Reserved (RFC 1112), and the limited broadcast address 255.255.255.255.
	netip.MustParsePrefix("240.0.0.0/4"),
}

// deniedIPv6 are the IPv6 ranges denied for the same reasons.
//
// IPv4-mapped addresses (::ffff:0:0/96) are not listed: Squid compares a mapped destination
// as the IPv4 address it maps (so the IPv4 entries cover ::ffff:169.254.169.254), and it
// reads the prefix ::ffff:0:0/96 as 0.0.0.0/0, which would deny every IPv4 destination.
var deniedIPv6 = []netip.Prefix{
	// The unspecified address, which Linux connects to the local host.
	netip.MustParsePrefix("::/128"),
	// Loopback.
	netip.MustParsePrefix("::1/128"),
	// Local-use NAT64 (RFC 8215): translated to IPv4 inside the local network.
	netip.MustParsePrefix("64:ff9b:1::/48"),
	// Discard-only (RFC 6666).
	netip.MustParsePrefix("100::/64"),
	// Documentation (RFC 3849).
	netip.MustParsePrefix("2001:db8::/32"),
	// Unique local addresses (RFC 4193), which include fd20:ce::254, GCP's metadata server
	// on IPv6.
	netip.MustParsePrefix("fc00::/7"),
	// Deprecated site-local (RFC 3879), still routed inside some networks.
	netip.MustParsePrefix("fec0::/10"),
	// Link-local.
	netip.MustParsePrefix("fe80::/10"),
	// Multicast.
	netip.MustParsePrefix("ff00::/8"),
}

// ipv4Mapped holds the IPv4-mapped IPv6 addresses (::ffff:a.b.c.d), which Squid handles as
// the IPv4 addresses they map.
var ipv4Mapped = netip.MustParsePrefix("::ffff:0:0/96")

// nat64WellKnown is the NAT64 well-known prefix (RFC 6052): 64:ff9b::a.b.c.d reaches the
// IPv4 address a.b.c.d through a NAT64 gateway.
var nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")

// nat64 is each IPv4 prefix of v4 as reached through the NAT64 well-known prefix. Only the
// denied ranges are denied there, not the whole prefix, so an IPv6-only network with
// DNS64 still reaches IPv4-only sites.
func nat64(v4 []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(v4))
	base := nat64WellKnown.Addr().As16()
	for _, p := range v4 {
		a := base
		b := p.Addr().As4()
		copy(a[12:], b[:])
		out = append(out, netip.PrefixFrom(netip.AddrFrom16(a), 96+p.Bits()))
	}
	return out
}

// DefaultDenied are the destination ranges an instance refuses unless Config.Denied says
// otherwise: deniedIPv4 (loopback, link-local with the cloud metadata server, private,
// shared, reserved, documentation and multicast ranges), the same ranges through the NAT64
// prefix, and deniedIPv6 (unspecified, loopback, local NAT64, unique-local with GCP's IPv6
// metadata server, site-local, link-local, documentation, discard and multicast). Each
// entry is documented where the lists are defined.
var DefaultDenied = slices.Concat(deniedIPv4, nat64(deniedIPv4), deniedIPv6)

// aclChunk is how many values go on one acl line. Squid appends the values of lines that
// repeat an ACL's name, and a long list on one line could pass its line length limit.
const aclChunk = 8

// Render renders c's squid.conf and passwd file, or says what in c is invalid.
func Render(c Config) (Files, error) {
	if err := checkCredentials(c.Credentials); err != nil {
		return Files{}, err
	}
	if c.Port < 1 || c.Port > 65535 {
		return Files{}, fmt.Errorf("port %d: want 1..65535", c.Port)
	}
	listen := ""
	if c.Listen != "" {
		a, err := netip.ParseAddr(c.Listen)
		if err != nil || a.Zone() != "" {
			return Files{}, fmt.Errorf("listen %q: want an IP address without a zone", c.Listen)
		}
		listen = a.Unmap().String()
		if a.Unmap().Is6() {
			listen = "[" + listen + "]"
		}
		listen += ":"
	}
	ports, err := normalizePorts(c.Ports)
	if err != nil {
		return Files{}, err
	}
	deniedIn := c.Denied
	if deniedIn == nil {
		deniedIn = DefaultDenied
	}
	denied, err := normalizePrefixes("denied", deniedIn)
	if err != nil {
		return Files{}, err
	}
	allowed, err := normalizePrefixes("allowed", c.Allowed)
	if err != nil {
		return Files{}, err
	}
	if c.Include != "" {
		if err := checkPath("include", c.Include); err != nil {
			return Files{}, err
		}
	}
	p := c.Paths.withDefaults()
	for _, f := range []struct{ name, path string }{
		{"paths.conf", p.Conf}, {"paths.passwd", p.Passwd}, {"paths.authHelper", p.AuthHelper},
		{"paths.pidFile", p.PidFile}, {"paths.cacheLog", p.CacheLog},
	} {
		if err := checkPath(f.name, f.path); err != nil {
			return Files{}, err
		}
	}

	var b bytes.Buffer
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }

	line("# Squid configuration rendered by proxyfleet; it is rewritten from the Proxy, so")
	line("# edits here do not last. Order matters: the first http_access line that matches")
	line("# decides.")
	line("")
	line("http_port %s%d", listen, c.Port)
	line("# Squid would otherwise name the host in error pages (and look its name up).")
	line("visible_hostname proxyfleet")
	line("pid_filename %s", p.PidFile)
	line("cache_log %s", p.CacheLog)
	line("access_log none")
	line("# The package's logrotate rotates cache.log and then tells Squid to reopen it.")
	line("logfile_rotate 0")
	line("# Nothing listens but http_port, and nothing is sent that the client did not ask")
	line("# for: no ICP, no HTCP, no pinger probing the sites visited.")
	line("icp_port 0")
	line("htcp_port 0")
	line("pinger_enable off")
	line("netdb_filename none")
	line("# A proxy for crawlers: every answer comes from the origin.")
	line("cache deny all")
	line("")
	line("auth_param basic program %s %s", p.AuthHelper, p.Passwd)
	line("auth_param basic children 5 startup=1 idle=1")
	line("auth_param basic realm proxyfleet")
	line("auth_param basic credentialsttl 5 minutes")
	line("# Otherwise Squid lowercases the user name before the helper compares it.")
	line("auth_param basic casesensitive on")
	line("")
	line("acl proxyfleet_users proxy_auth REQUIRED")
	line("acl proxyfleet_web proto HTTP HTTPS")
	for chunk := range slices.Chunk(ports, aclChunk) {
		line("acl proxyfleet_ports port %s", join(chunk, func(p int32) string { return strconv.Itoa(int(p)) }))
	}
	for chunk := range slices.Chunk(denied, aclChunk) {
		line("acl proxyfleet_denied dst %s", join(chunk, netip.Prefix.String))
	}
	for chunk := range slices.Chunk(allowed, aclChunk) {
		line("acl proxyfleet_allowed dst %s", join(chunk, netip.Prefix.String))
	}
	line("")
	line("# A client without valid credentials is challenged (407) before any rule below")
	line("# can answer, so it learns nothing about them.")
	line("http_access deny !proxyfleet_users")
	line("http_access deny manager")
	line("# No FTP, whois or other gatewaying: HTTP, HTTPS and CONNECT tunnels only.")
	line("http_access deny !proxyfleet_web !CONNECT")
	line("http_access deny !proxyfleet_ports")
	if len(denied) > 0 {
		line("# Refused by address before Squid connects (a name is resolved first).")
		if len(allowed) > 0 {
			line("http_access deny proxyfleet_denied !proxyfleet_allowed")
		} else {
			line("http_access deny proxyfleet_denied")
		}
	}
	if c.Include != "" {
		line("# The user's additions: after the rules above, so they cannot undo them.")
		line("include %s", c.Include)
	}
	line("http_access allow proxyfleet_users")
	line("http_access deny all")
	line("")
	line("# Nothing tells the origin about the client or the proxy.")
	line("forwarded_for delete")
	line("via off")
	line("request_header_access X-Forwarded-For deny all")
	line("request_header_access Via deny all")
	line("request_header_access Forwarded deny all")
	line("request_header_access Proxy-Authorization deny all")
	line("# Squid adds \"Cache-Control: max-age=259200\" to requests that carry no Cache-Control")
	line("# (its refresh limit), which tells sites a Squid is in the way; the client's own")
	line("# Cache-Control is kept.")
	line("acl proxyfleet_client_cc req_header Cache-Control .")
	line("request_header_access Cache-Control deny !proxyfleet_client_cc")
	line("httpd_suppress_version_string on")

	return Files{Conf: b.Bytes(), Passwd: []byte(passwdLine(c.Credentials)), Paths: p}, nil
}

// join formats each of xs with str, separated by spaces.
func join[T any](xs []T, str func(T) string) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = str(x)
	}
	return strings.Join(s, " ")
}

// normalizePorts checks ports and returns them sorted without duplicates (DefaultPorts if
// there are none), so the rendering does not depend on the order they were given in.
func normalizePorts(ports []int32) ([]int32, error) {
	if len(ports) == 0 {
		return slices.Clone(DefaultPorts), nil
	}
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("ports: %d: want 1..65535", p)
		}
	}
	out := slices.Clone(ports)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// normalizePrefixes checks prefixes and returns them masked, sorted, IPv4-mapped ones as
// the IPv4 prefixes Squid compares them as, and without any prefix that another one
// contains. The last matters for correctness, not tidiness: Squid keeps an ACL's ranges in
// a splay tree and silently drops a range that overlaps one added before it, even the
// wider one ("10.1.0.0/16 10.0.0.0/8" would deny only 10.1.0.0/16).
func normalizePrefixes(field string, in []netip.Prefix) ([]netip.Prefix, error) {
	var ps []netip.Prefix
	for i, p := range in {
		if !p.IsValid() {
			return nil, fmt.Errorf("%s[%d]: not a valid prefix", field, i)
		}
		if p.Addr().Zone() != "" {
			return nil, fmt.Errorf("%s[%d]: %s: a prefix has no zone", field, i, p)
		}
		if p.Addr().Is6() && p.Bits() < 96 && p.Overlaps(ipv4Mapped) {
			return nil, fmt.Errorf("%s[%d]: %s holds the IPv4-mapped range %s, which Squid compares as IPv4: it would match every IPv4 address too", field, i, p, ipv4Mapped)
		}
		if a := p.Addr(); a.Is4In6() {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		ps = append(ps, p.Masked())
	}
	// Wider prefixes first, so each prefix is checked against every one that could hold it.
	slices.SortFunc(ps, func(a, b netip.Prefix) int {
		return cmp.Or(cmp.Compare(a.Bits(), b.Bits()), a.Addr().Compare(b.Addr()))
	})
	var out []netip.Prefix
	for _, p := range ps {
		if !slices.ContainsFunc(out, func(q netip.Prefix) bool { return q.Overlaps(p) }) {
			out = append(out, p)
		}
	}
	// Render by address, the order a reader looks for.
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return out, nil
}

// checkPath refuses a path Squid's configuration parser or the startup script would
// misread: relative, or with spaces, quotes or control characters.
func checkPath(field, p string) error {
	if !path.IsAbs(p) {
		return fmt.Errorf("%s %q: want an absolute path", field, p)
	}
	if i := strings.IndexFunc(p, func(r rune) bool {
		return r <= ' ' || r == 0x7f || r == '"' || r == '\'' || r == '\\' || r == '#'
	}); i >= 0 {
		return fmt.Errorf("%s %q: spaces, quotes, backslashes, '#' and control characters are not allowed", field, p)
	}
	return nil
}
