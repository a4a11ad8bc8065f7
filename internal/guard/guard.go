// Package guard re-validates jobs where they cross a hop. Every message on
// NATS is input: whoever published it, a service checks what it reads
// against the configuration before it spends budget or calls a provider.
//
// Two signatures, HMAC-SHA256 under one fleet key kept in the fleet bucket
// (written only by the operator identity), carry what is too costly to
// recompute at every hop:
//
//   - the seal: ingest (or whoever recomputed it) binds the job's estimate
//     to its tenant, provider, model and the hash of its request body. The
//     tokenizer costs milliseconds on a long prompt; a seal check costs
//     microseconds. Admission recomputes an estimate only when the seal
//     does not verify, and never lets it below what the request can cost.
//   - the reservation signature: admission binds the reservation (tokens,
//     requests, send instant, validity) to the seal. An executor sends a
//     call only on a reservation it can verify; any other goes back to
//     admission, which checks it from scratch.
//
// A message that can never be valid (an unknown tenant or model, a
// request the limits refuse, an id that is not a canonical UUID) ends the
// job with a failed result; it is never redelivered forever.
package guard

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/keys"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/clip"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// KeyName is the fleet key's key in the fleet bucket (streams.BucketFleet).
const KeyName = "key"

// LegacyKeyName is where the fleet key was kept before it had a bucket of
// its own: in the budgets bucket, which the admission and executor roles
// may write. EnsureKey copies it from there once.
const LegacyKeyName = keys.LegacyFleetKey

// keySize is the fleet key's length.
const keySize = 32

// MaxValidity bounds how long a reservation may stay valid after it was
// made, whatever its message says (or twice the configured plan horizon,
// dispatch grace and send tolerance, if longer): they are far below it.
const MaxValidity = time.Minute

// MaxNotBefore bounds how far ahead a job may ask to wait (a retry delay or
// a hold), whatever its message says.
const MaxNotBefore = time.Hour

// MaxAttempts bounds the attempts a job may list.
const MaxAttempts = 1000

// ErrUnverified is a job whose seal or reservation does not verify: it goes
// back to admission, which checks it from scratch.
var ErrUnverified = errors.New("reservation does not verify")

// ErrUnbounded is a reservation admission signed that is out of the
// bounds the guard allows (a configuration changed between placement and
// the call, or a bug): it is ErrUnverified, and as admission did reserve
// it, what it holds goes back to the schedule.
var ErrUnbounded = fmt.Errorf("%w: signed, but out of bounds", ErrUnverified)

// LoadKey returns the fleet key from the fleet bucket, creating it on
// first use (services may only read it: a node holding the operator's
// identity makes it first, with EnsureKey).
func LoadKey(ctx context.Context, fleet jetstream.KeyValue) ([]byte, error) {
	return loadKey(ctx, fleet, nil)
}

// EnsureKey is LoadKey for the identity that may write the fleet bucket:
// when the bucket has no key yet, a valid one in legacy (the budgets
// bucket, as an older fleet kept it) is carried over, so jobs sealed and
// reservations signed before an upgrade still verify; else a new key is
// made. legacy may be nil.
func EnsureKey(ctx context.Context, fleet, legacy jetstream.KeyValue) ([]byte, error) {
	return loadKey(ctx, fleet, legacy)
}

func loadKey(ctx context.Context, fleet, legacy jetstream.KeyValue) ([]byte, error) {
	// On a cluster a read may be served by a replica that has not applied
	// another node's create yet: the key exists but is not found. Read
	// again, a little later each time, for up to about 10 s.
	for try := range keyTries {
		if try > 0 {
			select {
			case <-time.After(min(time.Duration(try)*100*time.Millisecond, time.Second)):
			case <-ctx.Done():
				return nil, fmt.Errorf("fleet key: %w", ctx.Err())
			}
		}
		e, err := fleet.Get(ctx, KeyName)
		if err == nil {
			if len(e.Value()) != keySize {
				return nil, fmt.Errorf("fleet key in bucket %s is malformed (%d bytes, want %d): delete it with the operator's identity and restart every node", fleet.Bucket(), len(e.Value()), keySize)
			}
			return e.Value(), nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("read fleet key: %w", err)
		}
		key := make([]byte, keySize)
		_, _ = rand.Read(key)
		if legacy != nil {
			if old, err := legacy.Get(ctx, LegacyKeyName); err == nil && len(old.Value()) == keySize {
				key = old.Value()
			}
		}
		if _, err := fleet.Create(ctx, KeyName, key); err == nil {
			return key, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("create fleet key: %w", err)
		}
	}
	return nil, errors.New("fleet key: could not read or create it")
}

