package rrl

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Protection is everything that protects one DNS server, wired by Protect so that
// every limit applies exactly once whatever the host allows: the kernel filter on
// the server's UDP sockets (eBPF, or the classic prefilter where eBPF cannot load),
// the Go request limiter wherever the eBPF filter is not in force, response rate
// limiting with slip and DNS cookies in front of the server's handler, and the TCP
// connection limits. It hands out the dns.Server values to run.
//
// A Protection is safe for concurrent use.
type Protection struct {
	cfg     *Config
	rrl     *RRL
	filter  *Filter
	limiter *Limiter // nil when the eBPF filter enforces the request limits
	cookies *Cookies
	handler *Handler
	status  Status
	opts    protectOptions

	mu         sync.Mutex
	tcp        []*TCPLimiter
	udp        []*net.UDPConn
	done       bool
	stopWatch  context.CancelFunc // ends the kernel filter's events, if watched
	watchEnded chan struct{}
	capacity   *capacityRun // the Go Limiter's capacity controller (capacity_go.go)
}

// RequestLimiting says where requests-per-second and the other request limits are
// enforced.
type RequestLimiting int

const (
	// RequestsInKernel: the eBPF filter drops a source group's excess before the
	// server reads it.
	RequestsInKernel RequestLimiting = iota + 1
	// RequestsInGo: a Limiter drops a UDP source group's excess (in the server's
	// reader, or in the Handler) before the server's handler sees it, because the
	// eBPF filter is not in force.
	RequestsInGo
)

func (r RequestLimiting) String() string {
	switch r {
	case RequestsInKernel:
		return "in the kernel"
	case RequestsInGo:
		return "in Go"
	}
	return fmt.Sprintf("RequestLimiting(%d)", int(r))
}

// Status says which protection is in force and why.
type Status struct {
	Filter   FilterMode      // what is on the UDP sockets: ModeEBPF, ModeClassic or ModeNone
	Requests RequestLimiting // where the request limits (requests-per-second, ...) apply
	Reason   error           // why the eBPF filter, or the pinned one asked for, is not in force; nil when it is
	Pinned   string          // the pin directory the filter came from, or ""
	// KernelCookies: the eBPF filter verifies the Handler's server cookies
	// (Filter.UseCookies), so proven queries escape the limits they share.
	KernelCookies bool
}

// String is one line for a server's log, e.g. "kernel filter: ebpf; request
// limits in the kernel".
func (s Status) String() string {
	msg := "kernel filter: " + s.Filter.String()
	if s.Pinned != "" {
		msg += " (pinned at " + s.Pinned + ")"
	}
	msg += "; request limits " + s.Requests.String()
	if s.KernelCookies {
		msg += "; server cookies verified in the kernel"
	}
	switch {
	case s.Reason != nil && s.Filter == ModeEBPF:
		msg += "; pinned filter not attached, this process's own instead: " + s.Reason.Error()
	case s.Reason != nil:
		msg += "; eBPF filter not in force: " + s.Reason.Error()
	}
	return msg
}

// ProtectOption changes what Protect builds.
type ProtectOption func(*protectOptions)

type protectOptions struct {
	cookies    *Cookies
	noCookies  bool
	pinDir     string
	noFilter   bool
	handler    []HandlerOption
	tcpPerConn int
}

// ProtectCookies makes the Protection issue and verify DNS server cookies with c, to
// share one secret between servers; by default it makes a Cookies with a random
// secret.
func ProtectCookies(c *Cookies) ProtectOption { return func(o *protectOptions) { o.cookies = c } }

// ProtectWithoutCookies turns DNS server cookies off.
func ProtectWithoutCookies() ProtectOption { return func(o *protectOptions) { o.noCookies = true } }

// ProtectPinned attaches the filter a privileged step pinned in dir (LoadPinned, or
// rrlctl load) instead of loading one, which needs no privilege (Linux 5.19 and
// later); when that fails the Protection falls back as Attach does, and Status says
// why.
func ProtectPinned(dir string) ProtectOption { return func(o *protectOptions) { o.pinDir = dir } }

// ProtectWithoutFilter attaches no kernel filter: the request limits apply in Go.
// For a server whose sockets get a filter from outside (rrlctl attach), which should
// then leave requests-per-second at 0 in cfg so as not to limit twice.
func ProtectWithoutFilter() ProtectOption { return func(o *protectOptions) { o.noFilter = true } }

// errFilterOff is Status.Reason under ProtectWithoutFilter.
var errFilterOff = errors.New("rrl: kernel filter turned off (ProtectWithoutFilter)")

// ProtectHandler passes options to the Handler (WithWildcardFunc, WithClock).
// WithLimiter and WithRequestsLimited are set by Protect and must not be given.
func ProtectHandler(opts ...HandlerOption) ProtectOption {
	return func(o *protectOptions) { o.handler = append(o.handler, opts...) }
}

