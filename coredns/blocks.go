package coredns

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/dnsrake/rrl"
)

// Server blocks that listen on one address share its sockets: CoreDNS serves them
// all from one dnsserver.Server per socket, and calls only the last block's
// UDPDecorateWriterFunc. A socket has one kernel filter, which cannot tell the
// blocks' queries apart, so the blocks on an address must agree on what the filter
// does (requestKeywords, kernel-filter, cookies); setup refuses a Corefile in which
// they do not, naming both blocks. The response limits stay per block.

// requestKeywords are the Config keywords the kernel filter (and the Go request
// limiter in its place) applies per socket.
var requestKeywords = []string{
	"requests-per-second", "ipv4-prefix-length", "ipv6-prefix-length",
	"ipv4-request-levels", "ipv6-request-levels", "source-port-factor",
	"total-requests-per-second", "reflection-ports", "exempt-clients", "report-only",
	// The kernel's water level and names judge are the filter's too (its settings
	// come from one Config); zones are not here: each block lists its own first.
	"capacity", "names",
}

// socketGroup is the rrl blocks of one Corefile load that listen on one address.
type socketGroup struct {
	addr    string // as dnsserver.Server.Addr: "dns://127.0.0.1:53"
	first   string // the first block's name, for errors
	s       *settings
	members []*RRL
}

// loadState is one Corefile load's rrl blocks: its socket groups, and every block's
// plugin in the order they were set up.
type loadState struct {
	ctx     any // the caddy context of the load (one per instance)
	groups  map[string]*socketGroup
	plugins []*RRL
	watched bool // its instance calls reloadFailed when a reload from it fails
}

// load holds the newest load: the Corefile being set up, or running. A new load (a
// reload) starts afresh, so nothing of an old load is kept; a reload that fails
// makes the running load the newest again (reloadFailed).
var load struct {
	sync.Mutex
	cur *loadState
}

// join adds p, the plugin of the block c sets up with settings s, to its load and
// to the socket groups of the block's addresses, and returns them and the load; it
// fails when another block on one of them disagrees with s.
func join(c *caddy.Controller, s *settings, p *RRL) ([]*socketGroup, *loadState, error) {
	addrs, err := blockAddrs(c)
	if err != nil {
		return nil, nil, err
	}
	name := fmt.Sprintf("%q (%s:%d)", strings.Join(c.ServerBlockKeys, " "), c.File(), s.line)
	load.Lock()
	defer load.Unlock()
	if load.cur == nil || load.cur.ctx != c.Context() {
		load.cur = &loadState{ctx: c.Context(), groups: map[string]*socketGroup{}}
	}
	st := load.cur
	st.plugins = append(st.plugins, p)
	var out []*socketGroup
	for _, addr := range addrs {
		g := st.groups[addr]
		if g == nil {
			g = &socketGroup{addr: addr, first: name, s: s}
			st.groups[addr] = g
		} else if what := disagreement(g.s, s); what != "" {
			return nil, nil, c.Errf("server blocks %s and %s share the sockets of %s, which have one kernel filter and one set of request limits, but disagree on %s",
				g.first, name, addr, what)
		}
		out = append(out, g)
	}
	// Only once every block is known is a group complete; until then the hook
	// does not run (CoreDNS serves after every setup).
	for _, g := range out {
		g.members = append(g.members, p)
	}
	return out, st, nil
}

// watch reports whether st's instance has yet to be told to call reloadFailed (once
// per load), and notes that it is.
func (st *loadState) watch() bool {
	load.Lock()
	defer load.Unlock()
	first := !st.watched
	st.watched = true
	return first
}

// loadKey marks a caddy instance (its Storage) with its load.
type loadKey struct{}

