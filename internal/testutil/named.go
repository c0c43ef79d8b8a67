package testutil

import (
	"os"
	"os/exec"
	"testing"
)

// Named returns the path of BIND 9's named, skipping t when it is not installed,
// or failing it then when RRL_REQUIRE_BPF=1 (CI installs the Debian package bind9).
func Named(t testing.TB) string {
	t.Helper()
	if named, err := exec.LookPath("named"); err == nil {
		return named
	}
	const named = "/usr/sbin/named"
	if _, err := os.Stat(named); err == nil {
		return named
	}
	if os.Getenv("RRL_REQUIRE_BPF") == "1" {
		t.Fatal("named (Debian package bind9) is missing and RRL_REQUIRE_BPF=1")
	}
	t.Skip("named (Debian package bind9) is not installed")
	return ""
}
