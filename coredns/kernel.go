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

// listeners holds the kernel filter of every listener address of the process and
// the plugin instance that owns it. A reload builds new instances that serve the
// old sockets (CoreDNS hands the new servers copies of them); the new instance takes
// the filter over with the new settings instead of attaching another, so the
// sockets are never without it, its sketches keep their estimates, and the old
// instance's shutdown leaves it alone.
var (
	listenersMu sync.Mutex
	listeners   = map[string]*listener{}
)

type listener struct {
	f     *rrl.Filter
	owner *RRL
}

// attach puts the kernel filter on the UDP sockets listening on addr (a
// dnsserver.Server address such as "dns://:53"), once per address. Called from each
// Server's ServePacket before it reads: every socket of the address exists by then
// (CoreDNS opens all of them before serving any). Where eBPF cannot load, the
// classic prefilter stays attached and the Go limiter goes on enforcing
// requests-per-second, as rrl.Attach documents.
func (p *RRL) attach(addr string) {
	listenersMu.Lock()
	defer listenersMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	if _, done := p.filters[addr]; done {
		return
	}
	defer p.updateKernelLimits()
	local, err := listenerAddr(addr)
	if err != nil {
		log.Errorf("kernel filter for %s: %v", addr, err)
		p.failed = true
		return
	}
	if l := listeners[addr]; l != nil {
		err := l.f.Update(p.cfg)
		if err == nil {
			// Sockets a reload added on the address (a higher multisocket count)
			// join the filter; the others have it already.
			if aerr := l.f.AttachLocal(local); aerr != nil {
				log.Warningf("kernel filter for %s: %v", addr, aerr)
			}
			l.owner = p
			p.filters[addr] = l.f
			p.useCookies(addr, l.f)
			log.Infof("kernel filter for %s: %s, kept with the new settings", addr, l.f.Mode())
			return
		}
		// The running filter cannot take the new settings: attach a new one, which
		// replaces it on the sockets; Filter.Close of the old one then leaves the
		// new one in place.
		log.Warningf("kernel filter for %s: update: %v; attaching a new one", addr, err)
	}
	f, err := rrl.AttachLocal(local, p.cfg)
	switch {
	case f == nil:
		log.Errorf("kernel filter for %s: %v; requests-per-second is enforced in Go", addr, err)
		p.failed = true
		return
	case err != nil:
		log.Warningf("kernel filter for %s: %s: %v; requests-per-second is enforced in Go", addr, f.Mode(), err)
	default:
		log.Infof("kernel filter for %s: %s", addr, f.Mode())
	}
	p.filters[addr] = f
	listeners[addr] = &listener{f: f, owner: p}
	p.useCookies(addr, f)
}

// useCookies gives the eBPF filter the plugin's cookie secrets, so that a query with
// a valid server cookie is judged only in its own address's group (it has proven
// its address), or takes away those of an instance before a reload (nil).
func (p *RRL) useCookies(addr string, f *rrl.Filter) {
	if f.Mode() != rrl.ModeEBPF {
		return
	}
	if err := f.UseCookies(p.cookies); err != nil {
		log.Warningf("kernel filter for %s: cookies: %v", addr, err)
	}
}

// updateKernelLimits sets kernelLimits from the filters; p.mu is held.
func (p *RRL) updateKernelLimits() {
	all := len(p.filters) > 0 && !p.failed
	for _, f := range p.filters {
		if f.Mode() != rrl.ModeEBPF {
			all = false
		}
	}
	p.kernelLimits.Store(all)
}

// close detaches the kernel filters this instance still owns. On a reload the new
// instance has taken the filters of the addresses it serves over before this runs
// (CoreDNS starts the new servers first), so only addresses the new configuration
// dropped, or where it turned the filter off, lose theirs.
func (p *RRL) close() error {
	listenersMu.Lock()
	defer listenersMu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	p.kernelLimits.Store(false)
	var errs []error
	for addr, f := range p.filters {
		l := listeners[addr]
		if l != nil && l.f == f && l.owner != p {
			continue // taken over by a newer instance
		}
		if l != nil && l.f == f {
			delete(listeners, addr)
		}
		if err := f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("kernel filter for %s: %w", addr, err))
		}
	}
	clear(p.filters)
	return errors.Join(errs...)
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
