package rrl

import (
	"errors"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/dnsrake/rrl/tcplimit"
	"github.com/miekg/dns"
)

func listenUDP(t testing.TB) *net.UDPConn {
	t.Helper()
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	pc.SetReadBuffer(4 << 20)
	return pc
}

func listenTCP(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// packetConn hides that its PacketConn is a *net.UDPConn, so that miekg/dns reads
// it with ReadPacketConn.
type packetConn struct{ net.PacketConn }

func TestLimitReaderReusesBuffer(t *testing.T) {
	// A flood the Limiter refuses costs the server no read buffers: a refused
	// datagram's buffer takes the next one. The server's buffers are 4 KiB here,
	// so one per refused packet would show as 4 KiB allocated per packet.
	if raceDetector {
		t.Skip("the race detector allocates")
	}
	for _, generic := range []bool{false, true} {
		name := "UDPConn"
		if generic {
			name = "PacketConn"
		}
		t.Run(name, func(t *testing.T) { testLimitReaderReusesBuffer(t, generic) })
	}
}

func testLimitReaderReusesBuffer(t *testing.T, generic bool) {
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", "10"); err != nil {
		t.Fatal(err)
	}
	lim, err := NewLimiter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const udpSize = 4096
	inner := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		w.WriteMsg(m)
	})
	pc := listenUDP(t)
	var conn net.PacketConn = pc
	if generic {
		conn = packetConn{pc}
	}
	testutil.Serve(t, &dns.Server{PacketConn: conn, Handler: NewHandler(inner, NewRRL(NewConfig())),
		UDPSize: udpSize, DecorateReader: decorateLimit(lim)})
	flood, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 99, 0, 4)}, pc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	q, _ := query("www.example.test.", dns.TypeA, false).Pack()
	// Warm up: the limit is reached, the server's pool holds a buffer.
	wait := func(n uint64) {
		for deadline := time.Now().Add(10 * time.Second); judged(lim) < n && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if judged(lim) < n {
			t.Fatalf("the server judged %d of %d packets", judged(lim), n)
		}
	}
	for range 100 {
		flood.Write(q)
	}
	wait(100)
	runtime.GC()
	var before, after runtime.MemStats
	limited0 := lim.Stats().limited()
	runtime.ReadMemStats(&before)
	const n = 2000
	for i := range n {
		flood.Write(q)
		if i%256 == 255 {
			time.Sleep(2 * time.Millisecond) // the queue stays far below the socket buffer
		}
	}
	wait(100 + n)
	runtime.ReadMemStats(&after)
	dropped := lim.Stats().limited() - limited0
	if dropped < n*9/10 {
		t.Fatalf("only %d of %d flood packets refused", dropped, n)
	}
	perPacket := float64(after.TotalAlloc-before.TotalAlloc) / float64(dropped)
	t.Logf("%.0f bytes and %.2f allocations per refused packet", perPacket,
		float64(after.Mallocs-before.Mallocs)/float64(dropped))
	if perPacket >= udpSize/4 {
		t.Errorf("%.0f bytes allocated per refused packet: the read buffers (%d bytes) are lost", perPacket, udpSize)
	}
}

