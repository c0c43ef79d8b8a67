package rrl

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoPrometheusDependency: the package, and its tests, link no Prometheus
// package; the collector is in rrlprom.
func TestNoPrometheusDependency(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	for _, args := range [][]string{{"list", "-deps", "."}, {"list", "-deps", "-test", "."}} {
		out, err := exec.Command(gobin, args...).Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		for pkg := range strings.Lines(string(out)) {
			if strings.Contains(pkg, "prometheus") {
				t.Errorf("go %s lists %s", strings.Join(args, " "), strings.TrimSpace(pkg))
			}
		}
	}
}

// TestGoModTidy: go.mod and go.sum list exactly what the module's packages and their
// tests use (no plotting library, for one), as go mod tidy would write them.
func TestGoModTidy(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to check go.mod: %v", err)
	}
	if out, err := exec.Command(gobin, "mod", "tidy", "-diff").CombinedOutput(); err != nil {
		t.Errorf("go mod tidy -diff: %v\n%s", err, out)
	}
}
