package rrl

import (
	"crypto/rand"
	"errors"
	"fmt"
	"github.com/dnsrake/rrl/tcplimit"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// Protection is everything that protects one DNS server, and the one owner of how
// it is wired, so that every limit applies exactly once whatever the host allows:
// the kernel filter on the server's UDP sockets (eBPF, or the classic prefilter
// where eBPF cannot load), the Go request limiter for every UDP query that did not
// arrive on a socket where its eBPF filter is in force, response rate limiting with
// slip and DNS cookies in front of the server's handler, and the TCP connection
// limits. A query with a valid server cookie is judged at its own address only,
// wherever the request limits run. It hands out the dns.Server values to run.
//
// Make one with Protect for a server that opens its own UDP socket, or with
// NewProtection for a host whose sockets come later (AttachLocal, AddUDP).
//
// A Protection is safe for concurrent use.
type Protection struct {
	rrl     *RRL
	cookies *Cookies // nil without cookies
	handler *Handler
	opts    options
	// secretChosen: the cookie secret is the caller's (WithCookies or the
	// Config's cookie-secret), the same in every process of a site; a random one
	// must not be written into a pinned filter that other processes share.
	secretChosen bool

	// upstream lists the local addresses whose queries were held to the request
	// limits before the Handler (by the eBPF filter, or by the reader of a server
	// UDPServer or AddUDP returned): the Handler applies the Go limits to every
	// other UDP query. Replaced as a whole under mu.
	upstream atomic.Pointer[[]netip.AddrPort]

	limMu   sync.Mutex              // serialises making and updating the Go limiter
	limiter atomic.Pointer[Limiter] // made when a query first needs it
	limCfg  *Config                 // the Config the Go limiter is made with, under limMu

	// learning is the eBPF filter whose names tables the Handler's responses
	// teach (the Protection's filter since it had one; a predecessor draining its
	// queries after a successor took it over teaches it still): read per
	// response, without p.mu.
	learning atomic.Pointer[Filter]

	mu            sync.Mutex
	cfg           *Config
	filter        *Filter // the filter this Protection holds (made or taken over), or nil
	reason        error   // why the eBPF filter is not in force everywhere, or nil
	pinned        string
	kernelCookies bool
	cookieReason  error // why the eBPF filter does not verify the cookies, or nil
	socks         []*heldSocket
	udp           []*net.UDPConn // the sockets of Protect and AddUDP, in order
	tcp           []*tcplimit.Listener
	done          bool
	watch         *kernelWatch // the eBPF filter's limiting events; nil without that filter
	capacity      *capacityRun // the Go Limiter's capacity controller (capacity_go.go), under limMu
	// capClosed: Close has begun, under limMu; from then on no controller starts
	// (startCapacity), whatever an Update or a first query racing Close does.
	capClosed bool
	capSrc    *limiterCapacity // the controller's source, under limMu
	// limGiven: a successor inherited the Go Limiter (limiter_handover.go), under
	// limMu; this Protection still judges with it, but no longer updates it.
	limGiven bool
}

// heldSocket is one UDP socket a Protection protects.
type heldSocket struct {
	id    socketID       // its identity, whatever descriptor reached it (zero where unknown)
	local netip.AddrPort // its bound address, unmapped, as queries' LocalAddr report it
	conn  *net.UDPConn   // the socket of Protect or AddUDP; nil for AttachLocal's
	// kernel: this Protection's eBPF filter is in force on the socket. reader: a
	// server of this Protection reads the socket and holds it to the Go limits
	// while kernel is false.
	kernel, reader atomic.Bool
}

// holders records which Protection holds each Filter, so that a successor taking a
// predecessor's filter over (AttachLocal) leaves the predecessor's Close nothing to
// detach, and every open Protection, so that a change of the filter on a socket
// reaches every Protection serving it. Its lock is taken before any Protection's
// mu, and is held by every call that locks two Protections.
var holders = struct {
	sync.Mutex
	m    map[*Filter]*Protection
	open map[*Protection]bool
}{m: map[*Filter]*Protection{}, open: map[*Protection]bool{}}

// takeOverHook, when set by a test, is called before a Protection takes a
// predecessor's filter over; an error makes the take-over fail.
var takeOverHook func(*Filter) error

// Status says which protection is in force and why.
type Status struct {
	Filter FilterMode // what this Protection's filter is: ModeEBPF, ModeClassic or ModeNone
	// Reason says why the eBPF filter, or the pinned one asked for, is not in force
	// on every socket; nil when it is.
	Reason error
	Pinned string // the pin directory the filter came from, or ""
	// Sockets is the number of UDP sockets the Protection holds, KernelSockets how
	// many of them its eBPF filter holds to the request limits. The Go limiter holds
	// the others, and every UDP query the Handler gets from a socket the Protection
	// does not hold.
	Sockets, KernelSockets int
	// RequestsInKernel: the eBPF filter enforces the request limits
	// (requests-per-second, ...) on every socket the Protection holds, and there
	// is at least one.
	RequestsInKernel bool
	// Cookies: the Handler issues and verifies DNS server cookies; a query with a
	// valid one is judged at its own address only, by the eBPF filter on its
	// sockets and by the Go limiter (before the other limits) elsewhere.
	Cookies bool
	// KernelCookies: the eBPF filter verifies the Handler's server cookies
	// (Filter.UseCookies), so proven queries escape the limits they share there.
	KernelCookies bool
	// CookiesReason says why a query with a valid server cookie is not judged at
	// its own address alone everywhere although cookies are on: the eBPF filter in
	// force does not verify them (a pinned filter other processes share, with no
	// cookie secret configured), or the finest request level of a family is coarser
	// than an address; nil otherwise.
	CookiesReason error
	// Events is why the eBPF filter's limiting events could not be read at the
	// latest look (a second ago at most); nil when they could, or are off.
	Events error
}

// String is one line for a server's log, e.g. "kernel filter: ebpf; request
// limits in the kernel; server cookies verified in the kernel".
func (s Status) String() string {
	msg := "kernel filter: " + s.Filter.String()
	if s.Pinned != "" {
		msg += " (pinned at " + s.Pinned + ")"
	}
	switch {
	case s.RequestsInKernel:
		msg += "; request limits in the kernel"
	case s.KernelSockets > 0:
		msg += "; request limits in the kernel on " + strconv.Itoa(s.KernelSockets) + " of " +
			strconv.Itoa(s.Sockets) + " UDP sockets, in Go on the others"
	default:
		msg += "; request limits in Go"
	}
	switch {
	case !s.Cookies:
		msg += "; server cookies off"
	case s.KernelCookies && s.RequestsInKernel:
		msg += "; server cookies verified in the kernel"
	case s.KernelCookies:
		msg += "; server cookies verified in the kernel, and in Go before the request limits"
	default:
		msg += "; server cookies verified in Go before the request limits"
	}
	switch {
	case s.Reason != nil && s.Filter == ModeEBPF && s.KernelSockets == s.Sockets:
		msg += "; pinned filter not attached, this process's own instead: " + s.Reason.Error()
	case s.Reason != nil:
		msg += "; eBPF filter not in force: " + s.Reason.Error()
	}
	if s.CookiesReason != nil {
		msg += "; proven clients judged with their networks: " + s.CookiesReason.Error()
	}
	if s.Events != nil {
		msg += "; kernel limiting events unreadable: " + s.Events.Error()
	}
	return msg
}

// errFilterOff is Status.Reason under WithoutFilter.
var errFilterOff = errors.New("rrl: kernel filter turned off (WithoutFilter)")

// Protect protects a DNS server serving next over udp (and over TCP through
// TCPServer) with the limits in cfg (nil means NewConfig()).
//
// It attaches the best kernel filter this host allows to udp (see Attach) and, when
// that is not the eBPF filter for any reason, enforces the request limits in Go
// instead: in the server's reader for the servers UDPServer and AddUDP return, in the
// Handler for any other server; either way requests-per-second applies once to each
// UDP query, and to TCP queries through response rate limiting. Status says which.
// Protect fails only when cfg is invalid or udp cannot be protected at all: nil (as
// a failed net.ListenUDP returns it), closed, or not a UDP socket.
//
// Server cookies are on unless WithoutCookies is given, made with cfg's
// cookie-secret or WithCookies' Cookies, else a random secret, and the eBPF
// filter verifies them too. A pinned filter (WithPinned) is shared by every
// process attached to it and holds one set of secrets: it gets this process's only
// when they are configured (every process of a site writes the same); with a random
// one, Status reports KernelCookies false and says why in CookiesReason.
func Protect(udp *net.UDPConn, next dns.Handler, cfg *Config, opts ...Option) (*Protection, error) {
	p, err := NewProtection(next, cfg, opts...)
	if err != nil {
		return nil, err
	}
	if _, err := p.hold(udp); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// NewProtection is Protect for a host whose UDP sockets come later: a framework that
// opens them itself (hand them over with AttachLocal once they are open), or a
// server that adds them with AddUDP. Until then, and for every UDP query that does
// not arrive on a socket where the Protection's eBPF filter is in force, the Handler
// applies the request limits in Go. It fails only when cfg is invalid.
func NewProtection(next dns.Handler, cfg *Config, opts ...Option) (*Protection, error) {
	if cfg == nil {
		cfg = NewConfig()
	}
	cfg = cfg.clone()
	p := &Protection{cfg: cfg, limCfg: cfg}
	for _, o := range opts {
		o(&p.opts)
	}
	var err error
	if p.rrl, err = New(cfg); err != nil {
		return nil, err
	}
	if _, err := newLimiterParams(cfg); err != nil {
		return nil, err
	}
	if !p.opts.noCookies {
		p.cookies = p.opts.cookies
		p.secretChosen = p.cookies != nil || cfg.secrets != nil
		if p.cookies == nil {
			var secret CookieSecret
			rand.Read(secret[:]) // never fails: crypto/rand panics instead
			p.cookies = NewCookies(secret)
		}
		if cs := cfg.secrets; cs != nil {
			p.cookies.setSecrets(cs.current, cs.previous)
		}
	}
	ho := p.opts
	ho.cookies = p.cookies // nil under WithoutCookies
	p.handler = newHandler(next, p.rrl, &ho)
	p.handler.core = p
	p.upstream.Store(new([]netip.AddrPort))
	holders.Lock()
	holders.open[p] = true
	holders.Unlock()
	return p, nil
}

// hold protects conn, a socket given to Protect or AddUDP: it puts the
// Protection's filter on it (making one for the first socket) and records it. It
// returns a fatal error when conn cannot be protected at all (not an open UDP
// socket), else soft: the filter could not be attached, and the Go limits hold the
// socket.
func (p *Protection) hold(conn *net.UDPConn) (soft, fatal error) {
	if err := checkUDP(conn); err != nil {
		return nil, fmt.Errorf("rrl: protect: %w", err)
	}
	id, err := identify(conn)
	if err != nil {
		return nil, fmt.Errorf("rrl: protect: %w", err)
	}
	holders.Lock()
	defer holders.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil, ErrClosed
	}
	s := p.addSocket(id, localOf(conn), conn)
	p.udp = append(p.udp, conn)
	switch {
	case p.opts.noFilter:
		p.reason = errFilterOff
	case p.filter == nil:
		f, err := p.newFilter(conn)
		if f == nil && !errors.Is(err, ErrNotSupported) {
			p.removeSocket(s)
			p.udp = p.udp[:len(p.udp)-1]
			return nil, err
		}
		soft = err
	default:
		if err := p.filter.Attach(conn); err != nil {
			soft = fmt.Errorf("rrl: attach filter: %w", err)
			p.reason = soft
		}
	}
	p.remarkAll()
	return soft, nil
}

// newFilter makes the Protection's filter on conn, the first socket it holds:
// the pinned one asked for or a new one, falling back as Attach does. It returns
// what Attach returns; p.mu and holders are held.
func (p *Protection) newFilter(conn syscall.Conn) (*Filter, error) {
	var f *Filter
	var err error
	if p.opts.pinDir != "" {
		f, err = AttachPinned(conn, p.opts.pinDir)
		if err == nil {
			// The pins carry the request limits the privileged step loaded, which
			// every process attached to them shares.
			p.pinned = p.opts.pinDir
		} else {
			pinErr := err
			f, err = Attach(conn, p.cfg.withoutSecrets())
			if err == nil || f != nil {
				err = errors.Join(fmt.Errorf("rrl: attach pinned filter: %w", pinErr), err)
			}
		}
	} else {
		// The secrets reach the filter from p.cookies (useFilterCookies).
		f, err = Attach(conn, p.cfg.withoutSecrets())
	}
	p.reason = err // a pinned filter that failed may leave a filter of our own
	if f == nil {
		return nil, err
	}
	p.filter = f
	p.learning.Store(f)
	holders.m[f] = p
	p.useFilterCookies()
	p.startWatch()
	return f, err
}

// useFilterCookies gives the eBPF filter the Handler's cookie secrets, and sets
// KernelCookies; p.mu is held. A pinned filter other processes may share gets them
// only when they are the caller's (WithCookies, cookie-secret): a random secret
// of this process would make the cookies of every other process invalid there.
func (p *Protection) useFilterCookies() error {
	f := p.filter
	p.kernelCookies, p.cookieReason = false, nil
	if f.Mode() != ModeEBPF {
		return nil
	}
	if p.cookies == nil {
		if f.pinPath() != "" {
			return nil // the pins' secrets are the other processes' too
		}
		return f.UseCookies(nil)
	}
	if f.pinPath() != "" && !p.secretChosen {
		p.cookieReason = errPinnedSecret
		return nil
	}
	if err := f.UseCookies(p.cookies); err != nil {
		// A pinned filter whose secrets this process may not write judges
		// every query as without a cookie, as before.
		p.cookieReason = fmt.Errorf("in the kernel: %w", err)
		return err
	}
	p.kernelCookies = true
	return nil
}

// errPinnedSecret is Status.CookiesReason for a pinned filter without a configured
// cookie secret.
var errPinnedSecret = errors.New("in the kernel: the pinned filter may be shared with other processes, and no cookie-secret is configured for all of them: this process's random secret is not written into it")

// startWatch makes the watch that reports the eBPF filter's limiting events to the
// event function of the latest Config (none while it has none); p.mu is held.
func (p *Protection) startWatch() {
	if p.watch != nil && p.watch.filter == p.filter {
		return
	}
	p.stopWatch()
	if p.filter.Mode() == ModeEBPF {
		p.watch = newKernelWatch(p.filter, p.cfg.eventFunc, p.cfg.eventsPerSec())
	}
}

// stopWatch ends the watch; p.mu is held. It cannot deadlock with an event function
// that calls the Protection: the watch waits only for a goroutine that is not in the
// event function, and that goroutine takes no lock of the Protection's.
func (p *Protection) stopWatch() {
	p.watch.close()
	p.watch = nil
}

// AttachLocal puts the Protection's kernel filter on every UDP socket of this
// process bound to local, for hosts that open their sockets themselves; call it
// again for sockets opened later, which it adds. The sockets are found by local
// address through /proc/self/fd and the namespace's UDP tables: both families, every
// socket of a SO_REUSEPORT group, a dual-stack socket for an unspecified address; an
// unspecified address in local matches every socket on the port, port 0 is an error,
// and TCP sockets never match. The filter follows each socket, not the descriptor it
// was found through (a reload that keeps a copy of it).
//
// When those sockets carry the filter of another Protection of this process (a
// reload's predecessor) and this one has none yet, it takes that filter over: the
// filter runs this Protection's Config from then on, keeping its sketches
// (Filter.Update), and verifies this Protection's cookie secrets, and the
// predecessor's Close leaves it in place. When the take-over fails it attaches a
// filter of its own instead, and where that fails too the sockets are held to the
// request limits in Go, never to none: Status says which, and the error says why.
// The Protection judges each socket by the filter in force on it.
func (p *Protection) AttachLocal(local netip.AddrPort) error {
	socks, err := localSockets(local)
	if err != nil {
		return fmt.Errorf("rrl: attach to %s: %w", local, err)
	}
	holders.Lock()
	defer holders.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return ErrClosed
	}
	for _, s := range socks {
		p.addSocket(s.id, s.local, nil)
	}
	defer p.remarkAll()
	if p.opts.noFilter {
		p.reason = errFilterOff
		if pred := goPredecessor(p, socks); pred != nil {
			p.inheritLimiter(pred) // limiter_handover.go
		}
		return nil
	}
	var errs []error
	if p.filter == nil {
		if pred, f := predecessor(p, socks); f != nil {
			if err := p.takeOver(pred, f); err != nil {
				err = fmt.Errorf("rrl: take over the kernel filter on %s: %w", local, err)
				p.reason = err
				errs = append(errs, err)
			}
		}
	}
	// A descriptor found may close before it is used: try the socket's others, then
	// look again.
	via := func(id socketID, fn func(foundSocket) error) error {
		err := viaAnyDescriptor(socks, id, fn)
		for range 3 {
			if err == nil || !isClosedSocket(err) {
				break
			}
			time.Sleep(5 * time.Millisecond)
			if fresh, serr := localSockets(local); serr == nil {
				socks = fresh
			}
			err = viaAnyDescriptor(socks, id, fn)
		}
		return err
	}
	if p.filter == nil {
		var f *Filter
		err := via(socks[0].id, func(s foundSocket) error {
			var err error
			f, err = p.newFilter(s.conn)
			if f == nil {
				return err
			}
			return nil
		})
		if err == nil && f != nil {
			err = p.reason
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("rrl: attach to %s: %w", local, err))
		}
		if f == nil {
			return errors.Join(errs...)
		}
	}
	done := map[socketID]bool{}
	for _, s := range socks {
		if done[s.id] || filterOwning(s.id) == p.filter {
			continue
		}
		done[s.id] = true
		err := via(s.id, func(s foundSocket) error {
			if err := p.filter.Attach(s.conn); err != nil {
				return fmt.Errorf("rrl: attach to %s (descriptor %d): %w", s.local, s.fd, err)
			}
			return nil
		})
		if err != nil {
			p.reason = err
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// viaAnyDescriptor runs fn on the descriptors found of the socket id in turn until
// one is not closed: a host that copies its sockets (CoreDNS on a reload) closes the
// old descriptors while the new ones stay, so the first one found may be gone by the
// time it is used.
func viaAnyDescriptor(socks []foundSocket, id socketID, fn func(foundSocket) error) error {
	var err error
	for _, s := range socks {
		if s.id != id {
			continue
		}
		if err = fn(s); err == nil || !isClosedSocket(err) {
			return err
		}
	}
	return err
}

// predecessor returns another Protection that holds the filter on one of socks, and
// that filter; holders is held.
func predecessor(p *Protection, socks []foundSocket) (*Protection, *Filter) {
	for _, s := range socks {
		if f := filterOwning(s.id); f != nil {
			if q := holders.m[f]; q != nil && q != p {
				return q, f
			}
		}
	}
	return nil, nil
}

// takeOver makes f, pred's filter, this Protection's: it runs p's Config and cookie
// secrets, and pred lets go of it. holders and p.mu are held. On error f is pred's
// still (its Config may be p's: Update succeeded, the cookies did not).
func (p *Protection) takeOver(pred *Protection, f *Filter) error {
	if takeOverHook != nil {
		if err := takeOverHook(f); err != nil {
			return err
		}
	}
	if err := f.Update(p.cfg.withoutSecrets()); err != nil {
		return err
	}
	p.filter = f
	if err := p.useFilterCookies(); err != nil && f.pinPath() == "" {
		p.filter, p.kernelCookies, p.cookieReason = nil, false, nil
		// The filter stays the predecessor's, on the sockets a new one does not
		// replace: give it back its Config and secrets.
		pred.mu.Lock()
		if pred.filter == f {
			f.Update(pred.cfg.withoutSecrets())
			pred.useFilterCookies()
		}
		pred.mu.Unlock()
		return fmt.Errorf("cookies: %w", err)
	}
	holders.m[f] = p
	p.learning.Store(f)
	pred.mu.Lock()
	if pred.filter == f {
		pred.stopWatch()
		pred.filter = nil
	}
	pred.mu.Unlock()
	p.pinned = f.pinPath()
	p.startWatch()
	p.inheritLimiter(pred) // limiter_handover.go
	return nil
}

// addSocket records a socket, once; p.mu is held.
func (p *Protection) addSocket(id socketID, local netip.AddrPort, conn *net.UDPConn) *heldSocket {
	for _, s := range p.socks {
		if (id != socketID{} && s.id == id) || (conn != nil && s.conn == conn) {
			if conn != nil {
				s.conn = conn
			}
			return s
		}
	}
	s := &heldSocket{id: id, local: local, conn: conn}
	p.socks = append(p.socks, s)
	return s
}

// removeSocket forgets s; p.mu is held.
func (p *Protection) removeSocket(s *heldSocket) {
	p.socks = slices.DeleteFunc(p.socks, func(t *heldSocket) bool { return t == s })
}

// remarkAll records, for every socket of every open Protection, whether an eBPF
// filter a Protection holds is in force on it (this one's, or that of a successor
// that took it over), and recomputes their upstream addresses: a filter that
// replaced or left a socket changes what every Protection serving it must do.
// holders and p.mu are held.
func (p *Protection) remarkAll() {
	for q := range holders.open {
		if q != p {
			q.mu.Lock()
		}
		for _, s := range q.socks {
			q.mark(s)
		}
		q.refresh()
		if q != p {
			q.mu.Unlock()
		}
	}
}

// mark records whether an eBPF filter a Protection holds is in force on s, and
// makes the Go limiter where none is, so that it is there before the first query;
// holders and p.mu are held.
func (p *Protection) mark(s *heldSocket) {
	kernel := false
	if (s.id != socketID{}) {
		f := filterOwning(s.id)
		kernel = f != nil && holders.m[f] != nil && f.Mode() == ModeEBPF
	}
	s.kernel.Store(kernel)
	if !kernel {
		p.goLimiter()
	}
}

// refresh recomputes the addresses whose queries reach the Handler already held to
// the request limits: every socket the Protection holds there has its eBPF filter
// or a reader of its servers. p.mu is held.
func (p *Protection) refresh() {
	var up []netip.AddrPort
	for _, s := range p.socks {
		if slices.Contains(up, s.local) {
			continue
		}
		all := true
		for _, t := range p.socks {
			if t.local == s.local && !t.kernel.Load() && !t.reader.Load() {
				all = false
				break
			}
		}
		if all {
			up = append(up, s.local)
		}
	}
	p.upstream.Store(&up)
}

// goLimiter returns the Go request limiter, made on first use.
func (p *Protection) goLimiter() *Limiter {
	if l := p.limiter.Load(); l != nil {
		return l
	}
	p.limMu.Lock()
	defer p.limMu.Unlock()
	if l := p.limiter.Load(); l != nil {
		return l
	}
	l, err := NewLimiter(p.limCfg)
	if err != nil {
		// NewProtection checked the Config, and crypto/rand does not fail: a
		// Limiter with a fixed seed still limits.
		l, _ = newLimiterSeed(p.limCfg, uint64(time.Now().UnixNano()))
	}
	p.limiter.Store(l)
	p.startCapacity(l) // capacity_go.go
	return l
}

// requestLimiter returns the limiter the Handler holds a UDP query to, or nil when
// the query reached it held to the request limits already: it arrived on a socket
// where the eBPF filter is in force, or that a server of this Protection reads.
func (p *Protection) requestLimiter(w dns.ResponseWriter) *Limiter {
	up := *p.upstream.Load()
	if len(up) > 0 {
		local := localAddrPort(w.LocalAddr())
		for _, a := range up {
			if a == local {
				return nil
			}
		}
	}
	return p.goLimiter()
}

// observeResponse teaches the Go limiter's name learner, if the limiter is made,
// and the eBPF filter's names tables, if the Protection has the filter, from a
// response the Handler's inner handler computed (requestGate): each judges the
// queries it sees by what it learnt.
func (p *Protection) observeResponse(m *dns.Msg, wildcard string) {
	if l := p.limiter.Load(); l != nil {
		l.observe(m, wildcard)
	}
	if f := p.learning.Load(); f != nil {
		f.observe(m, wildcard) // filter_names.go
	}
}

// localOf returns conn's bound address as queries' LocalAddr report it.
func localOf(conn *net.UDPConn) netip.AddrPort {
	return localAddrPort(conn.LocalAddr())
}

// localAddrPort returns a local address unmapped and without zone, so that the
// address of a socket and of a query on it compare equal.
func localAddrPort(a net.Addr) netip.AddrPort {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.UDPAddr:
		if a == nil {
			return ap
		}
		ap = a.AddrPort()
	case nil:
		return ap
	default:
		ap, _ = netip.ParseAddrPort(a.String())
	}
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
}

// Status says which protection is in force and why.
func (p *Protection) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{
		Filter:        p.filter.Mode(),
		Reason:        p.reason,
		Pinned:        p.pinned,
		Sockets:       len(p.socks),
		Cookies:       p.cookies != nil,
		KernelCookies: p.kernelCookies,
		CookiesReason: p.cookieReason,
		Events:        p.watch.lastErr(),
	}
	for _, s := range p.socks {
		if s.kernel.Load() {
			st.KernelSockets++
		}
	}
	st.RequestsInKernel = st.Sockets > 0 && st.KernelSockets == st.Sockets
	if p.cookies != nil {
		for _, v4 := range []bool{true, false} {
			if l := p.cfg.requestLevels(v4); len(l) > 0 && l[0].PrefixLen != map[bool]int{true: 32, false: 128}[v4] {
				st.CookiesReason = errors.Join(st.CookiesReason, fmt.Errorf("the finest %s request level is /%d, not a whole address", map[bool]string{true: "IPv4", false: "IPv6"}[v4], l[0].PrefixLen))
			}
		}
	}
	return st
}

