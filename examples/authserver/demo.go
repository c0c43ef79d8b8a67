package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/dnscookie"
	"github.com/dnsrake/rrl/internal/loadgen"
	"github.com/dnsrake/rrl/internal/sockopt"
	"github.com/miekg/dns"
)

// The demo's address plan on loopback: legitimate resolvers each in a /16 of
// their own (127.10.0.1, 127.11.0.1, ...), the flood's victim network apart.
var (
	victimNet  = netip.MustParsePrefix("127.66.0.0/24")
	floodQName = "big.example.test."
)

func legitSource(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, byte(10 + i), 0, 1}) }

// Resolvers inside the victim network (127.66.0.201 ...) that send the server
// cookies they learned: the flood's spoofed sources (127.66.0.1 to .200) cannot.
const (
	netResolvers     = 3
	netResolverFirst = 201
)

func netResolverSource(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{127, 66, 0, byte(netResolverFirst + i)})
}

// demoOptions shape the demo traffic.
type demoOptions struct {
	duration  time.Duration
	floodRate float64   // packets per second
	clients   int       // legitimate resolvers
	progress  io.Writer // the progress; nil for none
}

// legitRate is each legitimate resolver's queries per second, spread over eight
// questions: about 2.5 per second per response account, half the demo's
// responses-per-second.
const legitRate = 20

// demoResult is what the demo measured.
type demoResult struct {
	duration time.Duration
	mode     rrl.FilterMode
	raw      bool // the flood was spoofed with raw sockets

	legitSent, legitAnswered, legitTCP int64 // queries, answered (by any try), over TCP after a slip

	netRun               bool  // resolvers inside the victim network ran (server cookies on)
	netSent, netAnswered int64 // their queries, and those answered

	floodSent                               int64 // flood packets sent
	limiterDropped                          int64 // dropped in the kernel (eBPF) or by the Go request limiter
	floodReached                            int64 // flood queries that reached the RRL
	queueOverflows                          int64 // packets the server's receive queue had no room for
	floodAnswered, floodSlipped, floodDrops int64 // what RRL made of them
	floodBytesIn, floodBytesOut             int64 // query bytes, response bytes to the victim
}

// runDemo sends the demo traffic to srv for o.duration (or until ctx ends) and
// returns the counts.
func runDemo(ctx context.Context, srv *server, o demoOptions) (*demoResult, error) {
	if srv.observer == nil {
		return nil, errors.New("server not observing")
	}
	server := netip.MustParseAddrPort(srv.addr)
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	res := &demoResult{mode: rrl.ModeNone}
	if srv.filter != nil {
		res.mode = srv.filter.Mode()
	}

	flood, err := newFlooder(server)
	if err != nil {
		return nil, err
	}
	defer flood.close()
	res.raw = flood.raw != nil

	var wg sync.WaitGroup
	var legit, inNet legitCounters
	// Resolvers inside the victim network show what a server cookie is worth: the
	// request limits judge them at their own address, in the kernel filter or in Go.
	// They learn theirs before the flood, as resolvers that talk to the server
	// already hold one.
	var jars []*cookieJar
	if srv.protection != nil && srv.protection.Status().Cookies {
		res.netRun = true
		for i := range netResolvers {
			jar, err := learnCookie(netResolverSource(i), server)
			if err != nil {
				return nil, fmt.Errorf("resolver %s: %w", netResolverSource(i), err)
			}
			jars = append(jars, jar)
		}
	}
	start := time.Now()
	for i := range o.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resolver(ctx, legitSource(i), nil, server, &legit)
		}()
	}
	for i, jar := range jars {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resolver(ctx, netResolverSource(i), jar, server, &inNet)
		}()
	}
	floodErr := make(chan error, 1)
	go func() { floodErr <- flood.run(ctx, o.floodRate, start) }()

	// A terminal gets one line, redrawn four times a second; a file or a pipe a line
	// every second, so that a log of the run holds no carriage returns.
	tty := isTerminal(o.progress)
	period, end := time.Second, "\n"
	if tty {
		period, end = 250*time.Millisecond, "   "
	}
	tick := time.NewTicker(period)
	defer tick.Stop()
	progress := func() {
		if o.progress == nil {
			return
		}
		r := srv.snapshot(res.mode)
		if tty {
			fmt.Fprint(o.progress, "\r")
		}
		fmt.Fprintf(o.progress, "%5.1fs  legitimate answered %d of %d   flood %d sent: %d %s, %d answered, %d slipped, %d not answered%s",
			time.Since(start).Seconds(), legit.answered.Load(), legit.sent.Load(),
			flood.sent.Load(), r.limiterDropped, droppedWhere(res.mode), r.floodAnswered, r.floodSlipped, r.floodDrops, end)
	}
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
			progress()
		}
	}
	wg.Wait()
	err = <-floodErr
	res.duration = time.Since(start)
	// Let the last packets in flight be read before counting.
	srv.observer.quiesce(200 * time.Millisecond)
	progress()
	if o.progress != nil && tty {
		fmt.Fprintln(o.progress)
	}
	if err != nil {
		return nil, fmt.Errorf("flood: %w", err)
	}
	snap := srv.snapshot(res.mode)
	res.limiterDropped = snap.limiterDropped
	res.queueOverflows = snap.queueOverflows
	res.floodReached, res.floodAnswered, res.floodSlipped, res.floodDrops = snap.floodReached, snap.floodAnswered, snap.floodSlipped, snap.floodDrops
	res.floodBytesOut = snap.floodBytesOut
	res.floodSent = flood.sent.Load()
	res.floodBytesIn = res.floodSent * int64(len(flood.query))
	res.legitSent, res.legitAnswered, res.legitTCP = legit.sent.Load(), legit.answered.Load(), legit.tcp.Load()
	res.netSent, res.netAnswered = inNet.sent.Load(), inNet.answered.Load()
	return res, nil
}

