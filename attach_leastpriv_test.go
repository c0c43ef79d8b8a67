package rrl

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// leastPrivilegeEnv tells the child of TestAttachLeastPrivilege that it is the child.
const leastPrivilegeEnv = "RRL_TEST_LEAST_PRIVILEGE"

// TestAttachLeastPrivilege runs Attach on a real socket as uid 65534 with CAP_BPF as
// its only capability, as `setpriv --reuid 65534 --regid 65534 --clear-groups
// --inh-caps +bpf --ambient-caps +bpf` starts one: the verifier accepts the program
// with the Spectre v1 sanitation it applies to a process without CAP_PERFMON, and
// the eBPF filter is attached and limits.
func TestAttachLeastPrivilege(t *testing.T) {
	if os.Getenv(leastPrivilegeEnv) == "bpf" {
		checkOnlyCaps(t, unix.CAP_BPF)
		leastPrivilegeLimits(t)
		return
	}
	requireBPF(t)
	requirePrivilege(t, unix.CAP_SETUID, unix.CAP_SETGID)
	out, err := unprivilegedRunCaps(t, "TestAttachLeastPrivilege", []uintptr{unix.CAP_BPF}, leastPrivilegeEnv+"=bpf")
	if err != nil {
		t.Fatalf("child with CAP_BPF: %v\n%s", err, out)
	}
	t.Logf("child with CAP_BPF (uid %d):\n%s", unprivilegedID, out)
}

func leastPrivilegeLimits(t *testing.T) {
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := NewConfig()
	if err := cfg.SetValue("requests-per-second", "5"); err != nil {
		t.Fatal(err)
	}
	f, err := Attach(conn, cfg)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	defer f.Close()
	if f.Mode() != ModeEBPF {
		t.Fatalf("Attach: mode %v, want %v", f.Mode(), ModeEBPF)
	}
	client, err := net.DialUDP("udp4", nil, conn.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// The classic prefilter drops responses too, but keeps no counters and sets no
	// limits: counted drops of both kinds are the eBPF program's.
	const queries = 200
	if _, err := client.Write(qr(dnsQuery(0, false))); err != nil {
		t.Fatal(err)
	}
	for i := range queries {
		if _, err := client.Write(dnsQuery(uint16(i+1), false)); err != nil {
			t.Fatal(err)
		}
	}
	delivered := 0
	buf := make([]byte, 512)
	for {
		conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, _, err := conn.ReadFromUDP(buf); err != nil {
			var nerr net.Error
			if !errors.As(err, &nerr) || !nerr.Timeout() {
				t.Fatal(err)
			}
			break
		}
		if buf[2]&0x80 != 0 {
			t.Fatal("a response (QR=1) was delivered")
		}
		delivered++
	}
	st, err := f.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("delivered %d of %d queries; stats %+v", delivered, queries, st)
	// Five a second and the estimator's burst is a handful; 50 leaves room for a
	// slow machine spreading the sends over seconds.
	if delivered == 0 || delivered > 50 {
		t.Errorf("delivered %d of %d queries at 5 per second", delivered, queries)
	}
	if st.Seen != queries+1 || st.DroppedResponse != 1 || st.limited() != uint64(queries-delivered) {
		t.Errorf("stats seen %d, dropped responses %d, limited %d; want %d, 1, %d",
			st.Seen, st.DroppedResponse, st.limited(), queries+1, queries-delivered)
	}
}
