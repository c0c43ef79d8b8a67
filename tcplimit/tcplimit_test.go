package tcplimit

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
)

func TestTCPClientKey(t *testing.T) {
	tests := []struct{ a, b string }{
		{"192.0.2.1", "192.0.2.1/32"},
		{"::ffff:192.0.2.1", "192.0.2.1/32"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"},
		{"2001:db8:1:3::1", "2001:db8:1:3::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		{"::1", "::/64"},
	}
	for _, tt := range tests {
		if got := tcpClientKey(netip.MustParseAddr(tt.a)); got != netip.MustParsePrefix(tt.b) {
			t.Errorf("tcpClientKey(%s) = %v, want %s", tt.a, got, tt.b)
		}
	}
}

// TCP connection helpers shared with other packages' tests.
var (
	acceptLoop     = testutil.AcceptLoop
	dialFrom       = testutil.DialFrom
	expectAccepted = testutil.ExpectAccepted
	expectRefused  = testutil.ExpectRefused
)

func checkStats(t *testing.T, l *Listener, want Stats) {
	t.Helper()
	if got := l.Stats(); got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

func TestTCPLimiterIPv4(t *testing.T) {
	inner, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListener(inner, 2)
	defer l.Close()
	ch := acceptLoop(l)
	a, b := net.IPv4(127, 0, 0, 2), net.IPv4(127, 0, 0, 3)

	sa1 := expectAccepted(t, ch, dialFrom(t, "tcp4", a, l.Addr()))
	expectAccepted(t, ch, dialFrom(t, "tcp4", a, l.Addr()))
	checkStats(t, l, Stats{Accepted: 2, Open: 2, Clients: 1})

	expectRefused(t, ch, "tcp4", a, l.Addr())
	expectRefused(t, ch, "tcp4", a, l.Addr())
	checkStats(t, l, Stats{Accepted: 2, Refused: 2, Open: 2, Clients: 1})

	// Another address has its own allowance.
	sb := expectAccepted(t, ch, dialFrom(t, "tcp4", b, l.Addr()))
	checkStats(t, l, Stats{Accepted: 3, Refused: 2, Open: 3, Clients: 2})

	// Closing twice releases one slot.
	if err := sa1.Close(); err != nil {
		t.Fatal(err)
	}
	sa1.Close()
	checkStats(t, l, Stats{Accepted: 3, Refused: 2, Open: 2, Clients: 2})
	sa3 := expectAccepted(t, ch, dialFrom(t, "tcp4", a, l.Addr()))
	expectRefused(t, ch, "tcp4", a, l.Addr())
	checkStats(t, l, Stats{Accepted: 4, Refused: 3, Open: 3, Clients: 2})

	// The table forgets a client whose last connection closed.
	sb.Close()
	checkStats(t, l, Stats{Accepted: 4, Refused: 3, Open: 2, Clients: 1})

	// The wrapped connection still offers the original.
	if _, ok := sa3.(interface{ NetConn() net.Conn }).NetConn().(*net.TCPConn); !ok {
		t.Errorf("NetConn of %T is not a *net.TCPConn", sa3)
	}

	// Accept returns the wrapped listener's error once it is closed.
	l.Close()
	select {
	case _, ok := <-ch:
		if ok {
			t.Error("Accept returned a connection after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return after Close")
	}
}

func TestTCPLimiterIPv6(t *testing.T) {
	inner, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 on loopback: %v", err)
	}
	l := LimitListener(inner, 1)
	defer l.Close()
	ch := acceptLoop(l)

	s := expectAccepted(t, ch, dialFrom(t, "tcp6", nil, l.Addr()))
	expectRefused(t, ch, "tcp6", nil, l.Addr())
	checkStats(t, l, Stats{Accepted: 1, Refused: 1, Open: 1, Clients: 1})
	s.Close()
	s = expectAccepted(t, ch, dialFrom(t, "tcp6", nil, l.Addr()))
	s.Close()
	checkStats(t, l, Stats{Accepted: 2, Refused: 1, Clients: 0})
}

func TestTCPLimiterDefault(t *testing.T) {
	for _, n := range []int{0, -1} {
		if got := LimitListener(nil, n).limit; got != DefaultConnsPerClient {
			t.Errorf("LimitListener(l, %d) limit %d, want %d", n, got, DefaultConnsPerClient)
		}
	}
}

// TestTCPLimiterNotTCP checks that a listener of another kind passes through.
func TestTCPLimiterNotTCP(t *testing.T) {
	inner, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Skipf("no unix sockets: %v", err)
	}
	l := LimitListener(inner, 1)
	defer l.Close()
	ch := acceptLoop(l)
	for i := 0; i < 3; i++ {
		c, err := net.Dial("unix", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		select {
		case s := <-ch:
			defer s.Close()
		case <-time.After(5 * time.Second):
			t.Fatal("unix connection not accepted")
		}
	}
	checkStats(t, l, Stats{Accepted: 3})
}

// TestTCPLimiterConcurrent dials from several addresses at once and checks, on the
// server side, that no address ever has more than the limit open, and that all
// counters and the table return to rest.
func TestTCPLimiterConcurrent(t *testing.T) {
	const (
		limit   = 3
		sources = 4
	)
	perSource := 12
	if testing.Short() {
		perSource = 6
	}
	inner, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListener(inner, limit)
	defer l.Close()

	var (
		mu       sync.Mutex
		open     = map[string]int{}
		maxOpen  int
		handlers sync.WaitGroup
	)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ip := c.RemoteAddr().(*net.TCPAddr).IP.String()
			mu.Lock()
			open[ip]++
			maxOpen = max(maxOpen, open[ip])
			mu.Unlock()
			handlers.Add(1)
			go func() {
				defer handlers.Done()
				var b [1]byte
				if _, err := io.ReadFull(c, b[:]); err == nil {
					c.Write(b[:])
					io.Copy(io.Discard, c) // until the client closes
				}
				mu.Lock()
				open[ip]--
				mu.Unlock()
				c.Close()
			}()
		}
	}()

	var (
		clients sync.WaitGroup
		smu     sync.Mutex
		nServed = make([]int, sources)
	)
	for s := 0; s < sources; s++ {
		for i := 0; i < perSource; i++ {
			clients.Add(1)
			go func() {
				defer clients.Done()
				d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(10+s))}}
				c, err := d.Dial("tcp4", l.Addr().String())
				if errors.Is(err, syscall.ECONNRESET) {
					return // refused before connect returned
				} else if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				var b [1]byte
				if _, err := c.Write([]byte{7}); err != nil {
					return // refused before the write
				}
				if _, err := io.ReadFull(c, b[:]); err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						t.Errorf("source %d: neither served nor refused", s)
					}
					return // refused
				}
				smu.Lock()
				nServed[s]++
				smu.Unlock()
				time.Sleep(time.Millisecond) // hold the slot a little
			}()
		}
	}
	clients.Wait()
	// Every client has closed; the handlers see EOF and close their side.
	handlers.Wait()

	st := l.Stats()
	total := 0
	for s, n := range nServed {
		if n == 0 {
			t.Errorf("source %d never served", s)
		}
		total += n
	}
	if maxOpen > limit {
		t.Errorf("a source had %d connections open at once, limit %d", maxOpen, limit)
	}
	if st.Accepted != uint64(total) || st.Accepted+st.Refused != uint64(sources*perSource) {
		t.Errorf("stats %+v: served %d of %d dials", st, total, sources*perSource)
	}
	if st.Open != 0 || st.Clients != 0 {
		t.Errorf("stats %+v after every connection closed, want no open connection and an empty table", st)
	}
}

