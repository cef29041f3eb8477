package xdp

// The BPF object and its Go bindings are generated and committed, so that
// users need no clang; CI regenerates them and fails on a difference.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -fno-strict-aliasing -Ibpf/include" cidroute bpf/cidroute.c
