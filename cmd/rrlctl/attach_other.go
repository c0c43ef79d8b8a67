//go:build !linux

package main

import (
	"errors"
	"flag"
	"os"
)

// fileGroup is unknown off Linux, where nothing is pinned.
func fileGroup(os.FileInfo) (int, bool) { return 0, false }

// Copying another process's sockets (pidfd_getfd) and socket filters are Linux
// features.

var errAttachLinux = errors.New("attaching to a running server's sockets needs Linux")

var attachCommand = &command{
	name:        "attach",
	args:        "-pid PID -listen ADDR:PORT [-pin DIR] [-KEYWORD VALUE ...]",
	summary:     "protect a running server's UDP sockets (Linux)",
	pinOptional: true,
	help:        `Attach the pinned filter to a running server's UDP sockets: needs Linux.`,
	run:         func(*cli, *flag.FlagSet, []string) error { return errAttachLinux },
}

var detachCommand = &command{
	name:        "detach",
	args:        "-pid PID -listen ADDR:PORT [-pin DIR] [-unpin]",
	summary:     "remove the filter from a running server's UDP sockets (Linux)",
	pinOptional: true,
	help:        `Remove the filter from a running server's UDP sockets: needs Linux.`,
	run:         func(*cli, *flag.FlagSet, []string) error { return errAttachLinux },
}

var controlCommand = &command{
	name:        "control",
	args:        "[-pid PID -listen ADDR:PORT] [-pin DIR] [-interval 1s]",
	summary:     "run the capacity controller of a pinned filter (Linux)",
	pinOptional: true,
	help:        `Run the capacity controller of a pinned filter: needs Linux.`,
	run:         func(*cli, *flag.FlagSet, []string) error { return errAttachLinux },
}