// ProtectTCPConnsPerClient sets the concurrent TCP connections each client may hold
// (DefaultTCPConnsPerClient by default).
func ProtectTCPConnsPerClient(n int) ProtectOption {
	return func(o *protectOptions) { o.tcpPerConn = n }
}

// Protect protects a DNS server serving next over udp (and over TCP through
// TCPServer) with the limits in cfg (nil means NewConfig()).
//
// It attaches the best kernel filter this host allows to udp (see Attach) and, when
// that is not the eBPF filter for any reason, enforces the request limits in Go
// instead: in the server's reader for the servers UDPServer and AddUDP return, in the
// Handler for any other server; either way requests-per-second applies once to each
// UDP query, and to TCP queries through response rate limiting. Status says which.
// Protect fails only when cfg is invalid or udp cannot be protected at all (not a UDP
// socket).
func Protect(udp *net.UDPConn, next dns.Handler, cfg *Config, opts ...ProtectOption) (*Protection, error) {
	if cfg == nil {
		cfg = NewConfig()
	}
	cfg = cfg.clone()
	p := &Protection{cfg: cfg}
	for _, o := range opts {
		o(&p.opts)
	}
	var err error
	if p.rrl, err = New(cfg); err != nil {
		return nil, err
	}
	if err := p.attach(udp); err != nil {
		return nil, err
	}
	hopts := append([]HandlerOption(nil), p.opts.handler...)
	if !p.opts.noCookies {
		p.cookies = p.opts.cookies
		if p.cookies == nil {
			var secret CookieSecret
			rand.Read(secret[:]) // never fails: crypto/rand panics instead
			p.cookies = NewCookies(secret)
		}
		hopts = append(hopts, WithCookies(p.cookies))
		if p.status.Filter == ModeEBPF {
			// A pinned filter whose secrets this process may not write judges
			// every query as without a cookie, as before.
			p.status.KernelCookies = p.filter.UseCookies(p.cookies) == nil
		}
	}
	if p.limiter != nil {
		hopts = append(hopts, WithLimiter(p.limiter))
	} else {
		hopts = append(hopts, WithRequestsLimited())
	}
	p.handler = NewHandler(next, p.rrl, hopts...)
	p.udp = append(p.udp, udp)
	if p.status.Filter == ModeEBPF && p.cfg.eventFunc != nil {
		// The kernel filter's limiting events go where the RRL's and the
		// Limiter's do.
		var ctx context.Context
		ctx, p.stopWatch = context.WithCancel(context.Background())
		p.watchEnded = make(chan struct{})
		go func() {
			defer close(p.watchEnded)
			p.filter.WatchLimited(ctx, time.Second, p.cfg.eventsPerSec(), p.cfg.eventFunc)
		}()
	}
	p.startCapacity() // capacity_go.go
	return p, nil
}

// attach puts the kernel filter on the first socket and decides where the request
// limits run.
func (p *Protection) attach(udp *net.UDPConn) error {
	var f *Filter
	var err error
	if p.opts.noFilter {
		p.status = Status{Filter: ModeNone, Requests: RequestsInGo, Reason: errFilterOff}
		p.limiter, err = NewLimiter(p.cfg)
		return err
	}
	if p.opts.pinDir != "" {
		f, err = AttachPinned(udp, p.opts.pinDir)
		if err == nil {
			// The pins carry the request limits the privileged step loaded, which
			// every process attached to them shares.
			p.status.Pinned = p.opts.pinDir
		} else {
			pinErr := err
			f, err = Attach(udp, p.cfg)
			if err == nil || f != nil {
				err = errors.Join(fmt.Errorf("rrl: attach pinned filter: %w", pinErr), err)
			}
		}
	} else {
		f, err = Attach(udp, p.cfg)
	}
	if f == nil && !errors.Is(err, ErrNotSupported) {
		// Not a UDP socket, or not even the classic prefilter would attach.
		return err
	}
	p.filter = f
	p.status.Filter = f.Mode()
	p.status.Reason = err // a pinned filter that failed may leave a filter of our own
	if p.status.Filter == ModeEBPF {
		p.status.Requests = RequestsInKernel
		return nil
	}
	p.status.Requests = RequestsInGo
	p.limiter, err = NewLimiter(p.cfg)
	return err
}

// Status says which protection is in force and why.
func (p *Protection) Status() Status { return p.status }

// Handler returns the middleware to serve queries with: the server's handler behind
// response rate limiting, cookies and, where the eBPF filter is not in force, the Go
// request limiter. UDPServer and TCPServer use it.
func (p *Protection) Handler() *Handler { return p.handler }

// RRL returns the response rate limiter.
func (p *Protection) RRL() *RRL { return p.rrl }

