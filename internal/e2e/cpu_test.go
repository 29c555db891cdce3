package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// cpuSample is the CPU time (user + system) used so far by this process and by each kind
// of server it started (by command name: temporal, kube-apiserver, etcd), read from /proc.
// Benchmarks take one before and one after a phase to say where the machine's CPU went.
type cpuSample map[string]time.Duration

// clockTick is the kernel's USER_HZ, 100 on every Linux this runs on.
const clockTick = 10 * time.Millisecond

func takeCPUSample() cpuSample {
	s := cpuSample{}
	self := os.Getpid()
	if _, _, cpu, ok := readStat(strconv.Itoa(self)); ok {
		s["test process"] = cpu
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, ppid, cpu, ok := readStat(e.Name())
		if ok && ppid == self {
			s[comm] += cpu
		}
	}
	return s
}

// readStat parses /proc/<pid>/stat: the command name, the parent and utime+stime.
func readStat(pid string) (comm string, ppid int, cpu time.Duration, ok bool) {
	raw, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return "", 0, 0, false
	}
	s := string(raw)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open {
		return "", 0, 0, false
	}
	// After ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
	f := strings.Fields(s[closing+1:])
	if len(f) < 13 {
		return "", 0, 0, false
	}
	ppid, _ = strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return s[open+1 : closing], ppid, time.Duration(ut+st) * clockTick, true
}

// since returns the CPU used by each process between two samples.
func (s cpuSample) since(before cpuSample) cpuSample {
	d := cpuSample{}
	for k, v := range s {
		d[k] = v - before[k]
	}
	return d
}

// cores formats each process's share of the CPU over d, in cores.
func (s cpuSample) cores(d time.Duration) string {
	names := make([]string, 0, len(s))
	for k := range s {
		names = append(names, k)
	}
	sort.Strings(names)
	var parts []string
	total := 0.0
	for _, k := range names {
		c := s[k].Seconds() / d.Seconds()
		total += c
		parts = append(parts, fmt.Sprintf("%s %.2f", k, c))
	}
	return fmt.Sprintf("%s (total %.2f)", strings.Join(parts, ", "), total)
}
