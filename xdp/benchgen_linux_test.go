package xdp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// The frame generator puts the load on cv the way a NIC hands frames to a
// driver: BPF_PROG_RUN in live-frame mode redirects each frame into cv,
// so pc receives it as an xdp_frame in a page with headroom. A sender's
// socket skb instead reaches pc's XDP program only after veth copies it
// into such a page (its headroom is short of XDP_PACKET_HEADROOM), a cost
// no NIC driver has and that the socket path, which takes the skb as it
// is, would not pay.

// The generated payload is dtlsCIDRecord(8, ordinal, 64): the send time
// (CLOCK_MONOTONIC, big-endian) after the 21 header bytes, then its
// complement, which keeps the UDP checksum the frame was built with.
const (
	genHdr   = 14 + 20 + 8
	genStamp = genHdr + 21
)

// genFrames are the three frames (ordinals 0-2) the generator sends from
// src (cv's MAC, the client) to dst (pc's MAC, the service).
func genFrames(srcMAC, dstMAC net.HardwareAddr) [][]byte {
	var fs [][]byte
	for o := range byte(3) {
		p := dtlsCIDRecord(8, o, 64)
		for i := range 8 {
			p[21+i], p[29+i] = 0, 0xff
		}
		fs = append(fs, udpFrame(srcMAC, dstMAC, netip.AddrPortFrom(clientAddr, 40000+uint16(o)),
			netip.AddrPortFrom(proxyFront, benchPort), p, frameOpts{ttl: 64, df: true}))
	}
	return fs
}

// genProgram rewrites a frame's headers from frame (the proxy's program
// rewrites them in place, and live-frame mode resets only the frame's
// bounds when it reuses a page), stamps it and redirects it to ifindex.
func genProgram(frame []byte, ifindex int) (*ebpf.Program, error) {
	ins := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnKtimeGetNs.Call(),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R2, asm.R6, 0, asm.Word), // data
		asm.LoadMem(asm.R3, asm.R6, 4, asm.Word), // data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, genStamp+16),
		asm.JGT.Reg(asm.R4, asm.R3, "drop"),
	}
	for off := 0; off < genHdr; off += 2 {
		if off+4 <= genHdr {
			ins = append(ins, asm.StoreImm(asm.R2, int16(off), int64(int32(binary.NativeEndian.Uint32(frame[off:]))), asm.Word))
			off += 2
		} else {
			ins = append(ins, asm.StoreImm(asm.R2, int16(off), int64(int16(binary.NativeEndian.Uint16(frame[off:]))), asm.Half))
		}
	}
	ins = append(ins,
		asm.HostTo(asm.BE, asm.R7, asm.DWord),
		asm.StoreMem(asm.R2, genStamp, asm.R7, asm.DWord),
		asm.Xor.Imm(asm.R7, -1),
		asm.StoreMem(asm.R2, genStamp+8, asm.R7, asm.DWord),
		asm.Mov.Imm(asm.R1, int32(ifindex)),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Return(),
		asm.Mov.Imm(asm.R0, xdpDrop).WithSymbol("drop"),
		asm.Return(),
	)
	return ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "Dual MIT/GPL", Instructions: ins})
}

// frameSender is benchSender's default: frames into XDPBENCH_IF (with the
// MAC XDPBENCH_DSTMAC as destination) for XDPBENCH_SECONDS at
// XDPBENCH_RATE (0: as fast as it goes), ordinals in turn by run; it
// prints how many it sent. A run costs about a millisecond of setup here,
// so paced runs are 256 frames (flushed to cv 64 at a time) and
// unpaced ones 16384.
func frameSender() {
	iface, err := net.InterfaceByName(os.Getenv("XDPBENCH_IF"))
	if err != nil {
		panic(err)
	}
	dst, err := net.ParseMAC(os.Getenv("XDPBENCH_DSTMAC"))
	if err != nil {
		panic(err)
	}
	rate, _ := strconv.Atoi(os.Getenv("XDPBENCH_RATE"))
	secs, _ := strconv.ParseFloat(os.Getenv("XDPBENCH_SECONDS"), 64)
	frames := genFrames(iface.HardwareAddr, dst)
	var progs []*ebpf.Program
	for _, f := range frames {
		p, err := genProgram(f, iface.Index)
		if err != nil {
			panic(err)
		}
		progs = append(progs, p)
	}
	batch := uint32(16384)
	var per time.Duration
	if rate > 0 {
		batch = 256
		per = time.Duration(float64(time.Second) * float64(batch) / float64(rate))
	}
	var sent uint64
	start := time.Now()
	end, next := start.Add(time.Duration(secs*float64(time.Second))), start
	for i := 0; time.Now().Before(end); i++ {
		if per > 0 {
			if d := time.Until(next); d > 0 {
				time.Sleep(d)
			}
			next = next.Add(per)
		}
		k := i % len(frames)
		if _, err := progs[k].Run(&ebpf.RunOptions{Data: frames[k], Repeat: batch, BatchSize: 64,
			Flags: unix.BPF_F_TEST_XDP_LIVE_FRAMES}); err != nil {
			panic(fmt.Sprintf("live frames: %v", err))
		}
		sent += uint64(batch)
	}
	fmt.Println(sent)
}

// monoNow is CLOCK_MONOTONIC in ns, the generator's bpf_ktime_get_ns.
func monoNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
