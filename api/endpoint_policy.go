package api

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kvindex/kvindex/internal/redact"
)

// EndpointPolicy decides which engine addresses the daemon may connect to
// (POST /v1/endpoints, AddEndpoint, --endpoint, replay and snapshot
// addresses). Only tcp://host:port with a host and a port, and ipc://path,
// are accepted: the daemon dials them, so a wildcard, another transport
// (udp, inproc, pgm) or a URL with credentials is a mistake or an attack.
// With AllowedCIDRs set,
// a tcp host must be an address inside one of them, or a name all of whose
// addresses are (resolved when the endpoint is added).
type EndpointPolicy struct {
	AllowedCIDRs []netip.Prefix
	// Resolve looks a host name up; nil = the system resolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
}

// DefaultEndpointPolicy accepts any well-formed tcp:// or ipc:// address.
var DefaultEndpointPolicy = &EndpointPolicy{}

// resolveTimeout bounds the name lookup of a policy check.
const resolveTimeout = 2 * time.Second

func (s *Server) endpointPolicy() *EndpointPolicy {
	if s.cfg.Endpoints != nil {
		return s.cfg.Endpoints
	}
	return DefaultEndpointPolicy
}

// ParseCIDRs parses a list of CIDR prefixes (a bare address is one host).
func ParseCIDRs(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range list {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if !strings.Contains(c, "/") {
			a, err := netip.ParseAddr(c)
			if err != nil {
				return nil, fmt.Errorf("allowed endpoint CIDR %q: %v", c, err)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("allowed endpoint CIDR %q: %v", c, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// CheckEndpoint checks an engine address and its optional replay and
// snapshot addresses: the daemon dials all three, so none may bypass the
// policy.
func (p *EndpointPolicy) CheckEndpoint(ctx context.Context, address, replay, snapshot string) error {
	if err := p.Check(ctx, address); err != nil {
		return err
	}
	if replay != "" {
		if err := p.Check(ctx, replay); err != nil {
			return fmt.Errorf("replay address: %w", err)
		}
	}
	if snapshot != "" {
		if err := p.Check(ctx, snapshot); err != nil {
			return fmt.Errorf("snapshot address: %w", err)
		}
	}
	return nil
}

// Check returns why address may not be dialled, or nil. The address is
// quoted redacted: a rejected URL with a password must not echo it.
func (p *EndpointPolicy) Check(ctx context.Context, address string) error {
	bad := func(why string) error {
		return fmt.Errorf("endpoint address %q: %s", redact.String(address), why)
	}
	scheme, rest, ok := strings.Cut(address, "://")
	if !ok {
		return bad("want tcp://host:port or ipc://path")
	}
	if strings.ContainsAny(rest, "@ \t\r\n\x00") {
		return bad("credentials, spaces and control characters are not allowed")
	}
	switch scheme {
	case "ipc":
		if rest == "" {
			return bad("ipc:// needs a path")
		}
		return nil
	case "tcp":
	default:
		return bad("scheme " + strconv.Quote(scheme) + " is not allowed (tcp or ipc)")
	}
	// ZMQ's "tcp://source;dest" would bind a local interface first.
	if strings.Contains(rest, ";") {
		return bad("a source address (';') is not allowed")
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return bad("want tcp://host:port")
	}
	if host == "" || host == "*" {
		return bad("a host is required (the daemon connects; '*' binds)")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return bad("port must be 1-65535")
	}
	if len(p.AllowedCIDRs) == 0 {
		return nil
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		resolve := p.Resolve
		if resolve == nil {
			resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
				return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			}
		}
		rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		addrs, err = resolve(rctx, host)
		cancel()
		if err != nil {
			return bad("resolve host: " + err.Error())
		}
		if len(addrs) == 0 {
			return bad("host has no address")
		}
	}
	for _, a := range addrs {
		if !p.allowed(a.WithZone("").Unmap()) {
			return bad(a.String() + " is outside --allowed-endpoint-cidrs")
		}
	}
	return nil
}

func (p *EndpointPolicy) allowed(a netip.Addr) bool {
	for _, c := range p.AllowedCIDRs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}
