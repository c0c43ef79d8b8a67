//go:build linux

package rrl

// Server cookies in the kernel filter: a query whose RFC 9018 server cookie verifies
// comes from the address it claims, as no spoofer receives the responses that carry
// the cookie. The filter counts and limits such a query only in its own address's
// node (the /32 or /128 level), never in the groups it shares with other sources, so
// that real resolvers inside an attacked network keep their answers while the spoofed
// flood from that network is trimmed as before.
//

import (
	"fmt"
	"os"
	"path/filepath"
)

// UseCookies makes the filter pass queries that carry a valid server cookie of c
// (Cookies.Verify finds it CookieValid or CookieValidReissue) judged only against the
// limit of their own address's level (the /32 or /128 level; a config whose finest
// level is coarser judges them as without a cookie). Every attached socket and, for a
// pinned filter, every process using the pins sees the secrets. Later c.Rotate,
// c.SetPrevious and c.ClearPrevious reach the filter too, until it is closed or
// UseCookies is called again; Update keeps them. UseCookies(nil) stops the filter
// looking at cookies.
//
// A pinned filter needs write access to its rrl_cookie_secrets pin (errors.Is(err,
// ErrNotPermitted) otherwise). In ModeClassic the error matches ErrNotSupported.
func (f *Filter) UseCookies(c *Cookies) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.mode == ModeClassic:
		return fmt.Errorf("rrl: use cookies: %w: the classic prefilter cannot verify cookies", ErrNotSupported)
	case f.mode != ModeEBPF:
		return ErrClosed
	case f.objs.CookieSecrets == nil:
		path := "rrl_cookie_secrets"
		if f.pin != nil {
			path = filepath.Join(f.pin.dir, pinCookieSecrets)
		}
		return fmt.Errorf("rrl: use cookies: %w: %s is not writable for uid %d", ErrNotPermitted, path, os.Geteuid())
	}
	var kc *kernelCookies
	if c != nil {
		// The clock watch first: failing, it has changed nothing.
		kc = &kernelCookies{c: c, secrets: f.objs.CookieSecrets}
		if pin, objs := f.pin, f.objs; pin != nil {
			kc.mark = func(k *cookieKeys) { pin.markCookies(objs, k) }
		}
		if err := kc.openClock(); err != nil {
			return err
		}
	}
	if err := f.switchCookies(kc); err != nil {
		if kc != nil {
			kc.clock.Close()
		}
		return err
	}
	return nil
}

// switchCookies writes kc's keys (none when kc is nil) and then makes kc the filter's
// sink in place of the old one, all or nothing: on error the old sink, if any, still
// follows its Cookies. The old sink is held still meanwhile, so that a change of its
// keys cannot overwrite the new secrets. f.mu is held.
func (f *Filter) switchCookies(kc *kernelCookies) error {
	old := f.cookies
	var keys *cookieKeys
	if kc != nil {
		keys = kc.c.keys.Load()
	}
	if old != nil {
		old.mu.Lock()
	}
	err := writeCookieSecrets(f.objs.CookieSecrets, keys)
	if old != nil {
		old.closed = err == nil
		old.mu.Unlock()
	}
	switch {
	case err != nil && kc == nil:
		return fmt.Errorf("rrl: clear cookie secrets: %w", err)
	case err != nil:
		return fmt.Errorf("rrl: write cookie secrets: %w", err)
	}
	if f.pin != nil {
		f.pin.markCookies(f.objs, keys)
	}
	f.cookies.stop()
	f.cookies = nil
	if kc != nil {
		// subscribe writes the keys again: a change since the write above reaches
		// the filter.
		kc.c.subscribe(kc)
		kc.watchClock()
		f.cookies = kc
	}
	return nil
}
