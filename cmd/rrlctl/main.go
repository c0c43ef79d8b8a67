// Command rrlctl loads the rrl kernel filter into a bpffs pin directory for
// unprivileged DNS servers to attach (rrl.AttachPinned), and inspects and
// reconfigures it while they run.
//
// Usage:
//
//	rrlctl load   -pin DIR [-user U] [-group G] [-KEYWORD VALUE ...]
//	rrlctl unload -pin DIR
//	rrlctl stats  -pin DIR [-watch 1s] [-count N] [-json]
//	rrlctl set    -pin DIR KEYWORD VALUE [KEYWORD VALUE ...]
//	rrlctl config -pin DIR [-json]
//	rrlctl top    -pin DIR [-n 20] [-probe ADDR[:PORT],...] [-zones NAME,...] [-json]
//	rrlctl attach -pid PID -listen ADDR:PORT [-pin DIR] [-KEYWORD VALUE ...]
//	rrlctl detach -pid PID -listen ADDR:PORT [-pin DIR] [-unpin]
//	rrlctl control [-pid PID -listen ADDR:PORT] [-pin DIR] [-interval 250ms]
//	rrlctl xdp attach -dev IFACE -pin DIR [-mode native|generic] [-ports 53] [-addrs A,B]
//	rrlctl xdp detach -dev IFACE [-pin DIR]
//
// load and unload need root (CAP_BPF, CAP_CHOWN); attach and detach, which protect a
// running server that never calls rrl.Attach (named, Knot, Unbound...), need root or
// CAP_SYS_PTRACE over it as well, as does control with -pid, which runs the capacity
// controller of a pinned filter until SIGINT or SIGTERM; the others need access to the pins (the members of
// the group given to load have it; docs/deployment.md says who may do what). Exit status: 0 success, 1 failure,
// 2 bad usage. `rrlctl COMMAND -h` describes each command.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dnsrake/rrl"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// command is one subcommand.
type command struct {
	name, args, summary, help string
	// pinOptional: -pin has a default the command works out itself.
	pinOptional bool
	// run parses args with fs (already holding -pin) and acts; it returns an error
	// of type usageError for bad usage.
	run func(c *cli, fs *flag.FlagSet, args []string) error
}

// cli is what the commands share: the output streams and the parsed -pin.
type cli struct {
	stdout, stderr io.Writer
	pin            string
	pinOptional    bool
}

// usageError is bad usage: exit status 2 and a pointer to -h.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

var commands = []*command{loadCommand, unloadCommand, statsCommand, setCommand, configCommand, topCommand, attachCommand, detachCommand, controlCommand, xdpCommand}

