package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

// TestCapacityFlag: -capacity is a flag, as every keyword; a bad value is a usage
// error naming it.
func TestCapacityFlag(t *testing.T) {
	for _, v := range []string{"auto", "4500"} {
		o, err := parseFlags([]string{"-capacity", v}, io.Discard)
		if err != nil || len(o.settings) != 1 || o.settings[0] != [2]string{"capacity", v} {
			t.Errorf("-capacity %s: %+v, %v", v, o, err)
		}
	}
	for _, v := range []string{"0", "-1", "never"} {
		var stderr bytes.Buffer
		if code := run(context.Background(), []string{"-capacity", v}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "capacity") || !strings.Contains(stderr.String(), v) {
			t.Errorf("-capacity %s: exit status %d, %q; want 2 naming the flag and the value", v, code, stderr.String())
		}
	}
}