func TestHandlerLateWrite(t *testing.T) {
	// An inner handler that keeps the ResponseWriter and writes after ServeDNS
	// returned gets ErrLateWrite, while other queries are served through the
	// same pooled writers: none of its messages reaches another client.
	late := make(chan dns.ResponseWriter, 1)
	inner := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		if req.Question[0].Name == "late.example.test." {
			late <- w
			return // without writing
		}
		m := new(dns.Msg)
		m.SetReply(req)
		m.Answer = append(m.Answer, mustRR(req.Question[0].Name+" 300 IN A 192.0.2.1"))
		w.WriteMsg(m)
	})
	h := NewHandler(inner, NewRRL(NewConfig()))
	pc := listenUDP(t)
	testutil.Serve(t, &dns.Server{PacketConn: pc, Handler: h})
	addr := pc.LocalAddr().String()

	if r := exchange(t, "udp", addr, query("late.example.test.", dns.TypeA, false), silenceWait); r != nil {
		t.Fatalf("answer to a query the handler did not answer: %v", r)
	}
	w := <-late
	// The late writer writes as fast as it can while other clients ask.
	stop := make(chan struct{})
	var lateErrs, lateOK atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		m := new(dns.Msg)
		m.SetQuestion("late.example.test.", dns.TypeA)
		m.Response = true
		m.Answer = append(m.Answer, mustRR("late.example.test. 300 IN A 198.51.100.66"))
		for {
			select {
			case <-stop:
				return
			default:
			}
			m.Id = uint16(rand.Uint32())
			err := w.WriteMsg(m)
			if _, err2 := w.Write([]byte{1, 2, 3}); err2 == nil {
				err = nil
			}
			if errors.Is(err, ErrLateWrite) {
				lateErrs.Add(1)
			} else {
				lateOK.Add(1)
			}
			_ = w.RemoteAddr().String() // must not panic
			runtime.Gosched()
		}
	}()
	var clients sync.WaitGroup
	for i := range 4 {
		clients.Add(1)
		go func() {
			defer clients.Done()
			c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 98, 0, byte(1+i))}, pc.LocalAddr().(*net.UDPAddr))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			buf := make([]byte, 1500)
			for j := range 100 {
				name := "q" + string(rune('a'+i)) + string(rune('a'+j%26)) + ".example.test."
				q := query(name, dns.TypeA, false)
				b, _ := q.Pack()
				c.Write(b)
				// Read every datagram until this query's answer: a stray one
				// from the late writer would show up here.
				for {
					c.SetReadDeadline(time.Now().Add(answerWait))
					n, err := c.Read(buf)
					if err != nil {
						t.Errorf("client %d query %d: %v", i, j, err)
						return
					}
					r := new(dns.Msg)
					if err := r.Unpack(buf[:n]); err != nil || len(r.Question) != 1 || r.Question[0].Name != name || r.Id != q.Id {
						t.Errorf("client %d got a message that is not its answer: %v %v", i, err, r)
						return
					}
					break
				}
			}
		}()
	}
	clients.Wait()
	close(stop)
	wg.Wait()
	if lateOK.Load() != 0 || lateErrs.Load() == 0 {
		t.Errorf("late writes: %d succeeded, %d failed with ErrLateWrite; want none and some", lateOK.Load(), lateErrs.Load())
	}
}

// malformedFamily is a query miekg/dns answers (or ignores) by itself before any
// handler runs, and the reason ConfigureServer counts it under.
type malformedFamily struct {
	name   string
	reason malformedReason
	b      []byte
}

