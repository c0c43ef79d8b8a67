package coredns

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/dnsrake/rrl"
)

// attachMu serialises attachGroup, which a Server's hook and an old instance's
// shutdown (handOver) may call at once for one address. lastFilter is the filter
// last seen on each listener address, to tell in the log a reload that kept it (the
// new Protection took it over, with its sketches) from one that attached another.
var (
	attachMu   sync.Mutex
	lastFilter = map[string]*rrl.Filter{}
)

// attachGroup hands the UDP sockets listening on addr (a dnsserver.Server address
// such as "dns://:53") to the Protection of every block in members, the blocks
// served there, in order: the first attaches the kernel filter, or takes over the
// one a reload's predecessor left, and each next one takes it over from it with the
// same request limits (setup made sure they agree), so that the sockets carry one
// filter that every block's Protection counts as in force. Called from each
// Server's ServePacket before it reads: every socket of the address exists by then
// (CoreDNS opens all of them before serving any). Where the eBPF filter cannot be in
// force, the Protections hold the sockets' queries to the request limits in Go, and
// the log says so.
func attachGroup(members []*RRL, addr string) {
	attachMu.Lock()
	defer attachMu.Unlock()
	local, err := listenerAddr(addr)
	if err != nil {
		log.Errorf("kernel filter for %s: %v; request limits in Go", addr, err)
		return
	}
	var errs []error
	var last *RRL
	for _, m := range members {
		done, err := m.attachLocal(addr, local)
		if done {
			continue
		}
		last = m
		if err != nil {
			errs = append(errs, err)
		}
	}
	if last == nil {
		return // another Server of the address (multisocket) came first
	}
	prot := last.prot.Load()
	st := prot.Status()
	msg := strings.TrimPrefix(st.String(), "kernel filter: ")
	f := prot.Filter()
	if f != nil && lastFilter[addr] == f {
		msg += "; kept with the new settings"
	}
	lastFilter[addr] = f
	switch {
	case len(errs) > 0:
		log.Warningf("kernel filter for %s: %s; %v", addr, msg, errors.Join(errs...))
	case !st.RequestsInKernel:
		log.Warningf("kernel filter for %s: %s", addr, msg)
	default:
		log.Infof("kernel filter for %s: %s", addr, msg)
	}
}

// attachWithoutFilter hands the UDP sockets listening on addr to the Protections of
// members, blocks served there with kernel-filter off: nothing is attached to them,
// but a reload's new Protection finds its predecessor's Go limiter by them and
// takes it over (rrl's AttachLocal), with what it learnt and its levels, when the
// address has one such block; with several, which one succeeds which is not known,
// and each starts afresh.
func attachWithoutFilter(members []*RRL, addr string) {
	attachMu.Lock()
	defer attachMu.Unlock()
	local, err := listenerAddr(addr)
	if err != nil {
		return // no plain UDP socket: nothing to hand over
	}
	for _, m := range members {
		if _, err := m.attachLocal(addr, local); err != nil {
			log.Warningf("request limits for %s in Go, without the predecessor's state: %v", addr, err)
		}
	}
}

// attachLocal hands the sockets on local (addr's) to p's Protection, once per
// address; done reports that it had been, or that p is closed.
func (p *RRL) attachLocal(addr string, local netip.AddrPort) (done bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	prot := p.prot.Load()
	if p.closed || prot == nil || p.attached[addr] {
		return true, nil
	}
	p.attached[addr] = true
	return false, prot.AttachLocal(local)
}

// close closes the plugin's Protection: it detaches the kernel filter unless a
// reload's successor took it over, so only addresses the new configuration dropped,
// or where it turned the filter off, lose theirs.
func (p *RRL) close() error {
	p.handOver()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if prot := p.prot.Load(); prot != nil {
		return prot.Close()
	}
	return nil
}

// handOver has the blocks of the newest Corefile load that serve an address of p
// with the kernel filter on take p's filter there over (with kernel-filter off in
// both, its Go limiter), if their servers' hook has not yet: CoreDNS starts the new servers in goroutines and may shut the old
// instance down before they have run, and the filter must pass from one
// Protection to the next, never leaving the sockets (nor its estimates lost).
// The sockets are there still: the new servers hold copies of them.
func (p *RRL) handOver() {
	p.mu.Lock()
	addrs := make([]string, 0, len(p.attached))
	for a := range p.attached {
		addrs = append(addrs, a)
	}
	p.mu.Unlock()
	for _, addr := range addrs {
		next, kernel := successors(addr)
		switch {
		case len(next) == 0:
		case kernel:
			attachGroup(next, addr)
		case !p.s.kernel:
			attachWithoutFilter(next, addr) // the Go limiter passes on
		}
	}
}

// listenerAddr turns a dnsserver address ("dns://127.0.0.1:53", "dns://:53",
// "dns://[::1]:53") into the local address AttachLocal looks for; no host is the
// unspecified address: every socket bound to the port.
func listenerAddr(addr string) (netip.AddrPort, error) {
	hostport := addr
	if i := strings.Index(addr, "://"); i >= 0 {
		if t := addr[:i]; t != "dns" {
			return netip.AddrPort{}, fmt.Errorf("transport %s has no plain UDP socket", t)
		}
		hostport = addr[i+3:]
	}
	i := strings.LastIndexByte(hostport, ':')
	if i < 0 {
		return netip.AddrPort{}, fmt.Errorf("address %q has no port", addr)
	}
	host, port := strings.Trim(hostport[:i], "[]"), hostport[i+1:]
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q: bad port", addr)
	}
	a := netip.IPv6Unspecified()
	if host != "" {
		if a, err = netip.ParseAddr(host); err != nil {
			return netip.AddrPort{}, fmt.Errorf("address %q: %v", addr, err)
		}
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(n)), nil
}
