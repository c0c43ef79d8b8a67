package testutil

import (
	"net"

	"github.com/miekg/dns"
)

// ResponseWriter is a dns.ResponseWriter that keeps what is written, for tests and
// benchmarks that call ServeDNS directly.
type ResponseWriter struct {
	Remote net.Addr // what RemoteAddr returns
	Msgs   int      // messages written
	Last   *dns.Msg // the last message written with WriteMsg
}

func (w *ResponseWriter) LocalAddr() net.Addr {
	return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53}
}
func (w *ResponseWriter) RemoteAddr() net.Addr        { return w.Remote }
func (w *ResponseWriter) WriteMsg(m *dns.Msg) error   { w.Msgs++; w.Last = m; return nil }
func (w *ResponseWriter) Write(b []byte) (int, error) { w.Msgs++; return len(b), nil }
func (w *ResponseWriter) Close() error                { return nil }
func (w *ResponseWriter) TsigStatus() error           { return nil }
func (w *ResponseWriter) TsigTimersOnly(bool)         {}
func (w *ResponseWriter) Hijack()                     {}
