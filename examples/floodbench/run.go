package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/loadgen"
)

// Traffic groups, carried in the top bits of every query's DNS ID so that the
// server tells them apart whatever the source address.
const (
	groupLegit = iota
	groupLegitEDNS
	groupAttack
	numGroups
)

var groupNames = [numGroups]string{"legit", "legit-edns", "attack"}

const idGroupShift = 13

func queryID(group, i int) uint16 { return uint16(group<<idGroupShift | i&(1<<idGroupShift-1)) }

// groupOf returns the traffic group of a received datagram, or -1.
func groupOf(payload []byte) int {
	if len(payload) < 2 {
		return -1
	}
	g := int(binary.BigEndian.Uint16(payload) >> idGroupShift)
	if g >= numGroups {
		return -1
	}
	return g
}

// sender sends a datagram from a given source to the server.
type sender interface {
	Send(src netip.AddrPort, payload []byte) error
	Close() error
}

// rawSender spoofs sources through a raw socket (CAP_NET_RAW).
type rawSender struct {
	*loadgen.RawSender
	dst netip.AddrPort
}

func (r rawSender) Send(src netip.AddrPort, payload []byte) error {
	return r.RawSender.Send(loadgen.Packet(src, r.dst, payload))
}

// goLimiter is the request limiter in Go, for when the eBPF filter may not be loaded.
type goLimiter interface {
	Allow(src netip.AddrPort) bool
}

// env is what every run of one address family shares.
type env struct {
	v6   bool
	raw  bool           // spoofed sources through a raw socket; else bound UDP sockets
	ns   *loadgen.Netns // IPv6 runs inside it
	L    float64
	d    time.Duration
	stop *atomic.Bool // set on interrupt
	// progress is called every 250 ms while a scenario runs, with the time into it
	// and the rate each group was delivered at over the last interval.
	progress func(elapsed, length time.Duration, pps [numGroups]float64)
}

func (e *env) family() string {
	if e.v6 {
		return "ipv6"
	}
	return "ipv4"
}

// inNS runs fn inside the run's namespace, if it has one.
func (e *env) inNS(fn func() error) error {
	if e.ns == nil {
		return fn()
	}
	return e.ns.Do(fn)
}

// server is the protected socket and what it read.
type server struct {
	conn   *net.UDPConn
	addr   netip.AddrPort
	start  time.Time
	lim    goLimiter
	groups [numGroups][]int // delivered per bin
	totals [numGroups]atomic.Int64
	read   uint64 // every datagram read, limited by the Go limiter or not
	goDrop uint64 // refused by the Go limiter
	other  uint64 // not from any group
}

func listen(v6 bool) (*net.UDPConn, error) {
	if v6 {
		return loadgen.Listen("udp6", netip.MustParseAddrPort("[::1]:0"))
	}
	return loadgen.Listen("udp4", netip.MustParseAddrPort("127.0.0.1:0"))
}

// receive reads until stop is closed and then nothing arrives for quiet.
func (s *server) receive(stop <-chan struct{}, quiet, max time.Duration) {
	loadgen.ReadUntil(s.conn, stop, quiet, max, func(b []byte, from netip.AddrPort) {
		at := time.Since(s.start)
		s.read++
		if s.lim != nil && !s.lim.Allow(from) {
			s.goDrop++
			return
		}
		g := groupOf(b)
		if g < 0 {
			s.other++
			return
		}
		add(&s.groups[g], at)
		s.totals[g].Add(1)
	})
}

