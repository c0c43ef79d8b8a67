//go:build unix

package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/dnsrake/rrl/internal/testutil"
)

// TestMain holds the live-test lock for the package's run: its tests flood
// loopback, which would disturb another package's capacity measurements.
func TestMain(m *testing.M) {
	release, err := testutil.LockLive()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	release()
	os.Exit(code)
}