// Handler returns the middleware to serve queries with: the server's handler behind
// response rate limiting, cookies and, for UDP queries that did not arrive on a
// socket where the eBPF filter is in force, the Go request limiter. UDPServer and
// TCPServer use it.
func (p *Protection) Handler() *Handler { return p.handler }

// RRL returns the response rate limiter.
func (p *Protection) RRL() *RRL { return p.rrl }

// Filter returns the kernel filter the Protection holds (nil where none could be
// attached, e.g. on other systems than Linux, or before its first socket).
func (p *Protection) Filter() *Filter {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.filter
}

// Limiter returns the Go request limiter, or nil while no query has needed it
// (every socket has the eBPF filter).
func (p *Protection) Limiter() *Limiter { return p.limiter.Load() }

// Cookies returns the DNS server cookies the Handler issues, or nil without them.
func (p *Protection) Cookies() *Cookies { return p.cookies }

// UDPServer returns a dns.Server for the socket given to Protect, ready for
// ActivateAndServe, with Handler.ConfigureServer applied; set fields such as
// NotifyStartedFunc before starting it. It returns nil for a Protection that holds
// no socket of Protect or AddUDP.
func (p *Protection) UDPServer() *dns.Server {
	p.mu.Lock()
	if len(p.udp) == 0 {
		p.mu.Unlock()
		return nil
	}
	conn := p.udp[0]
	p.mu.Unlock()
	return p.udpServer(conn)
}

