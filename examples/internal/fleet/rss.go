package fleet

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// sampleRSS reads each process's VmRSS from /proc (0 where it cannot).
func sampleRSS(pids []int) []int64 {
	out := make([]int64, len(pids))
	for i, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue
		}
		for line := range bytes.Lines(b) {
			if v, ok := bytes.CutPrefix(line, []byte("VmRSS:")); ok {
				f := bytes.Fields(v)
				if len(f) > 0 {
					kb, _ := strconv.ParseInt(string(f[0]), 10, 64)
					out[i] = kb << 10
				}
			}
		}
	}
	return out
}

func procName(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return "?"
	}
	return string(bytes.TrimSpace(b))
}

func rssDelta(pids []int, before, after []int64) []RSS {
	var out []RSS
	for i, pid := range pids {
		out = append(out, RSS{PID: pid, Name: procName(pid), Before: before[i], After: after[i]})
	}
	return out
}
