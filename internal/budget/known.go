package budget

import (
	"sync"
)

// # The window a process wrote last
//
// Every placement on a schedule reads the window and writes it back under
// compare-and-set: two round trips to the KV on the way of every paced
// call. A process whose write is still the newest knows the window as it
// is, so it may place on its own copy and write at the revision it wrote:
// one round trip, the compare-and-set refusing a copy that someone else's
// write made stale. A stale copy costs a refused write before the usual
// read, so a process uses its copy of a key only while copies have mostly
// been current: it learns that from every write it makes, whether it read
// first (the revision read was the one it wrote last, or not) or not (the
// write went through, or not). A window that several processes write in
// turn is read first; one that an executor writes now and then is not.

// knownUse is the least share of current copies (smoothed over the last
// writes) at which a copy is used.
const knownUse = 0.6

// knownSmoothing is the weight of the latest write in that share.
const knownSmoothing = 0.2

type knownWindow struct {
	w   Window
	rev uint64 // 0: none kept (taken, or never written)
	// current is the smoothed share of writes whose copy was current;
	// seen, that one was counted.
	current float64
	seen    bool
}

type knownWindows struct {
	mu sync.Mutex
	m  map[string]*knownWindow
}

func (k *knownWindows) get(key string) *knownWindow {
	if k.m == nil {
		k.m = map[string]*knownWindow{}
	}
	c := k.m[key]
	if c == nil {
		c = &knownWindow{}
		k.m[key] = c
	}
	return c
}

// take removes key's copy and returns it if it is to be used (a copy is
// used by one write at a time), and the revision it was written at (0:
// none) either way.
func (k *knownWindows) take(key string) (w Window, rev uint64, use bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.get(key)
	w, rev = c.w, c.rev
	c.w, c.rev = Window{}, 0
	return w, rev, rev != 0 && (!c.seen || c.current >= knownUse)
}

// count records whether the copy was current at a write.
func (k *knownWindows) count(key string, current bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.get(key)
	x := 0.0
	if current {
		x = 1
	}
	if !c.seen {
		c.current, c.seen = x, true
		return
	}
	c.current += knownSmoothing * (x - c.current)
}

// keep records w as key's window at revision rev, written by this process.
func (k *knownWindows) keep(key string, w Window, rev uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c := k.get(key)
	c.w, c.rev = w, rev
}

// refresh records w as key's window at revision rev, written by this
// process outside a placement (a return), if placements keep a copy of key.
func (k *knownWindows) refresh(key string, w Window, rev uint64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c := k.m[key]; c != nil {
		c.w, c.rev = w, rev
	}
}
