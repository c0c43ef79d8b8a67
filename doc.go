// Package rrl keeps an authoritative DNS server from being used as an amplifier and
// from being drowned by floods.
//
// It works in two layers. In the kernel, a socket filter on the server's UDP socket
// limits queries per source group before the server reads them (the request limiter,
// [Filter]; in Go where the filter is not in force, [Limiter]). In Go, [RRL.Debit]
// enforces BIND-style Response Rate Limiting on every response about to be sent. The
// API of Debit is a drop-in for github.com/markdingo/rrl: a program written against it
// builds against this package by changing its import path.
//
// A miekg/dns server is protected with one call, [Protect]: it attaches the best
// kernel filter the host allows, runs the request limits in Go wherever the eBPF
// filter is not in force, and puts response rate limiting, DNS cookies and the TCP
// connection limit in front of the server's handler, so that every limit applies
// exactly once; [Protection.Status] says which protection is in force and why. A host
// whose sockets come later uses [NewProtection] and [Protection.AttachLocal].
//
// For response rate limiting alone, make a [Config] with [NewConfig], set BIND's
// rate-limit keywords on it with [Config.SetValue], make an [RRL] with [NewRRL] or
// [New], and call Debit with the source of each query and the [ResponseTuple] of its
// response: it returns [Send], [Drop] or [Slip] (send a truncated response or a
// BADCOOKIE instead) and the reasons for statistics and logs. [Handler] does this for
// a miekg/dns handler.
//
// The rest of the API, by part: the kernel filter on a socket ([Attach], [Filter]),
// shared by unprivileged processes through pins ([LoadPinned], [AttachPinned]); the
// request limiter in Go ([Limiter]); DNS server cookies ([Cookies], [WithCookies]);
// limiting events ([Config.SetEventFunc], [LimitEvent], [SlogEvents]); and BIND's
// rate-limit clause ([ParseBINDRateLimit]). Every part takes the one [Config].
//
// The kernel filter needs Linux. The package builds on every platform: elsewhere
// [Attach] and the other calls of the kernel filter return an error matching
// [ErrNotSupported], and RRL, [Limiter] and [Handler] work as on Linux.
//
// How accounts are keyed, charged and evicted, and where this package differs from
// markdingo/rrl, is in docs/response-accounts.md.
package rrl