func (p *Protection) udpServer(conn *net.UDPConn) *dns.Server {
	p.mu.Lock()
	var s *heldSocket
	for _, t := range p.socks {
		if t.conn == conn {
			s = t
		}
	}
	p.mu.Unlock()
	srv := &dns.Server{PacketConn: conn, Handler: p.handler}
	if s != nil {
		// Where the eBPF filter is not in force, the Go request limiter drops a
		// flood's excess in the server's reader, before the packet is unpacked or
		// given a goroutine; the Handler then skips it.
		srv.DecorateReader = p.decorateReader(s)
	}
	p.handler.ConfigureServer(srv)
	return srv
}

// decorateReader returns the DecorateReader of a server reading s.
func (p *Protection) decorateReader(s *heldSocket) dns.DecorateReader {
	return func(r dns.Reader) dns.Reader {
		lr := newLimitReader(r, p.handler, func(b []byte, src netip.AddrPort) bool {
			if s.kernel.Load() {
				return true
			}
			return p.handler.allowRaw(p.goLimiter(), b, src)
		})
		p.mu.Lock()
		s.reader.Store(true)
		p.refresh()
		p.mu.Unlock()
		return lr
	}
}

// AddUDP protects another UDP socket with the same limits (another member of a
// SO_REUSEPORT group, or the other address family; the first one for a Protection
// of NewProtection) and returns its dns.Server. When the kernel filter cannot be put
// on the socket, the server holds it to the request limits in Go and AddUDP returns
// the server together with the error; a socket that cannot be protected at all (not
// an open UDP socket) is only an error.
func (p *Protection) AddUDP(conn *net.UDPConn) (*dns.Server, error) {
	soft, err := p.hold(conn)
	if err != nil {
		return nil, err
	}
	return p.udpServer(conn), soft
}

