package backend

import "sync/atomic"

// Stats are a Conn's counters since New. Every datagram read from the
// socket is counted once, as accepted or dropped:
//
//	read = AcceptedProxied + AcceptedDirect + AcceptedLocal + Σ Dropped*
type Stats struct {
	AcceptedProxied uint64 // PPv2 PROXY from a trusted proxy
	AcceptedDirect  uint64 // no signature, let through by the Direct policy
	AcceptedLocal   uint64 // PPv2 LOCAL from a trusted proxy, delivered as direct

	DroppedUntrusted       uint64 // PPv2 signature from a sender outside TrustedProxies
	DroppedBadHeader       uint64 // malformed PPv2 header, or unusable addresses in it
	DroppedLocal           uint64 // PPv2 LOCAL with DropLocal set
	DroppedDirect          uint64 // no signature, DirectDrop
	DroppedDirectHandshake uint64 // no signature, starts a session, DirectNoHandshake
	DroppedTruncated       uint64 // larger than MaxDatagram

	WrittenProxied uint64 // datagrams sent through a proxy with a reverse header
	WrittenDirect  uint64 // datagrams sent straight to a client
	WriteNoRoute   uint64 // writes that failed with ErrNoRoute
	WriteErrors    uint64 // writes the socket refused

	Routes        int    // live routes in the table (expired ones not yet swept count)
	RoutesEvicted uint64 // routes evicted to make room
	RoutesExpired uint64 // routes removed after RouteIdle
}

type counters struct {
	acceptedProxied, acceptedDirect, acceptedLocal                  atomic.Uint64
	droppedUntrusted, droppedBadHeader, droppedLocal, droppedDirect atomic.Uint64
	droppedDirectHandshake, droppedTruncated                        atomic.Uint64
	writtenProxied, writtenDirect, writeNoRoute, writeErrors        atomic.Uint64
}

// Stats returns a snapshot of the counters.
func (c *Conn) Stats() Stats {
	s := Stats{
		AcceptedProxied:        c.st.acceptedProxied.Load(),
		AcceptedDirect:         c.st.acceptedDirect.Load(),
		AcceptedLocal:          c.st.acceptedLocal.Load(),
		DroppedUntrusted:       c.st.droppedUntrusted.Load(),
		DroppedBadHeader:       c.st.droppedBadHeader.Load(),
		DroppedLocal:           c.st.droppedLocal.Load(),
		DroppedDirect:          c.st.droppedDirect.Load(),
		DroppedDirectHandshake: c.st.droppedDirectHandshake.Load(),
		DroppedTruncated:       c.st.droppedTruncated.Load(),
		WrittenProxied:         c.st.writtenProxied.Load(),
		WrittenDirect:          c.st.writtenDirect.Load(),
		WriteNoRoute:           c.st.writeNoRoute.Load(),
		WriteErrors:            c.st.writeErrors.Load(),
	}
	s.Routes, s.RoutesEvicted, s.RoutesExpired = c.routes.stats()
	return s
}

// Accepted is the number of datagrams delivered to readers.
func (s Stats) Accepted() uint64 { return s.AcceptedProxied + s.AcceptedDirect + s.AcceptedLocal }

// Dropped is the number of datagrams dropped on receive.
func (s Stats) Dropped() uint64 {
	return s.DroppedUntrusted + s.DroppedBadHeader + s.DroppedLocal + s.DroppedDirect +
		s.DroppedDirectHandshake + s.DroppedTruncated
}
