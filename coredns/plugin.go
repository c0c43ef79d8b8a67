// Package coredns is the CoreDNS plugin rrl: response rate limiting as BIND 9 does it,
// a drop-in for github.com/coredns/rrl, with this module's kernel request filter on
// the server block's UDP sockets and DNS server cookies. README.md in this directory
// describes the Corefile syntax.
package coredns

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/request"
	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// RRL is the plugin of one server block. It is a plugin.Handler: queries for its
// zones go through an rrl.Handler, whose inner handler is the rest of the chain.
type RRL struct {
	Next  plugin.Handler
	Zones []string

	cfg     *rrl.Config
	rrl     *rrl.RRL
	handler *rrl.Handler
	// limiter enforces requests-per-second on UDP queries in Go while the kernel
	// filter does not do it on every listener (off, not yet attached, or attached
	// in classic mode for want of privilege).
	limiter *rrl.Limiter
	cookies *rrl.Cookies // nil with cookies off
	kernel  bool
	// kernelLimits is true while every listener that attached has the eBPF filter
	// and none failed: the kernel already holds UDP queries to requests-per-second.
	kernelLimits atomic.Bool

	mu      sync.Mutex
	filters map[string]*rrl.Filter // by listener address (dnsserver.Server.Addr)
	failed  bool                   // an attach left a listener without the eBPF filter
	closed  bool
}

func newPlugin(s *settings) (*RRL, error) {
	r, err := rrl.New(s.cfg)
	if err != nil {
		return nil, err
	}
	lim, err := rrl.NewLimiter(s.cfg)
	if err != nil {
		return nil, err
	}
	p := &RRL{Zones: s.zones, cfg: s.cfg, rrl: r, limiter: lim, kernel: s.kernel, filters: map[string]*rrl.Filter{}}
	// UDP queries reach the Handler through a request limiter: the kernel's, or
	// p.limiter in ServeDNS; so it applies requests-per-second to TCP only.
	opts := []rrl.HandlerOption{rrl.WithRequestsLimited()}
	if s.cookies {
		c := rrl.NewCookies(s.cookieSecret())
		if s.prev != nil {
			c.SetPrevious(*s.prev)
		}
		opts = append(opts, rrl.WithCookies(c))
		p.cookies = c
	}
	p.handler = rrl.NewHandler(inner{p}, r, opts...)
	return p, nil
}

// Name implements plugin.Handler.
func (p *RRL) Name() string { return Name }

// ServeDNS implements plugin.Handler. Queries outside the plugin's zones go to the
// next plugin untouched.
func (p *RRL) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	state := request.Request{W: w, Req: r}
	if len(r.Question) == 0 || plugin.Zones(p.Zones).Matches(state.Name()) == "" {
		return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
	}
	if !p.kernelLimits.Load() {
		if src, ok := udpSource(w); ok && !p.limiter.Allow(src) {
			// Over requests-per-second: no response at all, and nothing for the
			// server to write either (a success code).
			return dns.RcodeSuccess, nil
		}
	}
	c := &call{ResponseWriter: w, ctx: ctx}
	p.handler.ServeDNS(c, r)
	return c.rcode, c.err
}

// udpSource returns the source of a UDP query, and false for other transports.
func udpSource(w dns.ResponseWriter) (netip.AddrPort, bool) {
	if a, ok := w.RemoteAddr().(interface{ AddrPort() netip.AddrPort }); ok && w.RemoteAddr().Network() == "udp" {
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
	}
	return netip.AddrPort{}, false
}

// call carries one query's context through the rrl.Handler to the inner handler
// (rrl.Handler is a miekg/dns handler and has no context), and the next plugin's
// result back.
type call struct {
	dns.ResponseWriter
	ctx   context.Context
	rcode int
	err   error
}

// inner is the rrl.Handler's inner handler: the rest of the plugin chain.
type inner struct{ p *RRL }

func (h inner) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	u, ok := w.(interface{ Unwrap() dns.ResponseWriter })
	if !ok {
		return
	}
	c, ok := u.Unwrap().(*call)
	if !ok {
		return
	}
	ww := &wildcardWriter{ResponseWriter: w, ctx: c.ctx}
	rcode, err := plugin.NextOrFailure(h.p.Name(), h.p.Next, c.ctx, ww, r)
	if !plugin.ClientWrite(rcode) && !ww.wrote {
		// The server would write this error response itself, past the limits:
		// write it here so that errors-per-second applies to it (BIND limits
		// errors it makes up too), and tell the server it has been handled.
		m := new(dns.Msg)
		m.SetRcode(r, rcode)
		state := request.Request{W: w, Req: r}
		state.SizeAndDo(m)
		ww.WriteMsg(m)
		rcode = dns.RcodeSuccess
	}
	c.rcode, c.err = rcode, err
}

// wildcardWriter tells the rrl.Handler, when a response is written, whether it was
// synthesised from a wildcard: the file plugin (and the cache, for what it cached
// from it) sets the metadata "zone/wildcard" to the wildcard's owner name when the
// metadata plugin is on, and the response is then accounted to the wildcard as
// coredns/rrl and BIND do.
type wildcardWriter struct {
	dns.ResponseWriter
	ctx   context.Context
	wrote bool
}

func (w *wildcardWriter) WriteMsg(m *dns.Msg) error {
	w.wrote = true
	if f := metadata.ValueFunc(w.ctx, "zone/wildcard"); f != nil {
		if origin := f(); origin != "" {
			rrl.SetWildcardOrigin(w.ResponseWriter, origin)
		}
	}
	return w.ResponseWriter.WriteMsg(m)
}

func (w *wildcardWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}