// tcpReadTimeout bounds how long a TCP client may take to send a query.
const tcpReadTimeout = 5 * time.Second

// TCPServer returns a dns.Server for l, with the connection limits and
// Handler.ConfigureServer applied, ready for ActivateAndServe.
func (p *Protection) TCPServer(l net.Listener) *dns.Server {
	per := p.opts.tcpPerConn
	if per == 0 {
		per = tcplimit.DefaultConnsPerClient
	}
	srv := &dns.Server{Handler: p.handler, ReadTimeout: tcpReadTimeout}
	if !isNil(l) { // else ActivateAndServe fails with miekg/dns's "bad listeners"
		t := tcplimit.LimitListener(l, per)
		p.mu.Lock()
		p.tcp = append(p.tcp, t)
		p.mu.Unlock()
		srv.Listener = t
	}
	p.handler.ConfigureServer(srv)
	return srv
}

// TCPLimiters returns the connection limiters of the listeners given to TCPServer.
func (p *Protection) TCPLimiters() []*tcplimit.Listener {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*tcplimit.Listener(nil), p.tcp...)
}

// Update applies cfg to every layer at once, keeping the response accounts, the
// request limiter's sketches and the kernel filter's state: limits, levels,
// slip-ratio, window, exemptions and report-only change for the next query. cfg is
// checked before anything changes, and the kernel filter, the only layer that can
// still fail, is updated first (all or nothing); so on error nothing has changed.
// fresh reports that the response accounts started afresh (see RRL.Update). A pinned
// filter's limits are the pins': Update writes them for every process attached
// (which needs write access to the pins). A cookie-secret in cfg replaces the
// cookie secrets, in the Handler and the eBPF filter; without one they stay.
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
		// The secrets reach the filter from p.cookies, below.
		if err := p.filter.Update(cfg.withoutSecrets()); err != nil {
			return false, fmt.Errorf("rrl: update kernel filter: %w", err)
		}
	}
	p.limMu.Lock()
	if l := p.limiter.Load(); l != nil && !p.limGiven {
		if err := l.Update(cfg); err != nil {
			p.limMu.Unlock()
			return false, fmt.Errorf("rrl: update request limiter: %w", err)
		}
	}
	p.limCfg = cfg.clone()
	p.updateCapacity(p.limCfg) // capacity_go.go
	p.limMu.Unlock()
	if fresh, err = p.rrl.Update(cfg); err != nil {
		return false, fmt.Errorf("rrl: update response rate limiting: %w", err)
	}
	p.cfg = cfg.clone()
	p.watch.set(p.cfg.eventFunc, p.cfg.eventsPerSec())
	if cs := cfg.secrets; cs != nil && p.cookies != nil {
		// The secrets reach the eBPF filter through UseCookies' subscription;
		// a pinned filter that had none of this process's gets them now.
		p.cookies.setSecrets(cs.current, cs.previous)
		p.secretChosen = true
		if p.filter != nil && !p.kernelCookies {
			p.useFilterCookies()
		}
	}
	return fresh, nil
}

