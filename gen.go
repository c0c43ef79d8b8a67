package rrl

// The eBPF socket filter, built from filter_bpf.c with Debian's clang. The objects are
// committed; CI regenerates them and checks that nothing changed.
//go:generate go tool bpf2go -cflags "-O2 -g -Wall -I/usr/include/x86_64-linux-gnu" -type settings -type step -type counters -type cell -type limited_key -type limited_value -type test_input -type test_fp -type test_names -type cookie_secrets filter filter_bpf.c

// The XDP program, built from the same headers (bpf/) as the socket filter.
//go:generate go tool bpf2go -cflags "-O2 -g -Wall -I/usr/include/x86_64-linux-gnu" -type xdp_dest_key xdp xdp_bpf.c