const overview = `rrlctl manages the rrl kernel filter pinned in a bpffs directory.

A privileged step ("rrlctl load") loads the filter once and pins it; DNS servers
in the given group attach it to their sockets without privileges
(rrl.AttachPinned, Linux 5.19 or later) and share one set of limits. A server
that never attaches it (named, Knot, Unbound...) gets it from "rrlctl attach".
With the keyword capacity, "rrlctl control" runs the controller that sets the
limits under overload (a pinned filter runs none by itself).

Usage: rrlctl COMMAND -pin DIR [flags] [args]

Commands:
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		printOverview(stderr)
		return exitUsage
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "-help" || name == "--help" {
		if len(args) > 1 {
			for _, c := range commands {
				if c.name == args[1] {
					// The command defines its flags as it runs: run it with -h,
					// which prints them all and acts on nothing.
					cl := &cli{stdout: stdout, stderr: stdout}
					c.run(cl, newFlagSet(c, cl, stdout), []string{"-h"})
					return exitOK
				}
			}
		}
		printOverview(stdout)
		return exitOK
	}
	for _, c := range commands {
		if c.name != name {
			continue
		}
		cl := &cli{stdout: stdout, stderr: stderr}
		fs := newFlagSet(c, cl, stderr)
		err := c.run(cl, fs, args[1:])
		var ue usageError
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.As(err, &ue):
			fmt.Fprintf(stderr, "rrlctl %s: %v\nRun 'rrlctl %s -h' for usage.\n", c.name, err, c.name)
			return exitUsage
		}
		fmt.Fprintf(stderr, "rrlctl %s: %v\n", c.name, err)
		return exitError
	}
	fmt.Fprintf(stderr, "rrlctl: unknown command %q\nRun 'rrlctl help' for usage.\n", name)
	return exitUsage
}

func printOverview(w io.Writer) {
	fmt.Fprint(w, overview)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-7s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'rrlctl COMMAND -h' for a command's flags.\nExit status: 0 success, 1 failure, 2 bad usage.\n")
}

// newFlagSet makes the flag set of c with -pin, printing usage to w.
func newFlagSet(c *command, cl *cli, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("rrlctl "+c.name, flag.ContinueOnError)
	fs.SetOutput(w)
	cl.pinOptional = c.pinOptional
	usage := "rrlctl " + c.name + " -pin DIR " + c.args
	if c.pinOptional {
		fs.StringVar(&cl.pin, "pin", "", "the pin `directory` on bpffs (default /sys/fs/bpf/rrl-ADDR-PORT, the address's dots and colons as _)")
		usage = "rrlctl " + c.name + " " + c.args
	} else {
		fs.StringVar(&cl.pin, "pin", "", "the pin `directory` on bpffs, e.g. /sys/fs/bpf/rrl (required)")
	}
	fs.Usage = func() {
		fmt.Fprintf(w, "Usage: %s\n\n%s\n\nFlags:\n", usage, strings.TrimSpace(c.help))
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args and checks -pin; it returns the positional arguments.
func (c *cli) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		// The flag package has printed the problem and the usage.
		return nil, usageError{err.Error()}
	}
	if c.pin == "" && !c.pinOptional {
		return nil, usagef("-pin DIR is required")
	}
	return fs.Args(), nil
}

// parseFlags is parse for a command that takes flags only.
func (c *cli) parseFlags(fs *flag.FlagSet, args []string) error {
	rest, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("unexpected arguments %q", redactSecrets(rest))
	}
	return nil
}

// redactSecrets returns args with every argument that looks like a cookie secret
// (32 hex digits, or a list of them: a -cookie-secret value left unquoted) shown as
// [redacted]: no message of rrlctl quotes a secret.
func redactSecrets(args []string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if looksSecret(a) {
			out[i] = redacted
		}
	}
	return out
}

// redacted is shown in place of a cookie secret.
const redacted = "[redacted]"

// looksSecret reports whether every field of s is 32 hex digits (with 0x or not).
func looksSecret(s string) bool {
	fields := strings.Fields(s)
	for _, f := range fields {
		f = strings.TrimPrefix(strings.TrimPrefix(f, "0x"), "0X")
		if len(f) != 32 || strings.Trim(f, "0123456789abcdefABCDEF") != "" {
			return false
		}
	}
	return len(fields) > 0
}

var loadCommand = &command{
	name:    "load",
	args:    "[-user U] [-group G] [-KEYWORD VALUE ...]",
	summary: "load the filter and pin it for a group (root)",
	help: `Load the eBPF filter and pin its program and maps in DIR, a directory on