// Close detaches the kernel filter the Protection holds (see Filter.Close) and
// frees it; a filter a successor took over (AttachLocal) is the successor's and
// stays. Shut the servers down first; the sockets are the servers' to close. Nothing
// the Protection started runs once Close has returned (the capacity controllers,
// the watch of the kernel's limiting events, the timers of the RRL's and the Go
// Limiter's events), except an event function under way, which may be what called
// Close: it returns when the function does.
func (p *Protection) Close() error {
	p.stopCapacity() // capacity_go.go; before the locks: it may wait for the controller
	holders.Lock()
	defer holders.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
	delete(holders.open, p)
	p.stopWatch()
	// Queries a server still drains report their events as they come, but no timer
	// reports any once Close has returned.
	p.rrl.stopEventTicks()
	p.limMu.Lock()
	if l := p.limiter.Load(); l != nil && !p.limGiven {
		l.stopEventTicks()
	}
	p.limMu.Unlock()
	f := p.filter
	if f == nil || holders.m[f] != p {
		return nil
	}
	delete(holders.m, f)
	err := f.Close()
	// Protections still serving the sockets (a predecessor draining its queries)
	// hold them to the Go limits from now on.
	p.remarkAll()
	return err
}

// startCapacity starts the controller of p's Go Limiter l when p's Config has
// capacity on, unless Close has begun; p.limMu is held.
func (p *Protection) startCapacity(l *Limiter) {
	if l == nil || p.limCfg.capacity == 0 || p.capacity != nil || p.capClosed {
		return
	}
	src := &limiterCapacity{l: l}
	src.owner.Store(p)
	p.capSrc = src
	p.capacity = startCapacity(p.limCfg, src, limiterNow)
	l.capacity.Store(p.capacity)
}

