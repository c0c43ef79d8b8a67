// Package rrl keeps an authoritative DNS server from being used as an amplifier and
// from being drowned by floods.
//
// It works in two layers. In the kernel, a socket filter on the server's UDP socket
// limits queries per source group before the server reads them (the request
// limiter). In Go, [RRL.Debit] enforces BIND-style Response Rate Limiting on every
// response about to be sent, which is what this page describes. The API of Debit is a
// drop-in for github.com/markdingo/rrl: a program written against it builds against
// this package by changing its import path.
//
// A miekg/dns server is protected with one call, [Protect]: it attaches the best
// kernel filter the host allows, runs the request limits in Go wherever the eBPF
// filter is not in force, and puts response rate limiting, DNS cookies and the TCP
// connection limit in front of the server's handler, so that every limit applies
// exactly once; [Protection.Status] says which protection is in force and why. The
// eBPF filter also verifies the Handler's DNS server cookies ([Filter.UseCookies]): a
// query with a valid one has proved its address and is limited only at that
// address's own limit, so real resolvers inside a flooded network keep their answers;
// where the request limits run in Go, the Go limiter checks the cookie first and
// judges such a query the same way. A host whose sockets come later (a framework
// that opens them itself) uses [NewProtection] and [Protection.AttachLocal]. A server
// wired by hand takes Protect: it owns the rule that every request limit applies
// once and proven clients are judged at their address, which the parts alone do not
// know.
//
// The kernel filter needs Linux. The package builds on every platform: elsewhere
// [Attach] and the other calls of the kernel filter return an error matching
// [ErrNotSupported], and RRL, [Limiter] and [Handler] work as on Linux.
//
// # Response rate limiting
//
// Create a [Config] with [NewConfig], set BIND's rate-limit keywords on it with
// [Config.SetValue] (see Config for the list), make an [RRL] with [NewRRL] or [New],
// and call Debit with the source address of each query and the [ResponseTuple] of the
// response. Debit returns [Send], [Drop] or [Slip] (send a truncated response or a
// BADCOOKIE instead) and the reasons for statistics and logs.
//
// An account is kept per client network and response tuple. The client network is the
// source address masked to ipv4-prefix-length (default 24) or ipv6-prefix-length
// (default 56); an IPv4-mapped IPv6 address is an IPv4 client. The tuple's part of the
// key depends on its category, as in BIND:
//
//	AllowanceAnswer     query type and salient name
//	AllowanceReferral   query type and salient name
//	AllowanceNoData     salient name
//	AllowanceNXDomain   salient name
//	AllowanceError      nothing: one account per client network
//
// Names compare case-insensitively (ASCII letters only, as DNS does). The class is not
// part of the key.
//
// An account holds a balance of seconds of credit. Each debit costs 1/allowance
// seconds, where the allowance is the category's *-per-second keyword. The balance
// earns one second per second of elapsed time, is clamped to at most one second
// before a debit and to at least -window after it. A new account starts with one
// second of credit, so its first debit leaves one second minus the cost. A debit that
// leaves the balance negative is limited; a balance of exactly zero is not. As in BIND
// 9, the first limited response after a run of sent ones slips and then every
// slip-ratio-th one, the others drop (slip-ratio 0: all drop; 1: all slip); the
// countdown carries over between bursts until the account has recovered to full
// credit. At 5 responses per second a burst of 60 identical queries gets 5 answers,
// 28 slips and 27 drops.
//
// Before the response accounts, requests-per-second limits each client network alone,
// for every transport, without slipping ([IPRateLimit]). The Handler of a
// [Protection], whose UDP queries passed the request limiter already (the kernel
// [Filter], or a [Limiter] in Go), debits UDP responses without it, so that the limit
// is not applied twice. Response accounts apply to
// UDP only ([RTNotUDP] otherwise). all-per-second limits all UDP responses to a client
// network, besides the response's own account, without slipping ([IPAllRateLimit]).
// When the server's total query rate over the previous second exceeds qps-scale,
// every response allowance (all-per-second included, requests-per-second not) is
// multiplied by qps-scale / rate. Clients in exempt-clients are never
// limited ([IPExempt]). In report-only mode Debit always returns Send while the
// reasons and [Stats] say what would have happened.
//
// # Table
//
// Accounts live in a table bounded by max-table-size. When it is full, a new account
// evicts the account that loses least: among a few sampled accounts, the one nearest
// to full credit or, if several have recovered fully, the one that recovered first
// (for accounts left with equal balances, the least recently used). An account under
// attack is deep in debt and stays; a spoofed flood of new sources only churns the
// accounts it creates itself, and new legitimate clients still get accounts.
// Eviction takes constant time.
//
// The table is sharded by client network, with open addressing and 16-byte entries
// (a keyed hash of the account's key and the time at which its balance is zero) at
// a load of at most 3/4: 22 bytes of heap per account of max-table-size. Tables of
// up to 32 MiB (max-table-size up to about 1.5 million) are allocated in full by
// New, larger ones grow by doubling as accounts arrive. Debiting an existing
// account locks only that account's entry, and statistics are counted per
// processor, so Debit calls on different cores for different clients write no
// memory in common; creating and evicting accounts takes the shard's lock. Debit
// does not allocate for *net.UDPAddr, *net.TCPAddr, *net.IPAddr and
// [RRL.DebitAddrPort] sources.
//
// # Differences from markdingo/rrl
//
// The API and the keywords are markdingo/rrl's; these behaviours deliberately differ:
//
//   - A full table evicts the account that loses least (above). markdingo/rrl refuses
//     new accounts with Drop and [RTCacheFull] or [IPCacheFull] (so a spoofed flood
//     locks out every new client), coredns/rrl stops limiting them. Neither reason is
//     ever returned here; Stats.Evictions counts evictions.
//   - The first limited response slips, as in BIND 9; markdingo/rrl starts the slip
//     countdown at slip-ratio, so with a slip-ratio of 2 or more its first limited
//     response drops.
//   - A balance of exactly zero is not limited and leaves the slip countdown alone;
//     in markdingo/rrl it consumes a step of the countdown.
//   - IPv4-mapped IPv6 sources (::ffff:a.b.c.d) are IPv4 clients masked with
//     ipv4-prefix-length, whatever their form. markdingo/rrl works from the
//     address's string, and masks a source written as [::ffff:a.b.c.d]:port with
//     ipv6-prefix-length, which puts every such source in the one client network ::.
//   - An allowance below 1 per second admits one response every 1/allowance seconds:
//     the credit cap is raised to the cost of one response. Under markdingo/rrl's
//     one-second cap such an allowance never sends anything.
//   - Extra keywords: report-only, exempt-clients, all-per-second, qps-scale, and the
//     request limiter's. Extra reasons: [IPExempt], [IPAllRateLimit]. Stats has an
//     extra ReportOnly array, and its String format lists every reason.
//   - Keys are 59-bit keyed hashes rather than strings: two different accounts share
//     a balance only if their hashes collide, with probability about n²/2⁶⁰ for n
//     accounts (below 10⁻⁶ at a million).
//   - Without SetNowFunc, Debit reads a clock with millisecond resolution (reading
//     the system clock on every call would cost more than the rest of Debit); with
//     SetNowFunc it calls the given function every time. A clock stepping backwards
//     stands still: it never adds credit.
//   - NewRRL copies the Config and leaves the caller's alone. A nil Config means the
//     defaults, a nil tuple the zero ResponseTuple; a source that is not an IP address
//     is one client network of its own. None of these panics.
//   - max-table-size is at most 2²⁶; 0 means the default, 100000.
//   - UDP is recognised by the address type (*net.UDPAddr) or, for other net.Addr
//     types, by a Network() starting with "udp", as markdingo/rrl does for all.
package rrl