// keyTries bounds loadKey's reads.
const keyTries = 15

// Guard checks jobs against the configuration in effect.
type Guard struct {
	live     *config.Live
	lim      job.Limits
	key      []byte
	maxValid time.Duration
	macs     *sync.Pool // of *macState under key
}

// New returns a guard for cfg with the fleet key.
func New(cfg *config.Config, key []byte) *Guard { return NewLive(config.NewLive(cfg), key) }

// NewLive returns a guard for the configuration live holds, which a
// reload may replace (its limits and admission timings stay those it
// started with: they need a restart).
func NewLive(live *config.Live, key []byte) *Guard {
	cfg := live.Load()
	a := cfg.Admission
	return &Guard{live: live, lim: job.Limits{MaxBodyBytes: cfg.Limits.MaxBodyBytes, MaxTokens: cfg.Limits.MaxTokens}, key: key,
		maxValid: max(MaxValidity, 2*(a.DispatchGrace.D()+a.PlanHorizon.D()+a.SendTolerance.D())),
		macs:     &sync.Pool{New: func() any { return &macState{h: hmac.New(sha256.New, key)} }}}
}

// Limits are the request limits the guard enforces.
func (g *Guard) Limits() job.Limits { return g.lim }

// macState is an HMAC under the fleet key and the message it will take,
// reused (Guard.macs): a job's seal and signature are computed about five
// times on its way, and a new HMAC and a conversion of every string were
// most of their cost (issue 39). The message is what it always was: each
// string length-prefixed and each number fixed-width, big-endian, in order
// (TestMACEncoding).
type macState struct {
	h   hash.Hash
	msg []byte
	sum [sha256.Size]byte
}

func (g *Guard) mac() *macState {
	m := g.macs.Get().(*macState)
	m.h.Reset()
	m.msg = m.msg[:0]
	return m
}

// done returns the MAC of m's message, base64 (raw URL alphabet), and
// gives m back.
func (g *Guard) done(m *macState) string {
	m.h.Write(m.msg)
	out := base64.RawURLEncoding.EncodeToString(m.h.Sum(m.sum[:0]))
	g.macs.Put(m)
	return out
}

func (m *macState) str(s string) {
	m.int(int64(len(s)))
	m.msg = append(m.msg, s...)
}

func (m *macState) int(v int64) { m.msg = binary.BigEndian.AppendUint64(m.msg, uint64(v)) }

// units writes unit amounts in name order; nothing when there are none,
// so seals and signatures of jobs without units are what they were before
// units existed.
func (m *macState) units(units map[string]int) {
	if len(units) == 0 {
		return
	}
	m.str("units")
	m.int(int64(len(units)))
	for _, name := range job.UnitNames(units) {
		m.str(name)
		m.int(int64(units[name]))
	}
}

func (g *Guard) seal(j *task.Task) string {
	m := g.mac()
	m.str("seal/1")
	m.str(j.ID)
	m.str(j.Tenant)
	m.str(j.Provider)
	m.str(j.Model)
	m.str(j.Endpoint)
	if e := j.Estimate; e != nil {
		m.int(int64(e.PromptTokens))
		m.int(int64(e.MaxTokens))
		m.units(e.Units)
	}
	body := sha256.Sum256(j.Request)
	m.msg = append(m.msg, body[:]...)
	return g.done(m)
}

// Seal signs the job's estimate (call it after setting the estimate,
// provider, model and request).
func (g *Guard) Seal(j *task.Task) { j.Seal = g.seal(j) }

// Sealed reports whether the job's seal verifies.
func (g *Guard) Sealed(j *task.Task) bool {
	return j.Seal != "" && j.Estimate != nil && hmac.Equal([]byte(j.Seal), []byte(g.seal(j)))
}

func (g *Guard) sign(j *task.Task) string {
	r := j.Reservation
	m := g.mac()
	m.str("reservation/1")
	m.str(j.Seal)
	m.str(r.ID)
	m.int(int64(r.Requests))
	m.int(int64(r.Tokens))
	m.units(r.Units)
	if r.Output != 0 || r.Cached != 0 {
		m.str("split")
		m.int(int64(r.Output))
		m.int(int64(r.Cached))
	}
	m.int(r.ReservedAt.UnixNano())
	m.int(r.ValidUntil.UnixNano())
	m.int(r.SendAt.UnixNano())
	if !r.SendFrom.IsZero() {
		m.str("from")
		m.int(r.SendFrom.UnixNano())
	}
	return g.done(m)
}

