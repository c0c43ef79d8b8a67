// Package coredns is the CoreDNS plugin rrl: response rate limiting as BIND 9 does it,
// a drop-in for github.com/coredns/rrl, with this module's kernel request filter on
// the server block's UDP sockets and DNS server cookies. README.md in this directory
// describes the Corefile syntax.
package coredns

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/request"
	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// RRL is the plugin of one server block. It is a plugin.Handler: queries for its
// zones go through the Handler of an rrl.Protection, the one owner of where each
// limit runs, whose inner handler is the rest of the chain.
type RRL struct {
	Next  plugin.Handler
	Zones []string

	s      *settings
	prot   atomic.Pointer[rrl.Protection] // made by start, when every block of the load is set up
	groups []*socketGroup                 // the blocks sharing each UDP listen address of this one
	src    *source                        // its metrics (metrics.go); nil before setup sets it

	mu       sync.Mutex
	attached map[string]bool // listener addresses (dnsserver.Server.Addr) handed to prot
	closed   bool
}

func newPlugin(s *settings) *RRL {
	return &RRL{Zones: s.zones, s: s, attached: map[string]bool{}}
}

// start makes the plugin's Protection. It runs once every block of the Corefile
// is set up (OnStartup), so that a Corefile refused at a later block leaves nothing
// behind, and before CoreDNS opens its sockets: until AttachLocal hands them over,
// the Protection holds UDP queries to the request limits in Go.
func (p *RRL) start() error {
	if err := p.defaultZones(); err != nil {
		return err
	}
	var opts []rrl.Option
	if !p.s.kernel {
		opts = append(opts, rrl.WithoutFilter())
	}
	if p.s.cookies {
		c := rrl.NewCookies(p.s.cookieSecret())
		if p.s.prev != nil {
			c.SetPrevious(*p.s.prev)
		}
		opts = append(opts, rrl.WithCookies(c))
	} else {
		opts = append(opts, rrl.WithoutCookies())
	}
	prot, err := rrl.NewProtection(inner{p}, p.s.cfg, opts...)
	if err != nil {
		return err
	}
	p.prot.Store(prot)
	return nil
}

// maxDefaultZones is the most zones defaultZones configures: rrl.Config's zones
// keyword takes at most 256.
const maxDefaultZones = 256

// defaultZones gives the names judge (keyword zones) its apexes when the block does
// not set them: the zones of every rrl block served on the block's addresses, its
// own first (the root left out: it is no zone's apex). They are what the
// server is authoritative for, known before the first answer; a block's queries for
// them reach its Protection, and a kernel filter, which the blocks on an address
// share, judges them all. Answers teach the learner the zones below them (a
// delegation's SOA), as anywhere.
func (p *RRL) defaultZones() error {
	if values(p.s.cfg)["zones"] != "" {
		return nil
	}
	var zones []string
	add := func(zs []string) {
		for _, z := range zs {
			// A name the keyword refuses (the root, one too long) is left out.
			ok := rrl.NewConfig().SetValue("zones", z) == nil
			if ok && !slices.Contains(zones, z) && len(zones) < maxDefaultZones {
				zones = append(zones, z)
			}
		}
	}
	add(p.Zones)
	for _, g := range p.groups {
		for _, m := range g.members {
			add(m.Zones)
		}
	}
	if len(zones) == 0 {
		return nil
	}
	return p.s.cfg.SetValue("zones", strings.Join(zones, " "))
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
	c := &call{ResponseWriter: w, ctx: ctx}
	// The Protection's Handler holds the query to the request limits in Go unless
	// the eBPF filter did on the socket it arrived on; over them it writes nothing,
	// and c reports a success code, so the server writes nothing either.
	p.prot.Load().Handler().ServeDNS(c, r)
	return c.rcode, c.err
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
// coredns/rrl and BIND do, and teaches the names judge's learner that the name is
// a synthesis, not a name of its own.
type wildcardWriter struct {
	dns.ResponseWriter
	ctx   context.Context
	wrote bool
}

func (w *wildcardWriter) WriteMsg(m *dns.Msg) error {
	w.wrote = true
	if f := metadata.ValueFunc(w.ctx, "zone/wildcard"); f != nil {
		// The file plugin gives the wildcard's owner ("*.wild.example.org."); the
		// Handler takes the name it hangs from (SetWildcardOrigin), which the names
		// judge's learner marks as a wildcard parent (docs/names.md).
		if origin := strings.TrimPrefix(f(), "*."); origin != "" {
			rrl.SetWildcardOrigin(w.ResponseWriter, origin)
		}
	}
	return w.ResponseWriter.WriteMsg(m)
}

func (w *wildcardWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}
