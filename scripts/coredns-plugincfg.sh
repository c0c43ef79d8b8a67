#!/bin/sh
# coredns-plugincfg.sh follows coredns/README.md's route for adding the plugin to a
# CoreDNS tree, literally: it takes CoreDNS v1.15.0's source as the Go module proxy
# serves it (the files of the tag), adds the README's plugin.cfg line after
# dnstap:dnstap, runs the README's commands in the tree with this repository's path
# for /path/to/rrl (the last one runs the built binary and checks that it lists the
# plugin), and checks that the tree's go.mod then holds the lines the README shows.
#
#	scripts/coredns-plugincfg.sh
#
# With FRESH_MODCACHE=1 it starts from an empty module cache of its own (GOMODCACHE
# in the temporary directory: everything comes from the proxy, as for a newcomer),
# else it shares the user's. The full CoreDNS build takes several minutes on two
# cores (more with a fresh cache, which also downloads some hundred megabytes). The
# temporary directory is removed on exit; set KEEP=1 to keep it (its path is printed).
set -eu

repo=$(cd "$(dirname "$0")/.." && pwd)
readme=$repo/coredns/README.md
work=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then
	echo "working in $work"
else
	trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
fi
if [ "${FRESH_MODCACHE:-0}" = 1 ]; then
	export GOMODCACHE="$work/modcache"
fi
export GOFLAGS= GOWORK=off

# block N prints the body of the N-th fenced block (counting from 1) of the README's
# section "Build CoreDNS with it".
block() {
	awk -v n="$1" '
		/^## / { in_section = ($0 == "## Build CoreDNS with it") }
		!in_section { next }
		/^```/ { if (inside) { inside = 0; if (count == n) exit } else { inside = 1; count++ } ; next }
		inside && count == n { print }
	' "$readme"
}
# The section's blocks: 1 the module's own program, 2 the plugin.cfg line, 3 the
# commands in the CoreDNS tree, 4 the go.mod lines they leave.
cfgline=$(block 2)
commands=$(block 3)
modlines=$(block 4 | sed -e '/^$/d' -e 's# // indirect$##')
case $cfgline in
rrl:*) ;;
*) echo "README: the second block is not a plugin.cfg line: $cfgline" >&2; exit 1 ;;
esac
[ -n "$commands" ] && [ -n "$modlines" ] || { echo "README: commands or go.mod lines not found" >&2; exit 1; }

src=$(go mod download -json github.com/coredns/coredns@v1.15.0 | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
[ -d "$src" ] || { echo "CoreDNS v1.15.0 not downloaded" >&2; exit 1; }
cp -R "$src" "$work/coredns"
chmod -R u+w "$work/coredns"
cd "$work/coredns"

grep -qx 'dnstap:dnstap' plugin.cfg || { echo "plugin.cfg has no dnstap:dnstap line" >&2; exit 1; }
awk -v line="$cfgline" '{ print } $0 == "dnstap:dnstap" { print line }' plugin.cfg >plugin.cfg.new
mv plugin.cfg.new plugin.cfg

printf '%s\n' "$commands" | sed "s#/path/to/rrl#$repo#g" >"$work/commands.sh"
echo "+ in the CoreDNS tree, the README's commands:"
sed 's/^/    /' "$work/commands.sh"
sh -ex "$work/commands.sh"

# The go.mod lines the README shows, as go mod edit -json reports them.
got=$(go mod edit -json | awk '
	/"Require": \[/ { sect = "require" } /"Replace": \[/ { sect = "replace" } /"(Exclude|Retract|Tool|Ignore)": \[/ { sect = "" }
	/"Path":/ { gsub(/[",]/, "", $2); path = $2 }
	/"Version":/ { gsub(/[",]/, "", $2); if (sect == "require" && path ~ /^github.com\/dnsrake\/rrl/) print "require " path " " $2 }
	/"Old": \{/ { old = 1 } /"New": \{/ { old = 0; new = 1 }
	sect == "replace" && /"Path":/ { if (old) from = path; else if (new && from ~ /^github.com\/dnsrake\/rrl/) { print "replace " from " => " path; new = 0 } }
' | sed "s#$repo#/path/to/rrl#g" | sort)
want=$(printf '%s\n' "$modlines" | sort)
if [ "$got" != "$want" ]; then
	printf 'go.mod has:\n%s\nthe README shows:\n%s\n' "$got" "$want" >&2
	exit 1
fi
echo "ok: CoreDNS v1.15.0 built with the rrl plugin as coredns/README.md says"