// snapshot reads the server's counters for the demo.
func (s *server) snapshot(mode rrl.FilterMode) demoResult {
	var r demoResult
	o := s.observer
	r.floodReached, r.floodAnswered, r.floodSlipped = o.reachedRRL.Load(), o.answered.Load(), o.slipped.Load()
	r.floodDrops = r.floodReached - r.floodAnswered - r.floodSlipped
	r.floodBytesOut = o.bytesOut.Load()
	var filtered int64 // what a filter on the socket dropped: the socket counts those as drops too
	if mode == rrl.ModeEBPF {
		if st, err := s.filter.Stats(); err == nil {
			r.limiterDropped = int64(st.Dropped())
			filtered = r.limiterDropped
		}
	} else if s.limiter != nil {
		// Nearly all from the flood: the legitimate resolvers are far under
		// their limits (the table's answered row shows it).
		r.limiterDropped = int64(s.limiter.Stats().Dropped())
	}
	// The socket's drop count holds the packets its filter refused and those that
	// found the receive queue full (a server that falls behind, as on a loaded
	// machine); the demo's queries are all DNS, so the classic prefilter refuses none.
	if s.udp != nil {
		if _, _, drops, err := sockopt.ReceiveQueue(s.udp); err == nil {
			r.queueOverflows = max(0, int64(drops)-filtered)
		}
	}
	return r
}

