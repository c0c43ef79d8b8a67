package tcplimit

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

const answerWait = 5 * time.Second // for responses that must come

// serve runs srv until the test ends.
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

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func query(name string, qtype uint16) *dns.Msg {
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	return q
}

// answerA answers every query with an empty NOERROR response.
var answerA = dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	w.WriteMsg(m)
})