// run runs one scenario and measures it.
func (e *env) run(sc scenario, newLimiter func(*rrl.Config) (goLimiter, error)) (*Result, error) {
	cfg := rrl.NewConfig()
	if err := cfg.SetValue("requests-per-second", fmt.Sprint(e.L)); err != nil {
		return nil, err
	}
	if sc.totalFactor > 0 {
		if err := cfg.SetValue("total-requests-per-second", fmt.Sprint(sc.totalFactor*e.L)); err != nil {
			return nil, err
		}
	}
	var pool int
	if !e.raw {
		pool = 256 // sockets an unprivileged sender keeps bound for random sources
	}
	src := newSources(e.v6, 1, pool)
	pl := sc.plan(src, e.L, e.d)

	// The server socket, the attack sender and the legitimate clients' sockets are
	// made inside the namespace when there is one.
	srv := &server{}
	var snd sender
	var clients []*net.UDPConn
	defer func() {
		for _, c := range clients {
			c.Close()
		}
		if snd != nil {
			snd.Close()
		}
		if srv.conn != nil {
			srv.conn.Close()
		}
	}()
	err := e.inNS(func() error {
		var err error
		if srv.conn, err = listen(e.v6); err != nil {
			return fmt.Errorf("server socket: %w", err)
		}
		srv.addr = srv.conn.LocalAddr().(*net.UDPAddr).AddrPort()
		if e.raw {
			r, err := loadgen.NewRawSender(srv.addr)
			if err != nil {
				return fmt.Errorf("raw socket: %w", err)
			}
			snd = rawSender{r, srv.addr}
		} else {
			snd = loadgen.NewSocketSender(srv.addr, 1024)
		}
		for i := range legitClients {
			c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src.legit(i), 0)))
			if err != nil {
				return fmt.Errorf("client socket: %w", err)
			}
			clients = append(clients, c)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	f, err := rrl.Attach(srv.conn, cfg)
	mode := "ebpf"
	if errors.Is(err, rrl.ErrNotPermitted) {
		mode = "classic+go"
		if newLimiter == nil {
			f.Close()
			return nil, fmt.Errorf("eBPF not permitted and no Go limiter: %w", err)
		}
		if srv.lim, err = newLimiter(cfg); err != nil {
			f.Close()
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	defer f.Close()

	// Flows: the legitimate clients first, then the attack group's.
	var flows []loadgen.Flow
	var flowGroup []int
	for i, c := range clients {
		local := c.LocalAddr().(*net.UDPAddr).AddrPort()
		g, edns := groupLegit, false
		if i%2 == 1 {
			g, edns = groupLegitEDNS, true
		}
		flows = append(flows, loadgen.Flow{
			Name: groupNames[g], Rate: legitRate(e.L), End: pl.length,
			Src:     func(int) netip.AddrPort { return local },
			Payload: func(n int) []byte { return loadgen.DNSQuery(queryID(g, n), edns) },
		})
		flowGroup = append(flowGroup, g)
	}
	for _, fl := range pl.flows {
		fl.Payload = func(n int) []byte { return loadgen.DNSQuery(queryID(groupAttack, n), false) }
		flows = append(flows, fl)
		flowGroup = append(flowGroup, groupAttack)
	}

	srv.start = time.Now()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		srv.receive(stop, 300*time.Millisecond, pl.length+20*time.Second)
		close(done)
	}()
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		var last [numGroups]int64
		lastAt := time.Duration(0)
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			now := time.Since(srv.start)
			var pps [numGroups]float64
			for g := range pps {
				t := srv.totals[g].Load()
				pps[g] = float64(t-last[g]) / (now - lastAt).Seconds()
				last[g] = t
			}
			lastAt = now
			if e.progress != nil {
				e.progress(now, pl.length, pps)
			}
		}
	}()
	sentAt, sendErr := loadgen.Pace(srv.start, flows, pl.length, 2*time.Millisecond, func(fi int, src netip.AddrPort, payload []byte) error {
		if e.stop.Load() {
			return errInterrupted
		}
		if fi < len(clients) {
			_, err := clients[fi].WriteToUDPAddrPort(payload, srv.addr)
			return err
		}
		return snd.Send(src, payload)
	})
	close(stop)
	<-done
	<-progressDone
	if sendErr != nil {
		return nil, sendErr
	}

	var groups [numGroups]series
	for g := range groups {
		groups[g] = newSeries(pl.length)
		groups[g].Delivered = append(srv.groups[g], make([]int, max(0, len(groups[g].Offered)-len(srv.groups[g])))...)
	}
	for fi, at := range sentAt {
		for _, t := range at {
			add(&groups[flowGroup[fi]].Offered, t)
		}
	}
	drops, err := loadgen.Drops(srv.conn)
	if err != nil {
		return nil, err
	}
	st, err := f.Stats()
	if err != nil {
		return nil, err
	}
	return measure(sc, e, pl, mode, groups, srv, st, uint64(drops)), nil
}