// Filter returns the kernel filter on the UDP sockets (nil where none could be
// attached, e.g. on other systems than Linux).
func (p *Protection) Filter() *Filter { return p.filter }

// Limiter returns the Go request limiter, or nil when the eBPF filter enforces the
// request limits.
func (p *Protection) Limiter() *Limiter { return p.limiter }

// Cookies returns the DNS server cookies the Handler issues, or nil without them.
func (p *Protection) Cookies() *Cookies { return p.cookies }

// UDPServer returns a dns.Server for the socket given to Protect, ready for
// ActivateAndServe, with Handler.ConfigureServer applied; set fields such as
// NotifyStartedFunc before starting it.
func (p *Protection) UDPServer() *dns.Server { return p.udpServer(p.udp[0]) }

func (p *Protection) udpServer(conn *net.UDPConn) *dns.Server {
	srv := &dns.Server{PacketConn: conn, Handler: p.handler}
	if p.limiter != nil {
		// The Go request limiter drops a flood's excess in the server's reader, before
		// the packet is unpacked or given a goroutine; the Handler then skips it.
		srv.DecorateReader = limitReaderCounted(p.limiter, p.handler)
		srv.Handler = readerLimited{p.handler}
	}
	p.handler.ConfigureServer(srv)
	return srv
}

// readerLimited serves queries that a LimitReader already held to the request
// limits.
type readerLimited struct{ h *Handler }

func (r readerLimited) ServeDNS(w dns.ResponseWriter, req *dns.Msg) { r.h.serve(w, req, nil) }

// AddUDP protects another UDP socket with the same limits (another member of a
// SO_REUSEPORT group, or the other address family) and returns its dns.Server.
func (p *Protection) AddUDP(conn *net.UDPConn) (*dns.Server, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil, ErrClosed
	}
	if p.filter != nil {
		if err := p.filter.Attach(conn); err != nil {
			return nil, err
		}
	}
	p.udp = append(p.udp, conn)
	return p.udpServer(conn), nil
}

// tcpReadTimeout bounds how long a TCP client may take to send a query.
const tcpReadTimeout = 5 * time.Second

// TCPServer returns a dns.Server for l, with the connection limits and
// Handler.ConfigureServer applied, ready for ActivateAndServe.
func (p *Protection) TCPServer(l net.Listener) *dns.Server {
	per := p.opts.tcpPerConn
	if per == 0 {
		per = DefaultTCPConnsPerClient
	}
	t := LimitListener(l, per)
	p.mu.Lock()
	p.tcp = append(p.tcp, t)
	p.mu.Unlock()
	srv := &dns.Server{Listener: t, Handler: p.handler, ReadTimeout: tcpReadTimeout}
	p.handler.ConfigureServer(srv)
	return srv
}

// TCPLimiters returns the connection limiters of the listeners given to TCPServer.
func (p *Protection) TCPLimiters() []*TCPLimiter {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*TCPLimiter(nil), p.tcp...)
}

// Update applies cfg to every layer at once, keeping the response accounts, the
// request limiter's sketches and the kernel filter's state: limits, levels,
// slip-ratio, window, exemptions and report-only change for the next query. cfg is
// checked before anything changes, and the kernel filter, the only layer that can
// still fail, is updated first (all or nothing); so on error nothing has changed.
// fresh reports that the response accounts started afresh (see RRL.Update). A pinned
// filter's limits are the pins': Update writes them for every process attached
// (which needs write access to the pins).
func (p *Protection) Update(cfg *Config) (fresh bool, err error) {
	if cfg == nil {
		cfg = NewConfig()
	}
	if err := validate(cfg); err != nil {
		return false, err
	}
	if _, err := newLimiterParams(cfg); err != nil {
		return false, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return false, ErrClosed
	}
	if p.filter != nil {
		if err := p.filter.Update(cfg); err != nil {
			return false, fmt.Errorf("rrl: update kernel filter: %w", err)
		}
	}
	if p.limiter != nil {
		if err := p.limiter.Update(cfg); err != nil {
			return false, fmt.Errorf("rrl: update request limiter: %w", err)
		}
	}
	if fresh, err = p.rrl.Update(cfg); err != nil {
		return false, fmt.Errorf("rrl: update response rate limiting: %w", err)
	}
	p.cfg = cfg.clone()
	p.updateCapacity(p.cfg) // capacity_go.go
	return fresh, nil
}

// Close detaches the kernel filter (see Filter.Close) and frees it. Shut the
// servers down first; the sockets are the servers' to close.
func (p *Protection) Close() error {
	p.stopCapacity() // capacity_go.go
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
	if p.stopWatch != nil {
		p.stopWatch()
		<-p.watchEnded
		p.stopWatch = nil
	}
	return p.filter.Close()
}