// reloadFailed runs when a reload from running, the load of a running instance,
// failed (the instance's OnRestartFailed). CoreDNS then discards the new instance
// without shutting it down, and it may have run its OnStartup callbacks already,
// making its blocks' Protections, before its servers failed to start (a port that
// cannot be bound, say). Those blocks never served: their Protections are closed, so
// that nothing of the failed load stays open, and running is the newest load again,
// so that its blocks' shutdown hands their filters to none of the failed load's and
// their metrics are exported again. The running Protections are left exactly as
// they were. A restart that failed after the new instance started (stopping the old
// one failed) is not a failed load: that instance is CoreDNS's, and serves.
func reloadFailed(running *loadState) error {
	load.Lock()
	failed := load.cur
	if failed == running || failed == nil || instanceOf(failed) {
		load.Unlock()
		return nil
	}
	load.cur = running
	load.Unlock()
	var errs []error
	for _, p := range failed.plugins {
		if p.src != nil {
			p.src.clear(p)
		}
		if err := p.close(); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range running.plugins {
		if p.src != nil && p.prot.Load() != nil {
			p.src.set(p)
		}
	}
	return errors.Join(errs...)
}

// instanceOf reports whether one of CoreDNS's instances was set up as st (one
// whose servers started: caddy forgets an instance that failed to start).
func instanceOf(st *loadState) bool {
	for _, inst := range caddy.Instances() {
		inst.StorageMu.RLock()
		v := inst.Storage[loadKey{}]
		inst.StorageMu.RUnlock()
		if v == st {
			return true
		}
	}
	return false
}

// members returns the blocks served on addr with p: its socket group's members, or
// p alone when addr is in none of p's groups.
func (p *RRL) members(addr string) []*RRL {
	for _, g := range p.groups {
		if g.addr == addr {
			return g.members
		}
	}
	return []*RRL{p}
}

// successors returns the blocks of the newest load served on addr (none when the
// load does not serve addr), and whether they have the kernel filter on. Blocks of a
// load that failed never started and so attach nothing.
func successors(addr string) ([]*RRL, bool) {
	load.Lock()
	defer load.Unlock()
	if load.cur == nil {
		return nil, false
	}
	g := load.cur.groups[addr]
	if g == nil {
		return nil, false
	}
	return slices.Clone(g.members), g.s.kernel
}

// blockAddrs returns the UDP listen addresses of the block c sets up, spelled as
// dnsserver names its Servers (dnsserver.Server.Addr), in order and once each.
// Each key of a block may name its own port; the block's bind hosts (in its first
// key's Config) apply to all of them.
func blockAddrs(c *caddy.Controller) ([]string, error) {
	first := dnsserver.GetConfig(c)
	var addrs []string
	for j := range max(len(c.ServerBlockKeys), 1) {
		kc := *c
		kc.ServerBlockKeyIndex = j
		conf := dnsserver.GetConfig(&kc)
		if conf.Transport != "" && conf.Transport != "dns" {
			continue // no plain UDP socket, nothing for the kernel filter
		}
		for _, h := range first.ListenHosts {
			a, err := net.ResolveTCPAddr("tcp", net.JoinHostPort(h, conf.Port))
			if err != nil {
				return nil, err
			}
			if addr := "dns://" + a.String(); !slices.Contains(addrs, addr) {
				addrs = append(addrs, addr)
			}
		}
	}
	return addrs, nil
}

// disagreement returns what two blocks on one socket, with settings a and b,
// disagree on, or "" when the socket can serve both. With the kernel filter off
// in both the request limits run in Go per block and may differ. Secrets are never
// shown.
func disagreement(a, b *settings) string {
	if a.kernel != b.kernel {
		return fmt.Sprintf("kernel-filter (%s and %s)", onOff(a.kernel), onOff(b.kernel))
	}
	if a.cookies != b.cookies {
		return fmt.Sprintf("cookies (%s and %s)", onOff(a.cookies), onOff(b.cookies))
	}
	if a.cookies && (a.cookieSecret() != b.cookieSecret() || (a.prev == nil) != (b.prev == nil) ||
		(a.prev != nil && *a.prev != *b.prev)) {
		return "the cookie secrets (not shown)"
	}
	if !a.kernel {
		return ""
	}
	va, vb := values(a.cfg), values(b.cfg)
	for _, kw := range requestKeywords {
		if va[kw] != vb[kw] {
			return fmt.Sprintf("%s (%q and %q)", kw, va[kw], vb[kw])
		}
	}
	return ""
}

// values returns cfg as keyword: value.
func values(cfg *rrl.Config) map[string]string {
	m := map[string]string{}
	for _, kv := range cfg.Values() {
		m[kv[0]] = kv[1]
	}
	return m
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