// Sign signs the job's reservation (admission, after reserving).
func (g *Guard) Sign(j *task.Task) { j.Reservation.Sig = g.sign(j) }

// Floor is the least a job's request can cost: its prompt (or input)
// counted with the tokenizer and the output it asks for (n choices of the
// output limit, or the configured default).
func (g *Guard) Floor(j *task.Task) (job.Estimate, error) {
	_, est, err := tokens.Estimate(j.Endpoint, j.Request, g.lim, g.live.Load().Limits.DefaultMaxTokens)
	return est, err
}

// Queued checks a job read from QUEUE before admission holds it. It
// returns a *job.ValidationError for a job that can never run, and
// corrects what a retry could not fix but Sluice can: an estimate that does
// not verify is recomputed (never lowered), a hold too far ahead is
// shortened. corrected reports the estimate was recomputed.
func (g *Guard) Queued(j *task.Task, now time.Time) (corrected bool, err error) {
	model, sealed, err := g.static(j)
	if err != nil {
		return false, err
	}
	want, err := UnitCost(j.Cost, model, false)
	if err != nil {
		return false, err
	}
	if !sealed {
		floor, err := g.Floor(j)
		if err != nil {
			return false, err
		}
		if e := j.Estimate; e != nil {
			floor.PromptTokens = max(floor.PromptTokens, e.PromptTokens)
			floor.MaxTokens = max(floor.MaxTokens, e.MaxTokens)
			floor.Units = e.Units
		}
		floor.Units = coverUnits(floor.Units, want, model)
		j.Estimate = &floor
		g.Seal(j)
		corrected = true
	} else if units := coverUnits(j.Estimate.Units, want, model); !sameUnits(units, j.Estimate.Units) {
		// Sealed for other units (the model's configuration changed):
		// every unit the model limits now is reserved, none lowered.
		e := *j.Estimate
		e.Units = units
		j.Estimate = &e
		g.Seal(j)
		corrected = true
	}
	if nb := j.NotBefore; nb != nil && nb.After(now.Add(MaxNotBefore)) {
		t := now.Add(MaxNotBefore).UTC()
		j.NotBefore = &t
	}
	j.Reservation = nil
	return corrected, nil
}

// Dispatched checks a job read from DISPATCH before the executor calls
// the provider: the job must be valid as Queued requires, and its seal and
// reservation must verify (else ErrUnverified: admit it again).
func (g *Guard) Dispatched(j *task.Task) error {
	model, sealed, err := g.static(j)
	if err != nil {
		return err
	}
	r := j.Reservation
	switch {
	case r == nil, !sealed, r.Sig == "", !hmac.Equal([]byte(r.Sig), []byte(g.sign(j))):
		return ErrUnverified
	}
	// The bounds are in the reservation's own units, its parts as the
	// ledger holds them (budget.Rule.Check): the prompt as placed
	// (calib.Placed, the estimate at a correction in calib's range), of
	// which a warm prefix's share may be held as cached.
	lo, hi := calib.PlacedRange(j.Estimate.PromptTokens)
	if model.Rule().Check(j, lo, hi) != "" || r.ValidUntil.Sub(r.ReservedAt) > g.maxValid {
		return ErrUnbounded
	}
	// Every unit the model limits is estimated and reserved.
	for name := range model.Units {
		est, ok := j.Estimate.Units[name]
		if !ok || r.Units[name] < est {
			return ErrUnbounded
		}
	}
	return nil
}

// UnitCost resolves a job's stated cost (task.Task.Cost) against its model:
// every unit the model limits, at the amount stated or
// job.DefaultUnitCost; nil for a model without units. Strict (ingest, where
// the producer chose the model) refuses a unit the model does not limit;
// otherwise (a fallback to another model) such a unit costs nothing. A
// cost above the unit's whole minute can never be admitted:
// request_too_large.
func UnitCost(stated map[string]int, model *config.Model, strict bool) (map[string]int, error) {
	if strict {
		for _, name := range job.UnitNames(stated) {
			if _, ok := model.Units[name]; !ok {
				limits := "it limits no units"
				if len(model.Units) > 0 {
					limits = "it limits " + strings.Join(model.UnitNames(), ", ")
				}
				return nil, &job.ValidationError{Code: job.CodeInvalidRequest, Field: "cost." + name,
					Message: fmt.Sprintf("model %q does not limit unit %q (%s)", clip.String(model.Name, 64), clip.String(name, 64), limits)}
			}
		}
	}
	if len(model.Units) == 0 {
		return nil, nil
	}
	out := make(map[string]int, len(model.Units))
	for _, name := range model.UnitNames() {
		n, ok := stated[name]
		if !ok {
			n = job.DefaultUnitCost
		}
		if limit := model.Units[name]; limit > 0 && n > limit {
			return nil, &job.ValidationError{Code: job.CodeTooLarge, Field: "cost." + name,
				Message: fmt.Sprintf("is %d; model %q allows %d %s per minute", n, clip.String(model.Name, 64), limit, name)}
		}
		out[name] = max(n, 0)
	}
	return out, nil
}

