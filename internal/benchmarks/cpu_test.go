// Where the machine's CPU went during a phase of a benchmark, by process.

package benchmarks

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/proxyfleet/proxyfleet/internal/testenv"
)

// cpuSample is the CPU time (user + system) used so far by this process and by each kind
// of server it started (by command name: temporal, kube-apiserver, etcd), read from /proc.
// Benchmarks take one before and one after a phase to say where the machine's CPU went.
type cpuSample map[string]time.Duration

func takeCPUSample() cpuSample {
	s := cpuSample{}
	if st, err := testenv.ReadProcStat(os.Getpid()); err == nil {
		s["test process"] = st.CPU
	}
	for _, st := range testenv.Children() {
		s[st.Comm] += st.CPU
	}
	return s
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