// print writes the report table.
func (r *demoResult) print(w io.Writer, cfg *rrl.Config) {
	pct := func(n, of int64) string {
		if of == 0 {
			return ""
		}
		return fmt.Sprintf("%7.2f%%", 100*float64(n)/float64(of))
	}
	row := func(label string, n, of int64) {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %-44s %9d %s", label, n, pct(n, of)), " "))
	}
	settings := map[string]string{}
	for _, kv := range cfg.Values() {
		settings[kv[0]] = kv[1]
	}
	fmt.Fprintf(w, "\nrrl demo, %.1f s: responses-per-second %s, slip-ratio %s, requests-per-second %s\n",
		r.duration.Seconds(), settings["responses-per-second"], settings["slip-ratio"], settings["requests-per-second"])
	fmt.Fprintf(w, "\nlegitimate resolvers (127.10.0.1, 127.11.0.1, ...)\n")
	row("queries sent", r.legitSent, 0)
	row("answered", r.legitAnswered, r.legitSent)
	if r.legitTCP > 0 {
		row("  of them over TCP after a truncated response", r.legitTCP, 0)
	}
	if r.netRun {
		fmt.Fprintf(w, "\nresolvers inside the flooded network with server cookies (%s to %s)\n", netResolverSource(0), netResolverSource(netResolvers-1))
		row("cookie queries sent", r.netSent, 0)
		row("cookie queries answered", r.netAnswered, r.netSent)
	}
	fmt.Fprintf(w, "\namplification flood from %s: %s TXT\n", victimNet, floodQName)
	how := "spoofed, raw socket"
	if !r.raw {
		how = "from bound sockets: not root"
	}
	row("packets sent ("+how+")", r.floodSent, 0)
	if r.mode == rrl.ModeEBPF {
		row("dropped in the kernel (eBPF request limiter)", r.limiterDropped, r.floodSent)
	} else {
		row("dropped by the Go request limiter", r.limiterDropped, r.floodSent)
	}
	row("reached response rate limiting", r.floodReached, r.floodSent)
	if r.queueOverflows > 0 {
		row("lost: the server's receive queue was full", r.queueOverflows, r.floodSent)
	}
	row("  answered in full (Send)", r.floodAnswered, r.floodSent)
	row("  slipped: truncated, TC=1 (Slip)", r.floodSlipped, r.floodSent)
	row("  not answered (Drop)", r.floodDrops, r.floodSent)
	if r.floodSent == 0 {
		return
	}
	unprotected := float64(bigResponseSize()) / float64(r.floodBytesIn/r.floodSent)
	reflected := float64(r.floodBytesOut) / float64(r.floodBytesIn)
	fmt.Fprintf(w, "\nthe victim received %d bytes for the %d sent in its name: %.3fx (unprotected: %.1fx)\n",
		r.floodBytesOut, r.floodBytesIn, reflected, unprotected)

	// The run in the words of the README.
	answered := fmt.Sprintf("%d of %d legitimate queries answered", r.legitAnswered, r.legitSent)
	if r.legitAnswered == r.legitSent {
		answered = fmt.Sprintf("every legitimate query answered (%d)", r.legitSent)
	}
	fmt.Fprintf(w, "\n%s, %.1f%% of the flood %s, the victim receiving %.3fx the bytes sent in its name (%.0fx unprotected)\n",
		answered, 100*float64(r.limiterDropped)/float64(r.floodSent), droppedWhere(r.mode), reflected, unprotected)
}

// droppedWhere says where the request limiter drops in mode.
func droppedWhere(mode rrl.FilterMode) string {
	if mode == rrl.ModeEBPF {
		return "dropped in the kernel"
	}
	return "dropped by the Go request limiter"
}

// bigResponseSize is the size of the full answer the flood asks for.
func bigResponseSize() int {
	z, err := loadZone(strings.NewReader(demoZone), "", "")
	if err != nil {
		return 0
	}
	m, _ := z.answer(floodQuery(0))
	m.SetEdns0(ednsPayload, false)
	return m.Len()
}

// floodQuery is the flood's question, with EDNS for a large answer.
func floodQuery(id uint16) *dns.Msg {
	q := new(dns.Msg)
	q.SetQuestion(floodQName, dns.TypeTXT)
	q.Id = id
	q.RecursionDesired = false
	q.SetEdns0(4096, false)
	return q
}

// legitCounters count the legitimate resolvers' queries.
type legitCounters struct{ sent, answered, tcp atomic.Int64 }

// legitQuestions are what a resolver asks, in turn: every kind of response.
var legitQuestions = []struct {
	name  string
	qtype uint16
	rcode int
}{
	{"www.example.test.", dns.TypeA, dns.RcodeSuccess},
	{"www.example.test.", dns.TypeAAAA, dns.RcodeSuccess},
	{"example.test.", dns.TypeMX, dns.RcodeSuccess},
	{"text.example.test.", dns.TypeA, dns.RcodeSuccess}, // NODATA
	{"%d.nx.example.test.", dns.TypeA, dns.RcodeNameError},
	{"%d.wild.example.test.", dns.TypeA, dns.RcodeSuccess},
	{"host%d.sub.example.test.", dns.TypeA, dns.RcodeSuccess}, // referral
	{"mail.example.test.", dns.TypeA, dns.RcodeSuccess},
}

