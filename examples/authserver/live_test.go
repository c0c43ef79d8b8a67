//go:build unix

package main

import (
	"os"
	"testing"

	"github.com/dnsrake/rrl/internal/testutil"
)

// TestMain holds the live-test lock for the package's run: its tests flood
// loopback, which would disturb another package's capacity measurements.
func TestMain(m *testing.M) { os.Exit(testutil.RunLocked(m)) }
