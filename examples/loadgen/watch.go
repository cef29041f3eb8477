package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is Linux's USER_HZ, the unit of utime and stime in
// /proc/PID/stat: 100 on every architecture Go supports.
const clockTick = 10 * time.Millisecond

// A procSample is what /proc says about the watched forwarder.
type procSample struct {
	user, system time.Duration
	rssKB        int64
	fds          int
}

// readProc samples process pid.
func readProc(pid int) (procSample, error) {
	var s procSample
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	if s.user, s.system, err = parseStat(b); err != nil {
		return s, err
	}
	if b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err != nil {
		return s, err
	}
	if s.rssKB, err = parseVmRSS(b); err != nil {
		return s, err
	}
	d, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.fds = len(d)
	return s, nil
}

// parseStat returns utime and stime (fields 14 and 15) of a /proc/PID/stat
// line. The command name (field 2) may hold spaces and parentheses, so
// fields are counted from the last ')'.
func parseStat(b []byte) (user, system time.Duration, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("loadgen: /proc stat: no command field")
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, 0, errors.New("loadgen: /proc stat: too few fields")
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("loadgen: /proc stat: %w", err)
	}
	return time.Duration(u) * clockTick, time.Duration(s) * clockTick, nil
}

// parseVmRSS returns the VmRSS line of /proc/PID/status in KiB.
func parseVmRSS(b []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("loadgen: /proc status: no VmRSS")
}

// scrapeMallocs reads the Go runtime's count of heap objects allocated
// from Go's heap profile in text form (/debug/pprof/heap?debug=1, its
// "# Mallocs =" line) or from a Prometheus endpoint
// (go_memstats_mallocs_total). The heap profile is the better gauge: what a
// request for it allocates is the same every time, so the cost of the
// scrape that falls inside the window subtracts out exactly, while a
// Prometheus scrape allocates a varying amount.
func scrapeMallocs(client *http.Client, url string) (float64, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	return parseMallocs(b)
}

func parseMallocs(b []byte) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		v, ok := strings.CutPrefix(l, "# Mallocs = ")
		if !ok {
			v, ok = strings.CutPrefix(l, "go_memstats_mallocs_total ")
		}
		if ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, errors.New("loadgen: no \"# Mallocs =\" or go_memstats_mallocs_total in the response")
}

// A watcher samples the forwarder at the start and end of the measured
// window, so its CPU and allocations line up with the datagrams counted.
type watcher struct {
	pid        int
	metricsURL string
	client     *http.Client

	start, end          procSample
	scrapeCost          float64 // objects one scrape itself allocates
	mallocs0, mallocs1  float64
	haveProc, haveAlloc bool
}

func (w *watcher) begin() error {
	if w.pid > 0 {
		s, err := readProc(w.pid)
		if err != nil {
			return fmt.Errorf("loadgen: watching pid %d: %w", w.pid, err)
		}
		w.start = s
	}
	if w.metricsURL != "" {
		w.client = &http.Client{Timeout: 2 * time.Second}
		// Scrapes back to back: the last difference is what a scrape
		// costs (the first ones warm the connection and the handler),
		// subtracted from the window's count.
		var a float64
		for i := range 3 {
			m, err := scrapeMallocs(w.client, w.metricsURL)
			if err != nil {
				return err
			}
			w.scrapeCost, a = m-a, m
			if i == 0 {
				w.scrapeCost = 0
			}
		}
		w.mallocs0 = a
	}
	return nil
}

func (w *watcher) finish() error {
	if w.pid > 0 {
		s, err := readProc(w.pid)
		if err != nil {
			return fmt.Errorf("loadgen: watching pid %d: %w", w.pid, err)
		}
		w.end, w.haveProc = s, true
	}
	if w.metricsURL != "" {
		m, err := scrapeMallocs(w.client, w.metricsURL)
		if err != nil {
			return err
		}
		w.mallocs1, w.haveAlloc = m, true
	}
	return nil
}

// mallocs is the number of heap objects the forwarder allocated in the
// window, less the one scrape that fell inside it.
func (w *watcher) mallocs() float64 { return max(0, w.mallocs1-w.mallocs0-w.scrapeCost) }
