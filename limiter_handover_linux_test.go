//go:build linux

package rrl

import "testing"

// TestAttachLocalWithoutFilterInherits: a Protection made WithoutFilter takes the Go
// Limiter of the one predecessor without a filter that holds the same socket
// (AttachLocal), and none when two do (which one it succeeds is not known).
func TestAttachLocalWithoutFilterInherits(t *testing.T) {
	_, addr := listenLoopback(t)
	newProt := func() *Protection {
		p, err := NewProtection(answerA, rpsConfig(t, "100"), WithoutFilter())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		if err := p.AttachLocal(addr); err != nil {
			t.Fatal(err)
		}
		return p
	}
	first := newProt()
	l := first.Limiter()
	if l == nil {
		t.Fatal("no Go Limiter for a socket without a filter")
	}
	second := newProt()
	if second.Limiter() != l {
		t.Fatalf("the successor's Limiter is %p, want its predecessor's %p", second.Limiter(), l)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	// Two open Protections hold the socket with Limiters of their own (the second
	// had made its own before it got the socket, and keeps it): a third inherits
	// neither.
	_, addr = listenLoopback(t)
	a := newProt()
	b, err := NewProtection(answerA, rpsConfig(t, "100"), WithoutFilter())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	own := b.goLimiter()
	if err := b.AttachLocal(addr); err != nil {
		t.Fatal(err)
	}
	if b.Limiter() != own || own == a.Limiter() {
		t.Fatal("a Protection with a Limiter of its own took another one")
	}
	other := newProt()
	if l := other.Limiter(); l == a.Limiter() || l == own {
		t.Error("a third Protection took one of two predecessors' Limiters")
	}
}