// resolver is a legitimate resolver at src: legitRate queries per second, each from a
// fresh source port as resolvers do, with up to three tries of one second, and over
// TCP when a response comes back truncated; with a jar, each carries the server
// cookie it holds, and it keeps the one each answer brings.
func resolver(ctx context.Context, src netip.Addr, jar *cookieJar, server netip.AddrPort, c *legitCounters) {
	udp := &dns.Client{Net: "udp", Timeout: time.Second, UDPSize: ednsPayload,
		Dialer: &net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}}
	tcp := &dns.Client{Net: "tcp", Timeout: 2 * time.Second,
		Dialer: &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}}
	t := time.NewTicker(time.Second / legitRate)
	defer t.Stop()
	// Start at a random point of the question list, so the resolvers do not ask
	// in step.
	n := rand.IntN(len(legitQuestions))
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lq := legitQuestions[n%len(legitQuestions)]
		name := lq.name
		if strings.Contains(name, "%d") {
			name = fmt.Sprintf(name, rand.Uint32())
		}
		n++
		q := new(dns.Msg)
		q.SetQuestion(name, lq.qtype)
		q.RecursionDesired = false
		q.SetEdns0(ednsPayload, false)
		if jar != nil {
			dnscookie.Set(q, jar.get())
		}
		c.sent.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ask(udp, tcp, q, server, lq.rcode, c, jar) {
				c.answered.Add(1)
			}
		}()
	}
}

// ask sends q until it gets the response with rcode, retrying over TCP after a
// truncated one.
func ask(udp, tcp *dns.Client, q *dns.Msg, server netip.AddrPort, rcode int, c *legitCounters, jar *cookieJar) bool {
	for range 3 {
		r, _, err := udp.Exchange(q, server.String())
		if err != nil {
			continue // a timeout: try again, as a resolver does
		}
		jar.learn(r)
		if r.Truncated {
			c.tcp.Add(1)
			r, _, err = tcp.Exchange(q, server.String())
			if err != nil {
				continue
			}
		}
		return r.Rcode == rcode && (len(r.Answer) > 0 || len(r.Ns) > 0)
	}
	return false
}

// cookieJar holds a resolver's full cookie (client and server cookie).
type cookieJar struct {
	mu     sync.Mutex
	cookie []byte
}

func (j *cookieJar) get() []byte {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.cookie
}

// learn keeps the cookie of answer r, if it brings a full one.
func (j *cookieJar) learn(r *dns.Msg) {
	if j == nil {
		return
	}
	if c, ok := dnscookie.FromMsg(r); ok && len(c) == dnscookie.Len {
		j.mu.Lock()
		j.cookie = c
		j.mu.Unlock()
	}
}

// learnCookie asks the server once from src with a client cookie and returns the
// jar holding the full cookie of its answer.
func learnCookie(src netip.Addr, server netip.AddrPort) (*cookieJar, error) {
	udp := &dns.Client{Net: "udp", Timeout: time.Second, UDPSize: ednsPayload,
		Dialer: &net.Dialer{LocalAddr: net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}}
	jar := &cookieJar{cookie: []byte{0xc0, 0x0c, 0x1e, 0, 0, 0, 0, byte(src.As4()[3])}}
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	q.SetEdns0(ednsPayload, false)
	dnscookie.Set(q, jar.cookie)
	for range 3 {
		if r, _, err := udp.Exchange(q, server.String()); err == nil {
			jar.learn(r)
			if len(jar.get()) == dnscookie.Len {
				return jar, nil
			}
		}
	}
	return nil, errors.New("no server cookie in the answers")
}

// flooder sends the spoofed flood: from a raw socket when it may open one, else
// from UDP sockets bound to addresses of the victim network.
type flooder struct {
	server netip.AddrPort
	raw    *loadgen.RawSender
	conns  []*net.UDPConn
	query  []byte
	sent   atomic.Int64
}

