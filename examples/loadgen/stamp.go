package main

import "encoding/binary"

// Every datagram ends with a stamp that the echo brings back unchanged:
//
//	magic(4) run(4) seq(8) sent(8)
//
// run tells this run's datagrams apart from late ones of an earlier run;
// sent is nanoseconds since the run's start on the monotonic clock.
const stampLen = 24

var stampMagic = [4]byte{'c', 'r', 'l', 'g'}

// putStamp writes the stamp into the last stampLen bytes of b.
func putStamp(b []byte, run uint32, seq uint64, sent int64) {
	s := b[len(b)-stampLen:]
	copy(s, stampMagic[:])
	binary.BigEndian.PutUint32(s[4:], run)
	binary.BigEndian.PutUint64(s[8:], seq)
	binary.BigEndian.PutUint64(s[16:], uint64(sent))
}

// readStamp reads the stamp at the end of b; ok is false when b is too
// short or the stamp is not one of this run's.
func readStamp(b []byte, run uint32) (seq uint64, sent int64, ok bool) {
	if len(b) < stampLen {
		return 0, 0, false
	}
	s := b[len(b)-stampLen:]
	if [4]byte(s[:4]) != stampMagic || binary.BigEndian.Uint32(s[4:]) != run {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(s[8:]), int64(binary.BigEndian.Uint64(s[16:])), true
}
