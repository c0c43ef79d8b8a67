package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/dnsrake/rrl"
)

// reloader holds the server's configuration: the flags' settings, with the BIND
// rate-limit clause of -bind-rate-limit FILE on top, which SIGHUP re-reads. Limiting
// events of the RRL and the Go request limiter are logged through log/slog.
type reloader struct {
	path string      // the -bind-rate-limit file, "" for none
	base *rrl.Config // the flags' settings, with the event logger
	cfg  *rrl.Config // base with the file applied at start-up
	log  io.Writer
}

// newReloader returns the configuration of base (the flags) and path (a BIND
// rate-limit clause; "" for none), with events logged to log. The error is the
// file's.
func newReloader(path string, base *rrl.Config, log io.Writer) (*reloader, error) {
	base.SetEventFunc(rrl.SlogEvents(slog.New(slog.NewTextHandler(log, nil))))
	r := &reloader{path: path, base: base, cfg: base, log: log}
	if path == "" {
		return r, nil
	}
	cfg, err := r.read()
	if err != nil {
		return nil, err
	}
	r.cfg = cfg
	return r, nil
}

// read parses the file on top of the flags' settings.
func (r *reloader) read() (*rrl.Config, error) {
	text, err := os.ReadFile(r.path)
	if err != nil {
		return nil, err
	}
	cfg, err := rrl.ParseBINDRateLimit(string(text), r.base)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", r.path, err)
	}
	return cfg, nil
}

// reload re-reads the file and applies it to the server's RRL, request limiter and
// kernel filter. A file that does not parse changes nothing.
func (r *reloader) reload(s *server) error {
	cfg, err := r.read()
	if err != nil {
		return err
	}
	return r.apply(s, cfg)
}

// apply gives cfg to the server's RRL, Go request limiter and kernel filter at
// once (Protection.Update): on error nothing has changed.
func (r *reloader) apply(s *server, cfg *rrl.Config) error {
	fresh, err := s.protection.Update(cfg)
	if err != nil {
		return err
	}
	if fresh {
		fmt.Fprintln(r.log, "rrl: client-network length or table size changed: response accounts start afresh")
	}
	return nil
}

// watch re-reads the file on every SIGHUP until ctx is done, saying what happened on
// the log; hup, when not nil, replaces the signal (for tests).
func (r *reloader) watch(ctx context.Context, s *server, hup <-chan os.Signal) {
	if r.path == "" {
		return
	}
	if hup == nil {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGHUP)
		hup = c
		go func() {
			<-ctx.Done()
			signal.Stop(c)
		}()
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				if err := r.reload(s); err != nil {
					fmt.Fprintf(r.log, "authserver: reload: %v\n", err)
					continue
				}
				fmt.Fprintf(r.log, "authserver: reloaded %s\n", r.path)
			}
		}
	}()
}
