package coredns

import (
	"strings"
	"testing"

	"github.com/coredns/caddy"
)

// TestParseCapacity: the capacity keyword of the Corefile takes auto or a rate, and
// a bad value is refused with the keyword and the value named.
func TestParseCapacity(t *testing.T) {
	for _, v := range []string{"auto", "4500"} {
		s, err := parse(caddy.NewTestController("dns", "rrl {\n capacity "+v+"\n}"))
		if err != nil {
			t.Fatalf("capacity %s: %v", v, err)
		}
		if got := values(s.cfg)["capacity"]; got != v {
			t.Errorf("capacity %s: Config has %q", v, got)
		}
	}
	for _, v := range []string{"0", "-2", "sometimes"} {
		_, err := parse(caddy.NewTestController("dns", "rrl {\n capacity "+v+"\n}"))
		if err == nil || !strings.Contains(err.Error(), "capacity") || !strings.Contains(err.Error(), v) {
			t.Errorf("capacity %s: %v, want an error naming the keyword and the value", v, err)
		}
	}
	if _, err := parse(caddy.NewTestController("dns", "rrl {\n capacity\n}")); err == nil {
		t.Error("capacity without a value accepted")
	}
}
