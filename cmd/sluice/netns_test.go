package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
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
	l := &netLab{t: t, id: fmt.Sprintf("%04x", rand.N(1<<16)), subnet: fmt.Sprintf("198.18.%d", rand.N(256))}
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
		deadline := time.Now().Add(5 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", l.ip(i)+":9", 500*time.Millisecond)
			if err == nil {
				c.Close()
				break
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("host %s does not answer: %v", l.ip(i), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return l, nil
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
