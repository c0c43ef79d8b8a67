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

	"github.com/miekg/dns"
)

// serve runs srv (given its PacketConn or Listener) until the test ends, returning
// once it is ready.
func serve(t testing.TB, srv *dns.Server) {
	t.Helper()
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	errc := make(chan error, 1)
	go func() { errc <- srv.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-errc:
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown() })
}

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

func TestLimitReaderReusesBuffer(t *testing.T) {
	// A flood the Limiter refuses costs the server no read buffers: a refused
	// datagram's buffer takes the next one. The server's buffers are 4 KiB here,
	// so one per refused packet would show as 4 KiB allocated per packet.
	if handlerRace {
		t.Skip("the race detector allocates")
	}
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
	serve(t, &dns.Server{PacketConn: pc, Handler: NewHandler(inner, NewRRL(NewConfig())),
		UDPSize: udpSize, DecorateReader: LimitReader(lim)})
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
	limited0 := lim.Stats().Limited
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
	dropped := lim.Stats().Limited - limited0
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
	serve(t, &dns.Server{PacketConn: pc, Handler: h})
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