func malformedFamilies(t testing.TB) []malformedFamily {
	t.Helper()
	hdr := func(id uint16, flags uint16, qd, an, ns, ar uint16) []byte {
		return []byte{byte(id >> 8), byte(id), byte(flags >> 8), byte(flags), byte(qd >> 8), byte(qd),
			byte(an >> 8), byte(an), byte(ns >> 8), byte(ns), byte(ar >> 8), byte(ar)}
	}
	const tc = 1 << 9
	root := []byte{0, 0, 1, 0, 1} // ". IN A"
	two := new(dns.Msg)
	two.SetQuestion("a.example.test.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "b.example.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	twoQ, err := two.Pack()
	if err != nil {
		t.Fatal(err)
	}
	long := hdr(7, 0, 1, 0, 0, 0)
	for range 5 {
		long = append(long, 63)
		for range 63 {
			long = append(long, 'x')
		}
	}
	long = append(long, root...)
	status := query("www.example.test.", dns.TypeA, false)
	status.Opcode = dns.OpcodeStatus
	statusQ, err := status.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return []malformedFamily{
		{"short", malformedShort, []byte{1, 2, 3, 4, 5}},
		{"response", malformedResponse, append(hdr(3, 1<<15, 1, 0, 0, 0), root...)},
		{"qdcount-0", malformedQuestionCount, hdr(4, tc|1<<8, 0, 0, 0, 0)}, // TC and RD set
		{"qdcount-2", malformedQuestionCount, twoQ},
		{"arcount-3", malformedSectionCount, append(hdr(5, 0, 1, 0, 0, 3), root...)},
		{"label-over-63", malformedName, append(hdr(6, tc, 1, 0, 0, 0), 0x40, 'x', 0, 0, 1, 0, 1)}, // label type 01
		{"name-over-255", malformedName, long},
		{"pointer-loop", malformedName, append(hdr(9, 0, 1, 0, 0, 0), 0xc0, 12, 0, 1, 0, 1)},
		{"truncated", malformedTruncated, append(hdr(8, 0, 1, 0, 0, 0), 3, 'w', 'w')},
		{"opcode-status", malformedOpcode, statusQ},
	}
}

func TestConfigureServerMalformed(t *testing.T) {
	// Every family of malformed query, and random bytes, from one address at ten
	// times errors-per-second: the replies stay within the errors allowance (the
	// clock stands still, so it is one second's worth), none has TC set, each
	// query is counted once by its reason, and a good query is answered at once.
	const eps = 5
	r := NewRRL(fixedConfig(t, "errors-per-second", "5", "responses-per-second", "100", "slip-ratio", "1"))
	h := NewHandler(new(handlerZone), r)
	pc := listenUDP(t)
	srv := &dns.Server{PacketConn: pc, Handler: h}
	h.ConfigureServer(srv)
	h.ConfigureServer(srv) // does nothing more: nothing is counted or debited twice
	testutil.Serve(t, srv)

	want := map[malformedReason]uint64{}
	var packets [][]byte
	rng := rand.New(rand.NewPCG(1, 2))
	for len(packets) < 10*eps*2 {
		for _, f := range malformedFamilies(t) {
			packets = append(packets, f.b)
			want[f.reason]++
		}
		g := make([]byte, 12+rng.IntN(60))
		for i := range g {
			g[i] = byte(rng.Uint32())
		}
		g[5] = 1 + byte(rng.IntN(2)) // QDCOUNT 1 or 257: some unpack, some do not
		packets = append(packets, g) // any reason
	}
	c, err := net.DialUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 97, 0, 1)}, pc.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, b := range packets {
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	replies := 0
	buf := make([]byte, 1500)
	for {
		c.SetReadDeadline(time.Now().Add(silenceWait))
		n, err := c.Read(buf)
		if err != nil {
			break
		}
		replies++
		m := new(dns.Msg)
		if err := m.Unpack(buf[:n]); err != nil {
			t.Errorf("reply does not unpack: %v", err)
			continue
		}
		if m.Rcode != dns.RcodeFormatError && m.Rcode != dns.RcodeNotImplemented {
			t.Errorf("reply with rcode %s to a malformed query", dns.RcodeToString[m.Rcode])
		}
		if m.Truncated {
			t.Errorf("error reply with TC set: %v", m)
		}
	}
	t.Logf("%d malformed queries, %d replies", len(packets), replies)
	if replies == 0 || replies > eps {
		t.Errorf("%d replies to %d malformed queries from one address, want 1 to %d (errors-per-second)", replies, len(packets), eps)
	}
	// The good query from the same address is answered at once.
	q := query("www.example.test.", dns.TypeA, false)
	b, _ := q.Pack()
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(answerWait))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("good query not answered: %v", err)
	}
	if m := new(dns.Msg); m.Unpack(buf[:n]) != nil || m.Id != q.Id || len(m.Answer) != 1 {
		t.Fatalf("good query: reply %x", buf[:n])
	}

	st := h.Stats()
	var total uint64
	if len(st.Malformed) != int(malformedLast) {
		t.Errorf("Malformed has %d reasons, want every one of %d: %v", len(st.Malformed), malformedLast, st.Malformed)
	}
	for reason := range malformedLast {
		n := st.Malformed[reason.String()]
		total += n
		if n < want[reason] {
			t.Errorf("Malformed[%v] = %d, want at least %d", reason, n, want[reason])
		}
	}
	if total != uint64(len(packets)) {
		t.Errorf("%d malformed queries counted, %d sent: %v", total, len(packets), st.Malformed)
	}
	if sent := st.Responses[Send][AllowanceError]; sent != uint64(replies) {
		t.Errorf("Responses[Send][Error] = %d, %d replies came", sent, replies)
	}
	if st.Responses[Drop][AllowanceError] == 0 || st.Responses[Slip][AllowanceError] != 0 {
		t.Errorf("error replies: %d dropped, %d slipped; want some dropped, none slipped",
			st.Responses[Drop][AllowanceError], st.Responses[Slip][AllowanceError])
	}
}

