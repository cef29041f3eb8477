// Package interop holds no code: its tests hold the core parsers to
// independent implementations (pion/dtls v3's recordlayer and handshake
// parsers, live pion and OpenSSL peers, github.com/pires/go-proxyproto).
//
// It is a module of its own so that the core module, which every user
// requires, does not require pion or go-proxyproto for its tests.
package interop
