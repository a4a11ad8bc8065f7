package guard

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
)

// refMAC is the seal and signature encoding as written out by hand: every
// string and number length-prefixed or fixed-width, big-endian, in order.
// A node of another version must compute the same seals and signatures.
type refMAC struct{ h hash.Hash }

func (r refMAC) str(s string) {
	r.int(int64(len(s)))
	r.h.Write([]byte(s))
}

func (r refMAC) int(v int64) { r.h.Write(binary.BigEndian.AppendUint64(nil, uint64(v))) }

func (r refMAC) units(u map[string]int) {
	if len(u) == 0 {
		return
	}
	r.str("units")
	r.int(int64(len(u)))
	for _, name := range job.UnitNames(u) {
		r.str(name)
		r.int(int64(u[name]))
	}
}

func (r refMAC) sum() string { return base64.RawURLEncoding.EncodeToString(r.h.Sum(nil)) }

func refSeal(key []byte, j *task.Task) string {
	r := refMAC{hmac.New(sha256.New, key)}
	for _, s := range []string{"seal/1", j.ID, j.Tenant, j.Provider, j.Model, j.Endpoint} {
		r.str(s)
	}
	if e := j.Estimate; e != nil {
		r.int(int64(e.PromptTokens))
		r.int(int64(e.MaxTokens))
		r.units(e.Units)
	}
	body := sha256.Sum256(j.Request)
	r.h.Write(body[:])
	return r.sum()
}

func refSign(key []byte, j *task.Task) string {
	res := j.Reservation
	r := refMAC{hmac.New(sha256.New, key)}
	r.str("reservation/1")
	r.str(j.Seal)
	r.str(res.ID)
	r.int(int64(res.Requests))
	r.int(int64(res.Tokens))
	r.units(res.Units)
	if res.Output != 0 || res.Cached != 0 {
		r.str("split")
		r.int(int64(res.Output))
		r.int(int64(res.Cached))
	}
	r.int(res.ReservedAt.UnixNano())
	r.int(res.ValidUntil.UnixNano())
	r.int(res.SendAt.UnixNano())
	if !res.SendFrom.IsZero() {
		r.str("from")
		r.int(res.SendFrom.UnixNano())
	}
	return r.sum()
}

// Seals and signatures are the encoding above, whatever state the guard
// reuses to compute them, from many goroutines at once.
func TestMACEncoding(t *testing.T) {
	t.Parallel()
	cfg, err := config.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte(strings.Repeat("k", 32))
	g := New(cfg, key)
	at := time.Unix(1764770000, 123456789)
	tasks := []*task.Task{
		{Job: job.Job{ID: "a", Tenant: "t", Request: []byte(`{"model":"m"}`)}, Model: "m", Estimate: &job.Estimate{PromptTokens: 3, MaxTokens: 4},
			Reservation: &task.Reservation{ID: "9-0", Requests: 1, Tokens: 7, ReservedAt: at, ValidUntil: at.Add(time.Second)}},
		{Job: job.Job{ID: "b", Tenant: "u", Provider: "p", Endpoint: job.EndpointEmbeddings, Request: []byte(strings.Repeat("x", 5000))}, Model: "n",
			Estimate: &job.Estimate{PromptTokens: 1 << 40, MaxTokens: -1, Units: map[string]int{"images": 2, "audio": 1}},
			Reservation: &task.Reservation{ID: "", Requests: 0, Tokens: 5, Units: map[string]int{"images": 2}, Output: 3, Cached: 1,
				ReservedAt: at, ValidUntil: at, SendAt: at.Add(time.Millisecond), SendFrom: at}},
		{Job: job.Job{ID: "c", Tenant: "t"}, Reservation: &task.Reservation{ID: "1-0", Output: 1}},
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				for _, j := range tasks {
					c := *j
					c.Reservation = new(*j.Reservation)
					g.Seal(&c)
					if want := refSeal(key, &c); c.Seal != want {
						t.Errorf("job %s: seal %q, want %q", c.ID, c.Seal, want)
						return
					}
					g.Sign(&c)
					if want := refSign(key, &c); c.Reservation.Sig != want {
						t.Errorf("job %s: signature %q, want %q", c.ID, c.Reservation.Sig, want)
						return
					}
					if !g.Sealed(&c) == (c.Estimate != nil) {
						t.Errorf("job %s: Sealed %v with estimate %v", c.ID, g.Sealed(&c), c.Estimate)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkSealSign is a job's MACs on its way: sealed at ingest, the
// seal checked and the reservation signed at admission, both checked at
// the executor.
func BenchmarkSealSign(b *testing.B) {
	cfg, err := config.Parse(nil)
	if err != nil {
		b.Fatal(err)
	}
	g := New(cfg, []byte(strings.Repeat("k", 32)))
	at := time.Now()
	j := &task.Task{Job: job.Job{ID: job.NewID(), Tenant: "bench", Request: []byte(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`)},
		Model: "gpt-4o-mini", Estimate: &job.Estimate{PromptTokens: 14, MaxTokens: 16},
		Reservation: &task.Reservation{ID: "29123456-0", Requests: 1, Tokens: 30, ReservedAt: at, ValidUntil: at.Add(time.Second), SendAt: at}}
	b.ReportAllocs()
	for b.Loop() {
		g.Seal(j)
		_ = g.Sealed(j)
		g.Sign(j)
		_ = g.Sealed(j)
		_ = g.sign(j) == j.Reservation.Sig
	}
}