bpffs (created if its parent is on bpffs). The pins and the directory load creates
are owned by root and by -group, and give access through the group alone: members
may attach the filter (rrl.AttachPinned), read its statistics and reconfigure it,
but never read its cookie secrets, write the maps only the kernel writes, or chmod,
rename or unlink a pin; nobody else may open anything. -user U without -group
means U's primary group; U never owns a pin (an owner could chmod it). Without
either, only root has access. DIR and the directories above it on bpffs must be
writable by root alone. Every rrl configuration keyword is a flag:
-requests-per-second 50 -ipv4-request-levels "32:1 16:16"
-exempt-clients 192.0.2.0/24 -report-only. Needs root (CAP_BPF and CAP_CHOWN).`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		userName := fs.String("user", "", "the `user` (name or uid) whose servers attach the filter: without -group, its primary group gets access")
		groupName := fs.String("group", "", "the `group` (name or gid) whose members may attach the filter")
		kw := keywordFlags(fs)
		if err := c.parseFlags(fs, args); err != nil {
			return err
		}
		cfg, err := kw.config(rrl.NewConfig())
		if err != nil {
			return err
		}
		uid, gid := -1, -1
		if *userName != "" {
			if uid, err = lookupID(*userName, user.Lookup, func(u *user.User) string { return u.Uid }); err != nil {
				return usagef("-user %s: %v", *userName, err)
			}
		}
		if *groupName != "" {
			if gid, err = lookupID(*groupName, user.LookupGroup, func(g *user.Group) string { return g.Gid }); err != nil {
				return usagef("-group %s: %v", *groupName, err)
			}
		}
		if err := rrl.LoadPinned(cfg, c.pin, uid, gid); err != nil {
			return err
		}
		// Say what LoadPinned made of -user and -group: the group it gave access to.
		fi, err := os.Stat(filepath.Join(c.pin, "rrl_filter"))
		if err != nil {
			return err
		}
		if gid, ok := fileGroup(fi); ok && fi.Mode()&0o070 != 0 {
			fmt.Fprintf(c.stdout, "loaded the filter into %s (owner root, group %d: its members may attach and reconfigure it)\n", c.pin, gid)
		} else {
			fmt.Fprintf(c.stdout, "loaded the filter into %s (owner root; only root has access)\n", c.pin)
		}
		if kw.secret() {
			fmt.Fprintln(c.stdout, cookieLine(1))
		}
		return nil
	},
}

// keywords are the rrl configuration keywords given as flags, in order.
type keywords [][2]string

// keywordFlags defines a flag for every rrl configuration keyword on fs.
func keywordFlags(fs *flag.FlagSet) *keywords {
	kws := &keywords{}
	for _, kw := range rrl.ConfigKeywords() {
		set := func(v string) error {
			*kws = append(*kws, [2]string{kw, v})
			return nil
		}
		if kw == "report-only" {
			fs.BoolFunc(kw, "count but never drop (rrl keyword report-only)", set)
			continue
		}
		fs.Func(kw, "rrl keyword "+kw+" (see rrl.Config)", set)
	}
	return kws
}

// config applies the keywords to cfg; a bad value is a usage error.
func (k *keywords) config(cfg *rrl.Config) (*rrl.Config, error) {
	for _, kv := range *k {
		if err := cfg.SetValue(kv[0], kv[1]); err != nil {
			return nil, usageError{err.Error()}
		}
	}
	return cfg, nil
}

// secret reports whether the keywords give a cookie secret (the last cookie-secret
// wins, as in SetValue: an empty one forgets it).
func (k *keywords) secret() bool {
	given := false
	for _, kv := range *k {
		if kv[0] == "cookie-secret" {
			given = strings.TrimSpace(kv[1]) != ""
		}
	}
	return given
}

// clearsSecret reports whether the last cookie-secret of the keywords is empty:
// for a filter that runs, "stop verifying cookies".
func (k *keywords) clearsSecret() bool {
	clears := false
	for _, kv := range *k {
		if kv[0] == "cookie-secret" {
			clears = strings.TrimSpace(kv[1]) == ""
		}
	}
	return clears
}

// apply applies the keywords on top of the configuration of f, a pinned filter
// that runs: Update writes them (a cookie-secret into the kernel, keeping the one
// it replaces accepted), and an empty cookie-secret makes the kernel stop verifying
// cookies (UseCookies(nil)), after the Update.
func (k *keywords) apply(f *rrl.Filter) error {
	cfg, err := k.config(f.Config())
	if err != nil {
		return err
	}
	if err := f.Update(cfg); err != nil {
		return err
	}
	if k.clearsSecret() {
		if err := f.UseCookies(nil); err != nil {
			return fmt.Errorf("cookie-secret \"\": stop verifying cookies (the other keywords are applied): %w", err)
		}
	}
	return nil
}

// maxID is the largest uid or gid: IDs are 32 bits and 4294967295, (uid_t)-1, means
// "no change" to chown.
const maxID = 1<<32 - 2

// lookupID resolves a user or group name, or takes a number as it is. A number
// (anything that starts with a sign or a digit) must fit a uid or gid: a larger
// one would be truncated to 32 bits by chown and give the pins to someone else.
func lookupID[T any](name string, lookup func(string) (T, error), id func(T) string) (int, error) {
	if name[0] == '-' || name[0] == '+' || name[0] >= '0' && name[0] <= '9' {
		return parseID(name)
	}
	v, err := lookup(name)
	if err != nil {
		return 0, err
	}
	return parseID(id(v))
}

// parseID returns s as a uid or gid: a decimal number from 0 to maxID.
func parseID(s string) (int, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > maxID {
		return 0, fmt.Errorf("%q is not an ID from 0 to %d", s, maxID)
	}
	return int(n), nil
}

var unloadCommand = &command{
	name:    "unload",
	summary: "remove the pins (root)",
	help: `Remove the pins "rrlctl load" made in DIR, and DIR if load created it. Servers