// capacitySockets returns the UDP sockets p serves through servers of its own
// (Protect, AddUDP): their receive queues are the ones the controller can read.
func (p *Protection) capacitySockets() []queueSocket {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]queueSocket, 0, len(p.udp))
	for _, c := range p.udp {
		out = append(out, queueSocket{key: c, conn: c})
	}
	return out
}

// updateCapacity follows an Update of p to cfg; p.limMu is held. A controller turned
// off is told to stop, not waited for: it ends at its next sample, and the water
// level it may still set is nothing to a Limiter whose capacity is off. The Go
// Limiter, made when a query first needs it, starts its controller then.
func (p *Protection) updateCapacity(cfg *Config) {
	l := p.limiter.Load()
	switch {
	case l == nil || p.limGiven:
	case p.capacity != nil && cfg.capacity == 0:
		p.capacity.halt()
		l.capacity.Store(nil)
		p.capacity = nil
	case p.capacity != nil:
		p.capacity.update(cfg)
	default:
		p.startCapacity(l)
	}
}

// stopCapacity is Close's part: from now on no controller starts for p, and the one
// running ends; it waits for it unless it is in the event function, which may be
// what called Close (capacityRun.halt). Neither p.mu nor p.limMu may be held: the
// controller reads p's sockets under p.mu.
func (p *Protection) stopCapacity() {
	p.limMu.Lock()
	p.capClosed = true
	r := p.capacity
	p.capacity, p.capSrc = nil, nil
	p.limMu.Unlock()
	r.stopAndWait()
}
