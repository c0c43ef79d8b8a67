package rrl

import (
	"encoding/json"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeSection returns the text of README.md's section under the heading title,
// up to the next heading of its level.
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "\n## "+title+"\n")
	if i < 0 {
		t.Fatalf("README.md has no section %q", title)
	}
	s = s[i+len(title)+5:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

// firstCodeBlock returns the body of the first fenced block of section whose info
// string is lang ("" for a plain fence).
func firstCodeBlock(t *testing.T, section, lang string) string {
	t.Helper()
	var body strings.Builder
	inside, want := false, false
	for line := range strings.Lines(section) {
		fence := strings.TrimSpace(line)
		switch {
		case !inside && strings.HasPrefix(fence, "```"):
			inside, want = true, fence == "```"+lang
		case inside && fence == "```":
			if want {
				return body.String()
			}
			inside = false
		case want:
			body.WriteString(line)
		}
	}
	t.Fatalf("no ```%s block in %q", lang, section)
	return ""
}

// TestReadmeQuickStart: the README's quick start is a whole program. It is written
// as main.go of a new module, which takes this repository as the README's
// "Depending on rrl" says (go mod edit -replace, go mod tidy), ends up with the
// go.mod lines the README shows, and builds. The module cache is the one this test
// runs with and the proxy is off: every module the program needs is one this
// repository builds with.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel() // it waits on go commands, beside the package's other parallel tests
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the quick start: %v", err)
	}
	repo, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	program := firstCodeBlock(t, readmeSection(t, "Quick start"), "go")
	dep := readmeSection(t, "Depending on rrl")
	steps := firstCodeBlock(t, dep, "sh")
	lines := firstCodeBlock(t, dep, "")

	if formatted, err := format.Source([]byte(program)); err != nil || string(formatted) != program {
		t.Errorf("the quick start is not gofmt'ed (%v)", err)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(program), 0o644); err != nil {
		t.Fatal(err)
	}
	// The go.sum of this repository holds every sum the program needs, so that
	// go mod tidy need not ask the checksum database.
	sums, err := os.ReadFile("go.sum")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(gobin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("mod", "init", "example.com/quickstart")
	// The README's steps, with the clone at this repository's path.
	for line := range strings.Lines(steps) {
		args := strings.Fields(strings.ReplaceAll(line, "../rrl", repo))
		if len(args) == 0 || args[0] != "go" {
			t.Fatalf("README step %q: not a go command", line)
		}
		run(args[1:]...)
	}

	var mod struct {
		Require []struct{ Path, Version string }
		Replace []struct {
			Old struct{ Path, Version string }
			New struct{ Path, Version string }
		}
	}
	if err := json.Unmarshal([]byte(run("mod", "edit", "-json")), &mod); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range mod.Require {
		if r.Path == "github.com/dnsrake/rrl" {
			got = append(got, "require "+r.Path+" "+r.Version)
		}
	}
	for _, r := range mod.Replace {
		if r.Old.Path == "github.com/dnsrake/rrl" {
			got = append(got, "replace "+r.Old.Path+" => "+strings.ReplaceAll(r.New.Path, repo, "../rrl"))
		}
	}
	var want []string
	for line := range strings.Lines(lines) {
		if line = strings.TrimSpace(line); line != "" {
			want = append(want, line)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("go.mod has\n%s\nthe README shows\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	build := []string{"build", "-o", filepath.Join(dir, "server")}
	if raceDetector {
		build = append(build, "-race") // shares the build cache with this test's dependencies
	}
	run(append(build, ".")...)
}