// coverUnits returns, for every unit the model limits, the larger of have
// and want (nil when the model limits none).
func coverUnits(have, want map[string]int, model *config.Model) map[string]int {
	if len(model.Units) == 0 {
		return nil
	}
	out := make(map[string]int, len(model.Units))
	for name := range model.Units {
		out[name] = max(have[name], want[name])
	}
	return out
}

func sameUnits(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for name, n := range a {
		if m, ok := b[name]; !ok || m != n {
			return false
		}
	}
	return true
}

// static checks what needs no signature: the envelope, the tenant, the
// model and the request against the limits. The request body is parsed
// only when the seal does not verify: a seal binds the body's hash to the
// tenant, provider, model and endpoint, and only a holder of the fleet key
// that checked the body (ingest, or admission's Queued) makes one. A large
// prompt is the costliest thing a hop parses, and this hop parsed it twice
// (the checks, then the model name) before.
func (g *Guard) static(j *task.Task) (model *config.Model, sealed bool, err error) {
	if j.ID == "" || !job.CanonicalID(j.ID) {
		return nil, false, &job.ValidationError{Code: job.CodeInvalidRequest, Field: "id", Message: "must be a UUID in canonical form"}
	}
	sealed = g.Sealed(j)
	check := j.CheckEnvelope
	if !sealed {
		check = func() error { return j.Check(g.lim) }
	}
	if err := check(); err != nil {
		return nil, false, err
	}
	if _, ok := g.live.Load().Tenant(j.Tenant); !ok {
		return nil, false, &job.ValidationError{Code: job.CodeUnknownTenant, Field: "tenant", Message: fmt.Sprintf("unknown tenant %q", clip.String(j.Tenant, 64))}
	}
	model = g.configured(j.Provider, j.Model)
	if model == nil {
		return nil, false, &job.ValidationError{Code: job.CodeUnknownModel, Field: "model", Message: fmt.Sprintf("%q/%q is not a configured provider and model", clip.String(j.Provider, 64), clip.String(j.Model, 64))}
	}
	if !sealed {
		name, err := requestModel(j)
		if err != nil {
			return nil, false, err
		}
		if name != j.Model {
			return nil, false, &job.ValidationError{Code: job.CodeInvalidRequest, Field: "request.model", Message: fmt.Sprintf("is %q but the job is routed to %q", clip.String(name, 64), clip.String(j.Model, 64))}
		}
	}
	if e := j.Estimate; e != nil && (e.PromptTokens < 0 || e.MaxTokens < 0) {
		j.Estimate, sealed = nil, false // recomputed by Queued; Dispatched finds no seal
	}
	if j.RateLimited < 0 {
		j.RateLimited = 0
	}
	if len(j.Attempts) > MaxAttempts {
		return nil, false, &job.ValidationError{Code: job.CodeInvalidRequest, Field: "attempts", Message: fmt.Sprintf("lists %d attempts; at most %d", len(j.Attempts), MaxAttempts)}
	}
	return model, sealed, nil
}

// requestModel is the model the job's request names (Check has parsed it
// once already; this second parse reads only what it needs).
func requestModel(j *task.Task) (string, error) {
	if j.Endpoint == job.EndpointEmbeddings {
		r, err := job.ParseEmbeddings(j.Request)
		if err != nil {
			return "", err
		}
		return r.Model, nil
	}
	var r struct {
		Model string `json:"model"`
	}
	if err := json.Unmarshal(j.Request, &r); err != nil {
		return "", &job.ValidationError{Code: job.CodeInvalidRequest, Field: "request", Message: "malformed body"}
	}
	return r.Model, nil
}

func (g *Guard) configured(provider, model string) *config.Model {
	app := g.live.Load()
	for i := range app.Providers {
		p := &app.Providers[i]
		if p.Name != provider {
			continue
		}
		for k := range p.Models {
			if p.Models[k].Name == model {
				return &p.Models[k]
			}
		}
	}
	return nil
}