func TestHandlerEDNS(t *testing.T) {
	// RFC 6891: an EDNS version above 0 gets BADVERS with the server's OPT record
	// (version 0), two OPT records get FORMERR, and neither copies the query's TC
	// bit. Both are error responses: errors-per-second limits them.
	r := NewRRL(fixedConfig(t, "errors-per-second", "2", "responses-per-second", "100"))
	h := NewHandler(new(handlerZone), r)
	pc := listenUDP(t)
	testutil.Serve(t, &dns.Server{PacketConn: pc, Handler: h})
	addr := pc.LocalAddr().String()

	v1 := func() *dns.Msg {
		q := query("www.example.test.", dns.TypeA, true)
		q.IsEdns0().SetVersion(1)
		q.Truncated = true
		return q
	}
	twoOPT := func() *dns.Msg {
		q := query("www.example.test.", dns.TypeA, true)
		q.Extra = append(q.Extra, &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: 512}})
		q.Truncated = true
		return q
	}
	tests := []struct {
		name    string
		q       *dns.Msg
		rcode   int
		reason  malformedReason
		replied bool
	}{
		{"version-1", v1(), dns.RcodeBadVers, malformedEDNSVersion, true},
		{"two-opt", twoOPT(), dns.RcodeFormatError, malformedOPTCount, true},
		// errors-per-second 2 with the clock standing still: the third error is dropped.
		{"version-1-limited", v1(), 0, malformedEDNSVersion, false},
	}
	for _, tt := range tests {
		wait := answerWait
		if !tt.replied {
			wait = silenceWait
		}
		resp := exchange(t, "udp", addr, tt.q, wait)
		if !tt.replied {
			if resp != nil {
				t.Errorf("%s: reply over the errors allowance: %v", tt.name, resp)
			}
			continue
		}
		if resp == nil {
			t.Fatalf("%s: no reply", tt.name)
		}
		opt := resp.IsEdns0()
		if resp.Rcode != tt.rcode || opt == nil || opt.Version() != 0 || resp.Truncated ||
			len(resp.Answer) != 0 || len(resp.Question) != 1 {
			t.Errorf("%s: reply %v, want rcode %s, an OPT record of version 0, no TC, the question only",
				tt.name, resp, dns.RcodeToString[tt.rcode])
		}
	}
	st := h.Stats()
	if st.Malformed["edns-version"] != 2 || st.Malformed["opt-count"] != 1 ||
		st.Responses[Send][AllowanceError] != 2 || st.Responses[Drop][AllowanceError] != 1 {
		t.Errorf("stats %+v", st)
	}
	// A version 0 query is answered as usual.
	if resp := exchange(t, "udp", addr, query("www.example.test.", dns.TypeA, true), answerWait); resp == nil || len(resp.Answer) != 1 {
		t.Errorf("EDNS 0 query: %v", resp)
	}
}

func TestHandlerTCPLimitedCloses(t *testing.T) {
	// A TCP query refused by requests-per-second closes its connection at once:
	// the client is not left waiting for the idle timeout, and its slot in the
	// TCPLimiter is free again.
	r := NewRRL(fixedConfig(t, "requests-per-second", "1"))
	h := NewHandler(new(handlerZone), r)
	l := tcplimit.LimitListener(listenTCP(t), 1)
	testutil.Serve(t, &dns.Server{Listener: l, Handler: h, IdleTimeout: func() time.Duration { return time.Minute },
		ReadTimeout: time.Minute})
	c, err := net.DialTimeout("tcp", l.Addr().String(), answerWait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := &dns.Conn{Conn: c}
	for i := range 2 {
		if err := conn.WriteMsg(query("www.example.test.", dns.TypeA, false)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(answerWait))
		resp, err := conn.ReadMsg()
		switch {
		case i == 0 && err != nil:
			t.Fatalf("first query: %v", err)
		case i == 1 && err == nil:
			t.Fatalf("second query answered over requests-per-second: %v", resp)
		case i == 1 && testutil.IsTimeout(err):
			t.Fatalf("second query: %v; want the connection closed", err)
		}
	}
	for deadline := time.Now().Add(answerWait); l.Stats().Open != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("slot still held: %+v", l.Stats())
		}
	}
}

