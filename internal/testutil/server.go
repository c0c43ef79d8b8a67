package testutil

import (
	"errors"
	"net"
	"testing"

	"github.com/miekg/dns"
)

// Serve runs srv (given its PacketConn or Listener) until the test ends, returning
// once it is ready.
func Serve(t testing.TB, srv *dns.Server) {
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

// IsTimeout reports whether err is a network timeout.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
