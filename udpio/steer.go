package udpio

import (
	"fmt"

	"golang.org/x/net/bpf"
)

// retHash is what the program returns for "no CID here". The kernel treats
// any index ≥ the number of sockets in the group as "fall back to the
// 4-tuple hash" (net/core/sock_reuseport.c, run_bpf_filter).
const retHash = 0xffffffff

// program assembles the classic BPF steering program for s. The program
// runs on the UDP payload (the kernel pulls the UDP header before running
// it). A load past the end of the packet makes a classic BPF program return
// 0, which would pin short datagrams to socket 0, so every load is guarded
// by a length check against X = len.
func (s Steering) program() ([]bpf.Instruction, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	var p labelled
	p.emit(bpf.LoadExtension{Num: bpf.ExtLen}, bpf.TAX{})
	p.jump(bpf.JumpEqual, 0, "hash", "")
	p.emit(bpf.LoadAbsolute{Off: 0, Size: 1})
	if s.DTLS {
		p.jump(bpf.JumpEqual, dtlsCIDType, "", "notdtls")
		p.emit(bpf.TXA{})
		p.jump(bpf.JumpLessThan, uint32(dtlsCIDStart+s.CIDLen+2), "hash", "")
		p.emit(bpf.LoadAbsolute{Off: 1, Size: 1})
		p.jump(bpf.JumpEqual, 0xfe, "", "hash")
		p.emit(bpf.LoadAbsolute{Off: uint32(dtlsCIDStart + s.OrdinalOffset), Size: 1}, bpf.RetA{})
		p.label("notdtls")
	}
	if s.QUIC {
		p.jump(bpf.JumpBitsSet, 0x80, "long", "")
		p.emit(bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: 0xc0})
		p.jump(bpf.JumpEqual, 0x40, "", "hash")
		p.emit(bpf.TXA{})
		p.jump(bpf.JumpLessThan, uint32(quicShortStart+s.CIDLen), "hash", "")
		p.emit(bpf.LoadAbsolute{Off: uint32(quicShortStart + s.OrdinalOffset), Size: 1}, bpf.RetA{})
		p.label("long")
		p.emit(bpf.TXA{})
		p.jump(bpf.JumpLessThan, uint32(quicLongStart+s.CIDLen), "hash", "")
		p.emit(bpf.LoadAbsolute{Off: quicLongDCIDL, Size: 1})
		p.jump(bpf.JumpEqual, uint32(s.CIDLen), "", "hash")
		p.emit(bpf.LoadAbsolute{Off: uint32(quicLongStart + s.OrdinalOffset), Size: 1}, bpf.RetA{})
	}
	p.label("hash")
	p.emit(bpf.RetConstant{Val: retHash})
	return p.resolve()
}

// labelled is a tiny assembler that resolves forward jumps by label.
type labelled struct {
	ins    []bpf.Instruction
	labels map[string]int
	jumps  []pendingJump
}

type pendingJump struct {
	at          int
	ifTrue, ifF string // "" = next instruction
	always      bool   // bpf.Jump to ifTrue
}

func (p *labelled) emit(ins ...bpf.Instruction) { p.ins = append(p.ins, ins...) }

func (p *labelled) label(name string) {
	if p.labels == nil {
		p.labels = map[string]int{}
	}
	p.labels[name] = len(p.ins)
}

func (p *labelled) jump(cond bpf.JumpTest, val uint32, ifTrue, ifFalse string) {
	p.jumps = append(p.jumps, pendingJump{at: len(p.ins), ifTrue: ifTrue, ifF: ifFalse})
	p.ins = append(p.ins, bpf.JumpIf{Cond: cond, Val: val})
}

// jumpAlways emits an unconditional jump to label.
func (p *labelled) jumpAlways(label string) {
	p.jumps = append(p.jumps, pendingJump{at: len(p.ins), ifTrue: label, always: true})
	p.ins = append(p.ins, bpf.Jump{})
}

func (p *labelled) resolve() ([]bpf.Instruction, error) {
	for _, j := range p.jumps {
		skip := func(label string) (uint8, error) {
			if label == "" {
				return 0, nil
			}
			to, ok := p.labels[label]
			d := to - j.at - 1
			if !ok || d < 0 || d > 255 {
				return 0, fmt.Errorf("udpio: bpf jump to %q from %d unresolvable", label, j.at)
			}
			return uint8(d), nil
		}
		if j.always {
			d, err := skip(j.ifTrue)
			if err != nil {
				return nil, err
			}
			p.ins[j.at] = bpf.Jump{Skip: uint32(d)}
			continue
		}
		ji := p.ins[j.at].(bpf.JumpIf)
		var err error
		if ji.SkipTrue, err = skip(j.ifTrue); err != nil {
			return nil, err
		}
		if ji.SkipFalse, err = skip(j.ifF); err != nil {
			return nil, err
		}
		p.ins[j.at] = ji
	}
	return p.ins, nil
}

func assemble(ins []bpf.Instruction) ([]bpf.RawInstruction, error) {
	raw, err := bpf.Assemble(ins)
	if err != nil {
		return nil, fmt.Errorf("udpio: assembling steering program: %w", err)
	}
	return raw, nil
}