func TestConfigureServerHandlerErrors(t *testing.T) {
	// An error reply of the inner handler shaped like miekg/dns's own (FORMERR, no
	// records) is debited once, not again by ConfigureServer's writer, and the TC
	// bit it copied from the query is cleared.
	inner := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeFormatError)
		m.Truncated = req.Truncated
		w.WriteMsg(m)
	})
	r := NewRRL(fixedConfig(t, "errors-per-second", "2"))
	h := NewHandler(inner, r)
	pc := listenUDP(t)
	srv := &dns.Server{PacketConn: pc, Handler: h}
	h.ConfigureServer(srv)
	testutil.Serve(t, srv)
	for i := range 3 {
		q := query("www.example.test.", dns.TypeA, false)
		q.Truncated = true
		wait := answerWait
		if i == 2 {
			wait = silenceWait
		}
		resp := exchange(t, "udp", pc.LocalAddr().String(), q, wait)
		switch {
		case i < 2 && resp == nil:
			t.Fatalf("query %d: no reply within the errors allowance of 2", i)
		case i < 2 && (resp.Rcode != dns.RcodeFormatError || resp.Truncated):
			t.Errorf("query %d: reply %v, want FORMERR without TC", i, resp)
		case i == 2 && resp != nil:
			t.Errorf("query %d: reply over the errors allowance: %v", i, resp)
		}
	}
	if st := r.GetStats(false); st.RPS[AllowanceError] != 3 {
		t.Errorf("%d error debits for 3 replies", st.RPS[AllowanceError])
	}
}

func TestHandlerLateWriteDuringNextQuery(t *testing.T) {
	// The writer of a finished query, used while the next query is being served
	// (from the same pooled state, in all likelihood), fails and writes nothing
	// to the next query's client.
	var kept dns.ResponseWriter
	var lateErr error
	inner := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		if kept == nil {
			kept = w
			return
		}
		m := new(dns.Msg)
		m.SetReply(req)
		lateErr = kept.WriteMsg(m) // the first query's writer, during the second
		w.WriteMsg(m)
	})
	h := NewHandler(inner, NewRRL(NewConfig()))
	first := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5000}}
	second := &fakeWriter{Remote: &net.UDPAddr{IP: net.IPv4(192, 0, 2, 2), Port: 5000}}
	h.ServeDNS(first, query("a.example.test.", dns.TypeA, false))
	h.ServeDNS(second, query("b.example.test.", dns.TypeA, false))
	if !errors.Is(lateErr, ErrLateWrite) {
		t.Errorf("late write: %v, want ErrLateWrite", lateErr)
	}
	if first.Msgs != 0 || second.Msgs != 1 {
		t.Errorf("%d messages to the first client, %d to the second; want 0 and 1", first.Msgs, second.Msgs)
	}
	if a := kept.RemoteAddr(); a == nil || a.String() != "" {
		t.Errorf("RemoteAddr of an ended writer: %v", a)
	}
}

func TestConfigureServerTCP(t *testing.T) {
	// Over TCP, miekg/dns's reply to a malformed query is under requests-per-second
	// like any other: over it the connection is closed.
	r := NewRRL(fixedConfig(t, "requests-per-second", "1"))
	h := NewHandler(new(handlerZone), r)
	l := listenTCP(t)
	srv := &dns.Server{Listener: l, Handler: h, ReadTimeout: time.Minute, IdleTimeout: func() time.Duration { return time.Minute }}
	h.ConfigureServer(srv)
	testutil.Serve(t, srv)
	c, err := net.DialTimeout("tcp", l.Addr().String(), answerWait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	noQuestion := []byte{0, 12, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // length 12, QDCOUNT 0
	buf := make([]byte, 512)
	for i := range 2 {
		if _, err := c.Write(noQuestion); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(answerWait))
		n, err := c.Read(buf)
		switch {
		case i == 0 && err != nil:
			t.Fatalf("first malformed query: %v", err)
		case i == 0 && (n < 2+12 || buf[2+3]&0xf != dns.RcodeFormatError):
			t.Fatalf("first malformed query: reply %x, want FORMERR", buf[:n])
		case i == 1 && err == nil:
			t.Fatalf("second malformed query answered over requests-per-second: %x", buf[:n])
		case i == 1 && testutil.IsTimeout(err):
			t.Fatalf("second malformed query: %v; want the connection closed", err)
		}
	}
	if st := h.Stats(); st.Malformed["question-count"] != 2 || st.Responses[Drop][AllowanceError] != 1 {
		t.Errorf("stats %+v", st)
	}
}
