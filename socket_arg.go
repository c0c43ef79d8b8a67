package rrl

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"syscall"
)

// errNilSocket is what a call given no socket says. A failed net.ListenUDP returns a
// nil *net.UDPConn, and a program that passes it on without checking its error
// should learn that here rather than from a nil pointer dereference.
var errNilSocket = errors.New("no socket (nil)")

// checkSocketArg returns errNilSocket when conn is nil, or a nil pointer (a nil
// *net.UDPConn) inside the interface, whose SyscallConn would dereference it.
func checkSocketArg(conn syscall.Conn) error {
	if isNil(conn) {
		return errNilSocket
	}
	return nil
}

// isNil reports whether v is nil or holds a nil pointer, map, function, channel,
// slice or interface.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return r.IsNil()
	}
	return false
}

// closedSocketError names err, an error of reaching a socket's descriptor, as the
// socket being closed when it is; errors.Is(err, net.ErrClosed) keeps holding.
func closedSocketError(err error) error {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("the socket is closed: %w", err)
	}
	return err
}
