package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/natstest"
)

// netLab is a small network of our own: n hosts, each a network namespace
// with one address, joined by a bridge that lives in a namespace of its
// own (so the machine's firewall never sees their traffic), plus a link
// from the test's namespace to the bridge. The addresses are in
// 198.18.0.0/15, the range set aside for benchmarking networks. Cutting a
// host off gives it and the others blackhole routes to each other: nothing
// crosses, the connections between them fail and new ones cannot be made,
// while the test's namespace still reaches every host. (A silent drop on
// the wire would need tc actions, which kernels like this sandbox's lack.)
type netLab struct {
	t      testing.TB
	id     string
	subnet string // "198.18.N"
}

// newNetLab builds the lab, or says why it cannot (not root, no ip(8),
// namespaces not allowed); the test then falls back to what it can do.
// Everything is removed when the test ends.
func newNetLab(t testing.TB, n int) (*netLab, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		return nil, errors.New("not root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("ip (iproute2) not installed")
	}
	// A lab whose test was killed (a CI timeout) stays behind; its owner's
	// process id is in its name, so the next lab removes it, and never
	// takes a subnet the machine already has.
	removeStaleLabs()
	used, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	l := &netLab{t: t, id: labID(os.Getpid(), rand.N(256))}
	for range 256 {
		l.subnet = fmt.Sprintf("198.18.%d", rand.N(256))
		if !strings.Contains(string(used), " "+l.subnet+".") {
			break
		}
	}
	hub := l.hub()
	var nss []string
	t.Cleanup(func() {
		for _, ns := range nss {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
		_ = exec.Command("ip", "link", "del", "sl"+l.id+"-r").Run()
	})
	run := func(args ...string) error {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	steps := [][]string{
		{"netns", "add", hub},
		{"-n", hub, "link", "add", "br0", "type", "bridge"},
		{"-n", hub, "link", "set", "br0", "up"},
		{"link", "add", "sl" + l.id + "-r", "type", "veth", "peer", "name", "sl" + l.id + "-rh"},
		{"link", "set", "sl" + l.id + "-rh", "netns", hub},
		{"-n", hub, "link", "set", "sl" + l.id + "-rh", "master", "br0", "up"},
		{"addr", "add", l.hostIP() + "/24", "dev", "sl" + l.id + "-r"},
		{"link", "set", "sl" + l.id + "-r", "up"},
	}
	for i := range n {
		ns, e, h := l.ns(i), fmt.Sprintf("sl%s-e%d", l.id, i), fmt.Sprintf("sl%s-h%d", l.id, i)
		steps = append(steps,
			[]string{"netns", "add", ns},
			[]string{"link", "add", e, "type", "veth", "peer", "name", h},
			[]string{"link", "set", e, "netns", ns},
			[]string{"link", "set", h, "netns", hub},
			[]string{"-n", hub, "link", "set", h, "master", "br0", "up"},
			[]string{"-n", ns, "link", "set", "lo", "up"},
			[]string{"-n", ns, "addr", "add", l.ip(i) + "/24", "dev", e},
			[]string{"-n", ns, "link", "set", e, "up"},
		)
	}
	for _, s := range steps {
		if s[0] == "netns" && s[1] == "add" {
			nss = append(nss, s[2])
		}
		if err := run(s...); err != nil {
			return nil, err
		}
	}
	// Every host answers (a refused connection is an answer).
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var err error
		answers := natstest.Poll(ctx, func() bool {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", l.ip(i)+":9", 500*time.Millisecond); err == nil {
				c.Close()
			}
			return err == nil || errors.Is(err, syscall.ECONNREFUSED)
		})
		cancel()
		if !answers {
			return nil, fmt.Errorf("host %s does not answer: %v", l.ip(i), err)
		}
	}
	return l, nil
}

// labID names a lab after its owner's process id (hex) and a random byte:
// sl<pid>x<rr>-…, which keeps every interface name within the kernel's 15
// characters.
func labID(pid, r int) string { return fmt.Sprintf("%xx%02x", pid, r) }

