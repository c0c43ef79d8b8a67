package tcplimit

import (
	"time"

	"github.com/miekg/dns"
)

const answerWait = 5 * time.Second // for responses that must come

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