func newFlooder(server netip.AddrPort) (*flooder, error) {
	q, err := floodQuery(0).Pack()
	if err != nil {
		return nil, err
	}
	f := &flooder{server: server, query: q}
	if raw, err := loadgen.NewRawSender(server); err == nil {
		f.raw = raw
		return f, nil
	}
	for i := 1; i <= 32; i++ {
		a := netip.AddrFrom4([4]byte{127, 66, 0, byte(i)})
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 0)))
		if err != nil {
			f.close()
			return nil, err
		}
		c.SetReadBuffer(4096) // responses to the "victim" are not read
		f.conns = append(f.conns, c)
	}
	return f, nil
}

// run sends at rate packets per second until ctx ends.
func (f *flooder) run(ctx context.Context, rate float64, start time.Time) error {
	if rate <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	var id uint16
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		due := int64(rate*time.Since(start).Seconds()) - f.sent.Load()
		for ; due > 0; due-- {
			id++
			f.query[0], f.query[1] = byte(id>>8), byte(id)
			var err error
			if f.raw != nil {
				host := victimNet.Addr().As4()
				host[3] = byte(1 + rand.IntN(netResolverFirst-1)) // not the network's resolvers
				src := netip.AddrPortFrom(netip.AddrFrom4(host), uint16(1024+rand.IntN(64512)))
				err = f.raw.Send(loadgen.IPv4Packet(src, f.server, nil, f.query))
			} else {
				_, err = f.conns[int(id)%len(f.conns)].WriteToUDPAddrPort(f.query, f.server)
			}
			if err != nil {
				if errors.Is(err, syscall.ENOBUFS) {
					continue // the local queue is full: this packet is lost, as on a wire
				}
				return err
			}
			f.sent.Add(1)
		}
	}
}

func (f *flooder) close() {
	if f.raw != nil {
		f.raw.Close()
	}
	for _, c := range f.conns {
		c.Close()
	}
}

// observer sits in front of the rrl.Handler in the demo and sees what it does with
// each flood query: written in full, slipped, or nothing. Its inner side, between
// the rrl.Handler and the zone, counts the flood queries that reached response rate
// limiting (all that reach the Handler: the Go request limiter, when in use, drops
// its share in the server's reader, before the Handler).
type observer struct {
	next, zone                  dns.Handler
	reached, reachedRRL         atomic.Int64
	answered, slipped, bytesOut atomic.Int64
	last                        atomic.Int64 // time of the last query, UnixNano
}

// inner returns the handler to put between the rrl.Handler and the zone.
func (o *observer) inner(zone dns.Handler) dns.Handler {
	o.zone = zone
	return dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		if fromVictim(w) {
			o.reachedRRL.Add(1)
		}
		o.zone.ServeDNS(w, req)
	})
}

func fromVictim(w dns.ResponseWriter) bool {
	src, ok := w.RemoteAddr().(*net.UDPAddr)
	if !ok {
		return false
	}
	a := src.AddrPort().Addr().Unmap()
	// The network's resolvers (.201 and up) are not the flood.
	return victimNet.Contains(a) && a.As4()[3] < netResolverFirst
}

func (o *observer) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	o.last.Store(time.Now().UnixNano())
	if !fromVictim(w) {
		o.next.ServeDNS(w, req)
		return
	}
	ow := &observedWriter{ResponseWriter: w}
	o.next.ServeDNS(ow, req)
	switch {
	case ow.msg == nil:
	case ow.msg.Truncated || ow.msg.Rcode == dns.RcodeBadCookie:
		o.slipped.Add(1)
	default:
		o.answered.Add(1)
	}
	o.bytesOut.Add(int64(ow.n))
}

// quiesce waits until no query has arrived for d (at most 10 d).
func (o *observer) quiesce(d time.Duration) {
	for deadline := time.Now().Add(10 * d); time.Now().Before(deadline); {
		if time.Since(time.Unix(0, o.last.Load())) >= d {
			return
		}
		time.Sleep(d / 4)
	}
}

// observedWriter records the message written and its size.
type observedWriter struct {
	dns.ResponseWriter
	msg *dns.Msg
	n   int
}

func (w *observedWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	w.msg = m
	w.n, err = w.ResponseWriter.Write(b)
	return err
}

func (w *observedWriter) Write(b []byte) (int, error) {
	m := new(dns.Msg)
	if m.Unpack(b) == nil {
		w.msg = m
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += n
	return n, err
}
