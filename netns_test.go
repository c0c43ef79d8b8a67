package rrl

import (
	"testing"

	"github.com/dnsrake/rrl/internal/loadgen"
)

// testNetns is a network namespace the test creates and removes.
type testNetns struct{ *loadgen.Netns }

func newTestNetns(t *testing.T) *testNetns {
	t.Helper()
	n, err := loadgen.NewNetns("rrltest")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return &testNetns{n}
}

// do runs fn with the calling thread in the namespace.
func (n *testNetns) do(t *testing.T, fn func()) {
	t.Helper()
	if err := n.Do(func() error { fn(); return nil }); err != nil {
		t.Fatal(err)
	}
}
