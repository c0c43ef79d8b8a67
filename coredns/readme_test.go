package coredns

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// readmeBlocks returns the bodies of the fenced blocks of README.md's section
// under the heading title, in order.
func readmeBlocks(t *testing.T, title string) []string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var body strings.Builder
	section, inside := false, false
	for line := range strings.Lines(string(b)) {
		fence := strings.TrimSpace(line)
		switch {
		case !inside && strings.HasPrefix(line, "## "):
			section = fence == "## "+title
		case !section:
		case strings.HasPrefix(fence, "```"):
			if inside {
				blocks = append(blocks, body.String())
				body.Reset()
			}
			inside = !inside
		case inside:
			body.WriteString(line)
		}
	}
	if len(blocks) == 0 {
		t.Fatalf("README.md has no blocks under %q", title)
	}
	return blocks
}

// TestDocumentedGoMod: the go.mod lines README.md gives for building CoreDNS with
// the plugin before this repository is published (a replace for both modules and
// the plugin's require) let a new module build this module's CoreDNS program, and
// the binary lists the plugin. scripts/coredns-plugincfg.sh follows the README's
// whole route on CoreDNS's own tree.
func TestDocumentedGoMod(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var lines string
	for _, b := range readmeBlocks(t, "Build CoreDNS with it") {
		if strings.Contains(b, "replace github.com/dnsrake/rrl ") {
			lines = b
		}
	}
	for _, want := range []string{"replace github.com/dnsrake/rrl => ", "replace github.com/dnsrake/rrl/coredns => ", "require github.com/dnsrake/rrl/coredns ", "require github.com/dnsrake/rrl "} {
		if !strings.Contains(lines, want) {
			t.Fatalf("the README's go.mod lines lack %q:\n%s", want, lines)
		}
	}

	dir := t.TempDir()
	gomod := "module example.com/mycoredns\n\ngo 1.26.8\n\n" + strings.ReplaceAll(lines, "/path/to/rrl", root)
	mainGo, err := os.ReadFile(filepath.Join("cmd", "coredns-rrl", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	// This module's go.sum holds every sum the program needs; the module cache the
	// tests run with holds the modules, so the proxy stays off.
	sums, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "main.go": mainGo, "go.sum": sums} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "coredns")
	cmd := exec.Command(gobin, "build", "-o", bin, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build with go.mod\n%s\n%v\n%s", gomod, err, out)
	}
	out, err := exec.Command(bin, "-plugins").CombinedOutput()
	if err != nil {
		t.Fatalf("%s -plugins: %v\n%s", bin, err, out)
	}
	if !slices.Contains(strings.Fields(string(out)), "rrl") {
		t.Errorf("the binary does not list the rrl plugin:\n%s", out)
	}
}