// labName matches a lab's namespaces and root-side link: its id, and the
// owner's process id.
var labName = regexp.MustCompile(`^sl(([0-9a-f]+)x[0-9a-f]{2})-(hub|n[0-9]+|r)$`)

// removeStaleLabs deletes the namespaces and links of labs whose owner
// process is gone.
func removeStaleLabs() {
	dead := func(name string) (id string, ok bool) {
		m := labName.FindStringSubmatch(name)
		if m == nil {
			return "", false
		}
		pid, err := strconv.ParseInt(m[2], 16, 32)
		if err != nil || pid <= 0 {
			return "", false
		}
		return m[1], errors.Is(syscall.Kill(int(pid), 0), syscall.ESRCH)
	}
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if id, ok := dead(name); ok {
			_ = exec.Command("ip", "netns", "del", name).Run()
			_ = exec.Command("ip", "link", "del", "sl"+id+"-r").Run()
		}
	}
	out, _ = exec.Command("ip", "-o", "link", "show").Output()
	for _, line := range strings.Split(string(out), "\n") {
		// "7: sl1a2bx0c-r@if6: <...>"
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if _, ok := dead(name); ok {
			_ = exec.Command("ip", "link", "del", name).Run()
		}
	}
}

func (l *netLab) hub() string         { return "sl" + l.id + "-hub" }
func (l *netLab) ns(i int) string     { return fmt.Sprintf("sl%s-n%d", l.id, i) }
func (l *netLab) hostIP() string      { return l.subnet + ".1" }
func (l *netLab) ip(i int) string     { return fmt.Sprintf("%s.%d", l.subnet, 11+i) }
func (l *netLab) exec(i int) []string { return []string{"ip", "netns", "exec", l.ns(i)} }
func (l *netLab) String() string {
	return "network namespaces " + l.ns(0) + "… on " + l.subnet + ".0/24"
}

// isolate cuts host i off from the other hosts of n (or heals the cut):
// each side's packets to the other are dropped. The test's namespace still
// reaches every host.
func (l *netLab) isolate(i, n int, cut bool) {
	l.t.Helper()
	verb := "add"
	if !cut {
		verb = "del"
	}
	for j := range n {
		if j == i {
			continue
		}
		for _, r := range [][2]int{{i, j}, {j, i}} {
			args := []string{"-n", l.ns(r[0]), "route", verb, "blackhole", l.ip(r[1]) + "/32"}
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				l.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
	}
}

// A lab left behind by a killed test is removed by the next one: its
// namespaces and its link, and only those of a process that is gone.
func TestStaleLabsRemoved(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip (iproute2)")
	}
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	stale, live := labID(gone.Process.Pid, 1), labID(os.Getpid(), 2)
	t.Cleanup(func() {
		for _, id := range []string{stale, live} {
			_ = exec.Command("ip", "netns", "del", "sl"+id+"-n0").Run()
			_ = exec.Command("ip", "link", "del", "sl"+id+"-r").Run()
		}
	})
	for _, id := range []string{stale, live} {
		for _, args := range [][]string{{"netns", "add", "sl" + id + "-n0"}, {"link", "add", "sl" + id + "-r", "type", "veth", "peer", "name", "sl" + id + "-rh"}} {
			if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
				t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
			}
		}
	}
	removeStaleLabs()
	has := func(args ...string) bool { return exec.Command("ip", args...).Run() == nil }
	if has("netns", "exec", "sl"+stale+"-n0", "true") || has("link", "show", "sl"+stale+"-r") {
		t.Errorf("the lab of a process that is gone (%s) is still there", stale)
	}
	if !has("netns", "exec", "sl"+live+"-n0", "true") || !has("link", "show", "sl"+live+"-r") {
		t.Errorf("the lab of a live process (%s) was removed", live)
	}
}
