package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Live is the configuration a running process applies: services read it
// with Load for every decision, a reload replaces it with Store, whole,
// never in parts. What a service derives from it (consumers, pools) it
// remakes when Next's channel closes.
type Live struct {
	p    atomic.Pointer[Config]
	mu   sync.Mutex
	next chan struct{}
}

// NewLive holds c.
func NewLive(c *Config) *Live {
	l := &Live{next: make(chan struct{})}
	l.p.Store(c)
	return l
}

// Load returns the configuration in effect.
func (l *Live) Load() *Config { return l.p.Load() }

// Or is the configuration in effect, or fallback when l is nil (a
// service built without a live configuration: tests).
func (l *Live) Or(fallback *Config) *Config {
	if l == nil {
		return fallback
	}
	return l.p.Load()
}

// Store puts c in effect and wakes those waiting on Next.
func (l *Live) Store(c *Config) {
	l.p.Store(c)
	l.mu.Lock()
	close(l.next)
	l.next = make(chan struct{})
	l.mu.Unlock()
}

// Next is closed by the next Store (never, when l is nil).
func (l *Live) Next() <-chan struct{} {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}

// Provider finds a provider by name.
func (c *Config) Provider(name string) (*Provider, bool) {
	for i := range c.Providers {
		if c.Providers[i].Name == name {
			return &c.Providers[i], true
		}
	}
	return nil, false
}

// Hash identifies a configuration file's content in reload notices and
// logs: the first 12 hex digits of its SHA-256.
func Hash(data []byte) string {
	h := sha256.Sum256(data)
	return hex.EncodeToString(h[:6])
}

// Reloadable are the top-level keys a reload applies; a change anywhere
// else needs a restart (see Restart).
var Reloadable = []string{"tenants", "providers", "routes", "retry"}

// Restart names the keys whose change from old to c a running process
// cannot apply: everything outside Reloadable (listeners, NATS, stream
// bounds, limits, admission, streaming, cache settings). Empty: c may
// replace old live.
func (c *Config) Restart(old *Config) []string {
	return slices.DeleteFunc(c.Changes(old), func(k string) bool {
		top, _, _ := strings.Cut(k, ".")
		top, _, _ = strings.Cut(top, "[")
		return slices.Contains(Reloadable, top)
	})
}

// Changes are the key paths where c differs from old.
func (c *Config) Changes(old *Config) []string {
	var keys []string
	diff(reflect.ValueOf(*old), reflect.ValueOf(*c), "", &keys)
	return keys
}

// diff appends to keys the YAML key paths where a and b differ, down to
// the first map, slice or leaf that differs.
func diff(a, b reflect.Value, path string, keys *[]string) {
	if a.Kind() == reflect.Struct && a.Type().PkgPath() != "time" {
		for i := range a.NumField() {
			f := a.Type().Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			if path != "" {
				name = path + "." + name
			}
			diff(a.Field(i), b.Field(i), name, keys)
		}
		return
	}
	if a.Kind() == reflect.Slice && a.Len() == b.Len() && a.Type().Elem().Kind() == reflect.Struct {
		for i := range a.Len() {
			diff(a.Index(i), b.Index(i), fmt.Sprintf("%s[%d]", path, i), keys)
		}
		return
	}
	if !reflect.DeepEqual(a.Interface(), b.Interface()) {
		*keys = append(*keys, path)
	}
}

// RestartError says which keys a reload cannot apply.
func RestartError(keys []string) error {
	return fmt.Errorf("not reloaded: %s cannot change while running (restart to apply; the running configuration stays in effect; live keys: %s)",
		strings.Join(keys, ", "), strings.Join(Reloadable, ", "))
}