var errInterrupted = errors.New("interrupted")

// measure turns what one run sent and received into its Result.
func measure(sc scenario, e *env, pl plan, mode string, groups [numGroups]series, srv *server, st rrl.FilterStats, drops uint64) *Result {
	r := &Result{
		Scenario: sc.name, Family: e.family(), Mode: mode, Description: sc.desc,
		DurationS: pl.length.Seconds(), LimitPPS: e.L,
		LimitedBy: sc.limitedBy(e.v6), GroupLimitPPS: sc.groupLimit(e.L),
		Read:    srv.read,
		Sources: "raw socket, spoofed",
	}
	if !e.raw {
		r.Sources = "bound UDP sockets"
	}
	if sc.note != "" {
		r.Notes = append(r.Notes, sc.note)
	}
	for g, s := range groups {
		gr := Group{Name: groupNames[g], Legit: g != groupAttack, Offered: s.Offered, Received: s.Delivered}
		for _, v := range s.Offered {
			gr.Sent += v
		}
		for _, v := range s.Delivered {
			gr.Delivered += v
		}
		if gr.Legit {
			r.LegitSent += gr.Sent
			r.LegitDelivered += gr.Delivered
		}
		r.Groups = append(r.Groups, gr)
	}
	if r.LegitSent > 0 {
		r.LegitDeliveryPct = round3(100 * float64(r.LegitDelivered) / float64(r.LegitSent))
	}

	attack := groups[groupAttack]
	if sc.totalFactor > 0 {
		// The total node limits all traffic together.
		attack = series{}
		for _, s := range groups {
			attack.Offered = addBins(attack.Offered, s.Offered)
			attack.Delivered = addBins(attack.Delivered, s.Delivered)
		}
	}
	r.AttackOfferedPPS = round3(rate(groups[groupAttack].Offered, pl.attackStart, pl.attackEnd))
	steadyFrom := min(pl.attackStart+time.Second, pl.attackEnd)
	r.AttackAdmittedPPS = round3(rate(attack.Delivered, steadyFrom, pl.attackEnd))
	if r.LimitedBy != "none" {
		if r.GroupLimitPPS > 0 {
			r.AdmittedX = fptr(round3(r.AttackAdmittedPPS / r.GroupLimitPPS))
		}
		if c, ok := convergence(attack, pl.attackStart, pl.attackEnd, r.GroupLimitPPS); ok {
			r.ConvergeS = fptr(round3(c.Seconds()))
		}
	}
	if pl.releases {
		if c, ok := release(attack, pl.attackEnd, pl.length); ok {
			r.ReleaseS = fptr(round3(c.Seconds()))
		}
	}

	// Every datagram the kernel dropped on arrival was either refused by the filter
	// or lost to a full queue; the eBPF filter counts its refusals, the classic one
	// refuses exactly the attack packets of a stateless scenario.
	var refused uint64
	if mode == "ebpf" {
		r.FilterPassed = st.Passed
		refused = st.Seen - st.Passed
	} else if r.LimitedBy == "stateless" {
		refused = uint64(r.Groups[groupAttack].Sent)
	}
	r.Overflowed = int64(drops) - int64(refused)
	if mode == "ebpf" && st.Passed > srv.read {
		r.Overflowed = max(r.Overflowed, int64(st.Passed-srv.read))
	}
	r.Meaningful = r.Overflowed == 0
	if srv.other > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d datagrams from no traffic group", srv.other))
	}
	r.check(sc.legitWithinLimits, pl.releases)
	return r
}

func addBins(a, b []int) []int {
	out := make([]int, max(len(a), len(b)))
	for i := range out {
		if i < len(a) {
			out[i] += a[i]
		}
		if i < len(b) {
			out[i] += b[i]
		}
	}
	return out
}
