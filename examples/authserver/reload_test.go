package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dnsrake/rrl"
	"github.com/dnsrake/rrl/internal/testutil"
	"github.com/miekg/dns"
)

// query asks the server for name and type over UDP without a cookie and reports
// whether the answer came in full (not truncated).
func query(t *testing.T, addr, name string, qtype uint16) bool {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	c := &dns.Client{Timeout: 2 * time.Second}
	r, _, err := c.Exchange(q, addr)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return !r.Truncated && len(r.Answer) > 0
}

// waitFor polls log until it contains s, for at most limit.
func waitFor(t *testing.T, log *testutil.SyncBuffer, s string, limit time.Duration, each func()) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !strings.Contains(log.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("log lacks %q after %v:\n%s", s, limit, log.String())
		}
		if each != nil {
			each()
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBINDRateLimitReload: -bind-rate-limit's clause is in force from the start, is
// re-read on SIGHUP into the RRL, the request limiter and the kernel filter at once,
// a bad file changes nothing, and limiting events are logged.
func TestBINDRateLimitReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rate-limit.conf")
	writeFile(t, path, `rate-limit {
	responses-per-second 1;   // BIND's syntax
	slip 1;
	requests-per-second 1000; # an extension of this package
};`)
	log := &testutil.SyncBuffer{}
	rl, err := newReloader(path, rrl.NewConfig(), log)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := startTest(t, rl.cfg, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hup := make(chan os.Signal)
	rl.watch(ctx, s, hup)

	// responses-per-second 1: the second answer for www slips.
	if !query(t, s.addr, "www.example.test.", dns.TypeA) || query(t, s.addr, "www.example.test.", dns.TypeA) {
		t.Fatal("with responses-per-second 1 from the file, the second answer was not limited")
	}
	// The limiting is logged (once it has gone on for a second).
	waitFor(t, log, "limit responses to 127.0.0.0/24 for www.example.test. A", 5*time.Second, func() {
		query(t, s.addr, "www.example.test.", dns.TypeA)
	})

	// Raise the limit: answers for another name are no longer limited, and the
	// request limits reach the kernel filter and the Go limiter.
	writeFile(t, path, "rate-limit { responses-per-second 100; requests-per-second 2000; };\n")
	hup <- syscallHUP
	waitFor(t, log, "reloaded "+path, 5*time.Second, nil)
	for i := range 5 {
		if !query(t, s.addr, "mail.example.test.", dns.TypeA) {
			t.Fatalf("answer %d after raising the limit was limited", i+1)
		}
	}
	if s.filter != nil {
		if got := s.filter.Config().Values(); !hasValue(got, "requests-per-second", "2000") {
			t.Errorf("kernel filter config %v", got)
		}
	}
	if s.limiter != nil {
		for _, n := range s.limiter.Stats().Nodes {
			if n.Node.String() == "ipv4/32" && n.Limit != 2000 {
				t.Errorf("request limiter %v limit %v, want 2000", n.Node, n.Limit)
			}
		}
	}

	// A bad file: an error naming the line, and the configuration stays.
	writeFile(t, path, "rate-limit {\n  responses-per-second 1;\n  exempt-clients { localhost; };\n};\n")
	hup <- syscallHUP
	waitFor(t, log, "line 3", 5*time.Second, nil)
	for i := range 3 {
		if !query(t, s.addr, "ns1.example.test.", dns.TypeA) {
			t.Fatalf("answer %d after a bad reload was limited", i+1)
		}
	}
}

func hasValue(kvs [][2]string, k, v string) bool {
	for _, kv := range kvs {
		if kv[0] == k && kv[1] == v {
			return true
		}
	}
	return false
}

// TestBINDRateLimitFlag: a file that does not parse is a usage error naming its line.
func TestBINDRateLimitFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.conf")
	writeFile(t, path, "rate-limit {\n  window 5;\n  min-table-size x;\n};\n")
	var stderr bytes.Buffer
	if code := run(context.Background(), []string{"-bind-rate-limit", path}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "line 3") {
		t.Errorf("exit status %d, log %q: want 2 and the line", code, stderr.String())
	}
	if code := run(context.Background(), []string{"-bind-rate-limit", filepath.Join(t.TempDir(), "missing")}, io.Discard, &stderr); code != 2 {
		t.Errorf("missing file: exit status %d", code)
	}
}

var syscallHUP os.Signal = syscall.SIGHUP
