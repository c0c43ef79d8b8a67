package rrl_test

import (
	"crypto/rand"
	"fmt"
	"net"

	"github.com/dnsrake/rrl"
	"github.com/miekg/dns"
)

// A miekg/dns server with response rate limiting and DNS cookies in front of its
// own handler. With one response per second allowed and slip-ratio 1, the second
// answer within the second is slipped: truncated, so that a real client retries
// over TCP.
func ExampleNewHandler() {
	cfg := rrl.NewConfig()
	cfg.SetValue("responses-per-second", "1")
	cfg.SetValue("slip-ratio", "1")
	var secret rrl.CookieSecret
	rand.Read(secret[:])

	zone := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		m.Authoritative = true
		a, _ := dns.NewRR(req.Question[0].Name + " 300 IN A 192.0.2.1")
		m.Answer = append(m.Answer, a)
		w.WriteMsg(m)
	})
	h := rrl.NewHandler(zone, rrl.NewRRL(cfg), rrl.WithCookies(rrl.NewCookies(secret)))

	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	started := make(chan struct{})
	srv.NotifyStartedFunc = func() { close(started) }
	go srv.ActivateAndServe()
	<-started
	defer srv.Shutdown()

	q := new(dns.Msg)
	q.SetQuestion("www.example.test.", dns.TypeA)
	for range 2 {
		r, _, err := new(dns.Client).Exchange(q, pc.LocalAddr().String())
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(len(r.Answer), "answer, truncated:", r.Truncated)
	}
	st := h.Stats()
	fmt.Println("sent", st.Responses[rrl.Send][rrl.AllowanceAnswer], "slipped", st.Responses[rrl.Slip][rrl.AllowanceAnswer])
	// Output:
	// 1 answer, truncated: false
	// 0 answer, truncated: true
	// sent 1 slipped 1
}
