package rrl_test

import (
	"fmt"
	"net"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// A query without a question, which miekg/dns answers FORMERR by itself before any
// handler runs: with ConfigureServer the reply goes through errors-per-second like
// any other error response, and HandlerStats counts the query by reason.
func ExampleHandler_ConfigureServer() {
	cfg := rrl.NewConfig()
	cfg.SetValue("errors-per-second", "1")
	cfg.SetNowFunc(func() time.Time { return time.Unix(1_750_000_000, 0) }) // no credit earned back
	zone := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		w.WriteMsg(m)
	})
	h := rrl.NewHandler(zone, rrl.NewRRL(cfg))

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	h.ConfigureServer(srv)
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	defer srv.Shutdown()

	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	noQuestion := []byte{0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} // header only, QDCOUNT 0
	buf := make([]byte, 512)
	for range 3 {
		c.Write(noQuestion)
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, err := c.Read(buf); err == nil {
			m := new(dns.Msg)
			m.Unpack(buf[:n])
			fmt.Println(dns.RcodeToString[m.Rcode])
		} else {
			fmt.Println("no reply")
		}
	}
	st := h.Stats()
	fmt.Println(st.Malformed["question-count"], "queries without one question")
	// Output:
	// FORMERR
	// no reply
	// no reply
	// 3 queries without one question
}