that attached the filter keep it on their sockets until they close them.`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		if err := c.parseFlags(fs, args); err != nil {
			return err
		}
		if err := rrl.Unpin(c.pin); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "unloaded %s\n", c.pin)
		return nil
	},
}

var setCommand = &command{
	name:    "set",
	args:    "KEYWORD VALUE [KEYWORD VALUE ...]",
	summary: "change the running filter's configuration",
	help: `Apply rrl configuration keywords to the pinned filter's configuration, at
once for every server attached to it; the sketches are kept. For example:
rrlctl set -pin /sys/fs/bpf/rrl requests-per-second 100 report-only false

cookie-secret HEX gives the kernel the DNS server cookie secret (the one the
servers make their cookies with): it then verifies their cookies and judges a
query with a valid one at its own address only. The secret it replaces stays
accepted (giving the secret in force alone again stops that), which needs root
to read it; others give both, cookie-secret "NEW CURRENT". cookie-secret ""
makes the kernel stop verifying cookies. The secret is never printed: "rrlctl
stats" says whether the kernel verifies cookies, and with how many secrets.`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		rest, err := c.parse(fs, args)
		if err != nil {
			return err
		}
		if len(rest) == 0 || len(rest)%2 != 0 {
			return usagef("want KEYWORD VALUE pairs, got %q", redactSecrets(rest))
		}
		kw := keywords{}
		for i := 0; i < len(rest); i += 2 {
			kw = append(kw, [2]string{rest[i], rest[i+1]})
		}
		// Bad keywords and values are refused before the pins are opened.
		if _, err := kw.config(rrl.NewConfig()); err != nil {
			return err
		}
		f, err := rrl.OpenPinned(c.pin)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := kw.apply(f); err != nil {
			return err
		}
		secret := false
		for _, kv := range kw {
			v := kv[1]
			if kv[0] == "cookie-secret" {
				v, secret = redacted, true
				if strings.TrimSpace(kv[1]) == "" {
					v = `""`
				}
			}
			fmt.Fprintf(c.stdout, "%s %s\n", kv[0], v)
		}
		if secret {
			st, err := f.Stats()
			if err != nil {
				return err
			}
			fmt.Fprintln(c.stdout, cookieLine(st.CookieSecrets))
		}
		return nil
	},
}

var configCommand = &command{
	name:    "config",
	args:    "[-json]",
	summary: "print the running filter's configuration",
	help: `Print the configuration the pinned filter runs with, one "keyword value" per
line. A cookie secret the kernel holds is shown as cookie-secret "[redacted]".`,
	run: func(c *cli, fs *flag.FlagSet, args []string) error {
		asJSON := fs.Bool("json", false, "print a JSON object")
		if err := c.parseFlags(fs, args); err != nil {
			return err
		}
		f, err := rrl.OpenPinned(c.pin)
		if err != nil {
			return err
		}
		defer f.Close()
		pairs := f.Config().Values()
		st, err := f.Stats()
		if err != nil {
			return err
		}
		if st.CookieSecrets > 0 {
			// The pins keep the Config without it; the kernel holds it.
			pairs = append(pairs, [2]string{"cookie-secret", redacted})
		}
		if *asJSON {
			m := map[string]string{}
			for _, kv := range pairs {
				m[kv[0]] = kv[1]
			}
			return writeJSON(c.stdout, m)
		}
		for _, kv := range pairs {
			fmt.Fprintf(c.stdout, "%-26s %s\n", kv[0], strconv.Quote(kv[1]))
		}
		return nil
	},
}