// TestTCPLimiterDNSServer runs a miekg/dns server on the limiter: a client holding
// its one allowed connection is answered, a second connection from the same address
// is refused, and the slot comes back when the first closes.
func TestTCPLimiterDNSServer(t *testing.T) {
	inner, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := LimitListener(inner, 1)
	started := make(chan struct{})
	srv := &dns.Server{
		Listener: l,
		Net:      "tcp",
		Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
			m := new(dns.Msg)
			m.SetReply(r)
			w.WriteMsg(m)
		}),
		NotifyStartedFunc: func() { close(started) },
	}
	served := make(chan error, 1)
	go func() { served <- srv.ActivateAndServe() }()
	<-started
	defer func() {
		srv.Shutdown()
		<-served
	}()

	client := &dns.Client{Net: "tcp", Timeout: 5 * time.Second}
	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	held, err := client.Dial(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := client.ExchangeWithConn(q, held); err != nil {
		t.Fatalf("first connection: %v", err)
	}
	if _, _, err := client.Exchange(q, l.Addr().String()); err == nil {
		t.Fatal("second connection from the same address was answered")
	}
	if _, _, err := client.ExchangeWithConn(q, held); err != nil {
		t.Fatalf("first connection after the refusal: %v", err)
	}
	held.Close()
	// The server notices the close and releases the slot.
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Open != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("slot not released: %+v", l.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	if _, _, err := client.Exchange(q, l.Addr().String()); err != nil {
		t.Fatalf("after the first connection closed: %v", err)
	}
	if st := l.Stats(); st.Accepted != 2 || st.Refused != 1 {
		t.Errorf("stats %+v, want 2 accepted and 1 refused", st)
	}
}

func listenTCP(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}
