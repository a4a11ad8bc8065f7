package guard_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluice-dev/sluice/internal/calib"
	"github.com/sluice-dev/sluice/internal/config"
	"github.com/sluice-dev/sluice/internal/guard"
	"github.com/sluice-dev/sluice/internal/task"
	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

const cfgYAML = `
providers:
  - name: openai
    base_url: http://127.0.0.1:1/v1
    models:
      - {name: gpt-4o-mini, rpm: 600, tpm: 200000}
      - {name: gpt-4o, rpm: 600, tpm: 200000}
      - {name: painter, rpm: 600, tpm: 200000, units: {images: 50, tasks: 0}}
  - name: anthropic
    kind: anthropic
    base_url: http://127.0.0.1:1/v1
    models:
      - {name: claude-x, rpm: 600, itpm: 200000, otpm: 80000}
tenants:
  - {name: acme, api_key_env: ACME_KEY}
limits: {max_tokens: 4096, default_max_tokens: 512}
`

func newGuard(t testing.TB) (*guard.Guard, *config.Config) {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	return guard.New(cfg, []byte(strings.Repeat("k", 32))), cfg
}

// request is a chat body of about words prompt words.
func request(model string, words int, extra string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]%s}`, model, strings.Repeat("lorem ipsum ", words/2), extra))
}

// ingested is a job as ingest hands it to QUEUE: estimated and sealed.
func ingested(g *guard.Guard, body json.RawMessage) *task.Task {
	j := &task.Task{Job: job.Job{ID: job.NewID(), Tenant: "acme", Priority: job.Standard, Request: body, Provider: "openai"}, Model: "gpt-4o-mini", SubmittedAt: time.Now().UTC()}
	_, est, err := tokens.Estimate("", body, job.DefaultLimits, 512)
	if err != nil {
		panic(err)
	}
	j.Estimate = &est
	g.Seal(j)
	return j
}

// admitted is a job as admission hands it to DISPATCH.
func admitted(g *guard.Guard, j *task.Task) *task.Task {
	now := time.Now().UTC()
	j.Reservation = &task.Reservation{ID: "1-0", Requests: 1, Tokens: j.Estimate.Cost(), ReservedAt: now, SendAt: now.Add(50 * time.Millisecond), ValidUntil: now.Add(65 * time.Millisecond)}
	g.Sign(j)
	return j
}

func TestQueuedKeepsASealedEstimate(t *testing.T) {
	g, _ := newGuard(t)
	j := ingested(g, request("gpt-4o-mini", 100, ""))
	want := *j.Estimate
	corrected, err := g.Queued(j, time.Now())
	if err != nil || corrected {
		t.Fatalf("Queued(sealed job) = %v, %v; want not corrected, nil", corrected, err)
	}
	if !reflect.DeepEqual(*j.Estimate, want) {
		t.Errorf("estimate = %+v, want %+v kept", *j.Estimate, want)
	}
}

// TestQueuedRecomputesForgedEstimates: an estimate that is not sealed is
// never believed below what the request can cost, whatever it says (the
// issue: 1 + 1 tokens on a 15,000-token request reserved 4 tokens; a
// negative one panicked admission).
func TestQueuedRecomputesForgedEstimates(t *testing.T) {
	g, _ := newGuard(t)
	body := request("gpt-4o-mini", 15000, `,"max_tokens":1000`)
	_, floor, _ := tokens.Estimate("", body, job.DefaultLimits, 512)
	if floor.PromptTokens < 10000 {
		t.Fatalf("test request counts %d prompt tokens; want a long one", floor.PromptTokens)
	}
	for _, tc := range []struct {
		name string
		est  *job.Estimate
		seal string
	}{
		{"tiny", &job.Estimate{PromptTokens: 1, MaxTokens: 1}, ""},
		{"negative", &job.Estimate{PromptTokens: -1 << 40, MaxTokens: -5}, ""},
		{"none", nil, ""},
		{"forged seal", &job.Estimate{PromptTokens: 1, MaxTokens: 1}, "AAAA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := ingested(g, body)
			j.Estimate, j.Seal = tc.est, tc.seal
			corrected, err := g.Queued(j, time.Now())
			if err != nil || !corrected {
				t.Fatalf("Queued = %v, %v; want corrected, nil", corrected, err)
			}
			if j.Estimate.PromptTokens < floor.PromptTokens || j.Estimate.MaxTokens < floor.MaxTokens {
				t.Errorf("estimate = %+v, want at least %+v", *j.Estimate, floor)
			}
			if !g.Sealed(j) {
				t.Error("recomputed estimate is not sealed")
			}
		})
	}
	// A sealed estimate that the request was changed under is recomputed too.
	j := ingested(g, request("gpt-4o-mini", 10, ""))
	j.Request = body
	if corrected, err := g.Queued(j, time.Now()); err != nil || !corrected || j.Estimate.PromptTokens < floor.PromptTokens {
		t.Errorf("request swapped under a seal: corrected=%v err=%v estimate=%+v; want recomputed to at least %+v", corrected, err, j.Estimate, floor)
	}
}

func TestQueuedRefusesWhatTheConfigForbids(t *testing.T) {
	g, _ := newGuard(t)
	for _, tc := range []struct {
		name      string
		mutate    func(*task.Task)
		wantCode  string
		wantField string
	}{
		{"unknown tenant", func(j *task.Task) { j.Tenant = "mallory" }, job.CodeUnknownTenant, "tenant"},
		{"unknown model", func(j *task.Task) { j.Model = "gpt-9"; j.Request = request("gpt-9", 10, "") }, job.CodeUnknownModel, "model"},
		{"unknown provider", func(j *task.Task) { j.Provider = "other" }, job.CodeUnknownModel, "model"},
		{"request names another model", func(j *task.Task) { j.Request = request("gpt-4o", 10, "") }, job.CodeInvalidRequest, "request.model"},
		{"max_tokens over the limit", func(j *task.Task) { j.Request = request("gpt-4o-mini", 10, `,"max_tokens":20000`) }, job.CodeInvalidRequest, "request.max_tokens"},
		// A body read two ways (Sluice's decoder folds case and takes the
		// last of two alike) does not pass re-validation either.
		{"model named twice", func(j *task.Task) {
			j.Request = json.RawMessage(`{"model":"gpt-4o","MODEL":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`)
		}, job.CodeInvalidRequest, "request"},
		{"max_tokens named twice", func(j *task.Task) { j.Request = request("gpt-4o-mini", 10, `,"max_tokens":20000,"MAX_TOKENS":1`) }, job.CodeInvalidRequest, "request"},
		{"braced id", func(j *task.Task) { j.ID = "{" + j.ID + "}" }, job.CodeInvalidRequest, "id"},
		{"urn id", func(j *task.Task) { j.ID = "urn:uuid:" + j.ID }, job.CodeInvalidRequest, "id"},
		{"no id", func(j *task.Task) { j.ID = "" }, job.CodeInvalidRequest, "id"},
		{"bad priority", func(j *task.Task) { j.Priority = "urgent" }, job.CodeInvalidRequest, "priority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := ingested(g, request("gpt-4o-mini", 10, ""))
			tc.mutate(j)
			_, err := g.Queued(j, time.Now())
			var ve *job.ValidationError
			if !errors.As(err, &ve) || ve.Code != tc.wantCode || ve.Field != tc.wantField {
				t.Fatalf("Queued = %v; want a %s error on %s", err, tc.wantCode, tc.wantField)
			}
			// The executor refuses the same job, reservation or not.
			admitted(g, j)
			if err := g.Dispatched(j); !errors.As(err, &ve) || ve.Code != tc.wantCode {
				t.Fatalf("Dispatched = %v; want a %s error", err, tc.wantCode)
			}
		})
	}
}

func TestQueuedBoundsHolds(t *testing.T) {
	g, _ := newGuard(t)
	j := ingested(g, request("gpt-4o-mini", 10, ""))
	now := time.Now()
	far := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	j.NotBefore, j.RateLimited = &far, -3
	if _, err := g.Queued(j, now); err != nil {
		t.Fatal(err)
	}
	if j.NotBefore.After(now.Add(guard.MaxNotBefore)) {
		t.Errorf("not_before = %s, want at most %s from now", j.NotBefore, guard.MaxNotBefore)
	}
	if j.RateLimited != 0 {
		t.Errorf("rate_limited = %d, want 0", j.RateLimited)
	}
}

// TestDispatchedVerifiesTheReservation: an executor sends only what
// admission reserved and signed; anything else goes back to admission.
func TestDispatchedVerifiesTheReservation(t *testing.T) {
	g, _ := newGuard(t)
	if err := g.Dispatched(admitted(g, ingested(g, request("gpt-4o-mini", 10, "")))); err != nil {
		t.Fatalf("Dispatched(admitted job) = %v, want nil", err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*task.Task)
	}{
		{"no reservation", func(j *task.Task) { j.Reservation = nil }},
		{"unsigned", func(j *task.Task) { j.Reservation.Sig = "" }},
		{"valid until 2099", func(j *task.Task) { j.Reservation.ValidUntil = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"send at moved", func(j *task.Task) { j.Reservation.SendAt = j.Reservation.SendAt.Add(-time.Second) }},
		{"fewer tokens", func(j *task.Task) { j.Reservation.Tokens = 1 }},
		{"estimate lowered", func(j *task.Task) { j.Estimate.PromptTokens = 1 }},
		{"bigger output asked", func(j *task.Task) { j.Request = request("gpt-4o-mini", 10, `,"max_tokens":4000`) }},
		{"other model", func(j *task.Task) { j.Model = "gpt-4o"; j.Request = request("gpt-4o", 10, "") }},
		{"signed by another fleet", func(j *task.Task) {
			other := guard.New(mustParse(t), []byte(strings.Repeat("x", 32)))
			other.Seal(j)
			other.Sign(j)
		}},
		{"signed too long", func(j *task.Task) {
			j.Reservation.ValidUntil = j.Reservation.ReservedAt.Add(time.Hour)
			g.Sign(j)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := admitted(g, ingested(g, request("gpt-4o-mini", 10, "")))
			tc.mutate(j)
			if err := g.Dispatched(j); !errors.Is(err, guard.ErrUnverified) {
				t.Fatalf("Dispatched = %v, want ErrUnverified", err)
			}
		})
	}
}

func mustParse(t testing.TB) *config.Config {
	cfg, err := config.Parse([]byte(cfgYAML))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// FuzzGuard: whatever a QUEUE or DISPATCH message holds, the guard does
// not panic; a job Queued accepts is sealed, costs at least what its
// request can, and is then refused by Dispatched until admission signs a
// reservation.
func FuzzGuard(f *testing.F) {
	g, _ := newGuard(f)
	seed := ingested(g, request("gpt-4o-mini", 20, `,"max_tokens":64`))
	data, _ := json.Marshal(admitted(g, seed))
	f.Add(data)
	f.Add([]byte(`{"id":"` + job.NewID() + `","tenant":"acme","provider":"openai","model":"gpt-4o-mini","estimate":{"prompt_tokens":-1,"max_tokens":-1},"request":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}}`))
	f.Add([]byte(`{"id":"{` + job.NewID() + `}","tenant":"acme","request":{"model":"gpt-4o-mini","messages":[]}}`))
	f.Add([]byte(`{"id":"` + job.NewID() + `","tenant":"acme","provider":"openai","model":"gpt-4o-mini","not_before":"2099-01-01T00:00:00Z","rate_limited":-9,"attempts":[{}],"request":{"model":"gpt-4o-mini","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"max_completion_tokens":9}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var j task.Task
		if json.Unmarshal(data, &j) != nil {
			return
		}
		_ = g.Dispatched(&j)
		now := time.Now()
		corrected, err := g.Queued(&j, now)
		if err != nil {
			var ve *job.ValidationError
			if !errors.As(err, &ve) || ve.Code == "" {
				t.Fatalf("Queued error %v (%T); want a *job.ValidationError with a code", err, err)
			}
			return
		}
		if !g.Sealed(&j) {
			t.Fatalf("accepted job is not sealed (corrected=%v)", corrected)
		}
		if err := j.Check(g.Limits()); err != nil {
			t.Fatalf("accepted job fails Check: %v", err)
		}
		if corrected {
			floor, err := g.Floor(&j)
			if err != nil {
				t.Fatalf("accepted job has no floor: %v", err)
			}
			if j.Estimate.PromptTokens < floor.PromptTokens || j.Estimate.MaxTokens < floor.MaxTokens {
				t.Fatalf("recomputed estimate %+v below the request's floor %+v", *j.Estimate, floor)
			}
		}
		if j.Estimate.PromptTokens < 0 || j.Estimate.MaxTokens < 0 {
			t.Fatalf("accepted estimate is negative: %+v", *j.Estimate)
		}
		if j.NotBefore != nil && j.NotBefore.After(now.Add(guard.MaxNotBefore)) {
			t.Fatalf("not_before %s beyond the bound", j.NotBefore)
		}
		if err := g.Dispatched(&j); !errors.Is(err, guard.ErrUnverified) {
			t.Fatalf("Dispatched(job without a signed reservation) = %v, want ErrUnverified", err)
		}
	})
}

// unitJob is a job for the painter model (images: 50 a minute, tasks
// counted) as ingest hands it to QUEUE, stating cost.
func unitJob(t *testing.T, g *guard.Guard, cfg *config.Config, cost map[string]int) *task.Task {
	t.Helper()
	j := ingested(g, request("painter", 10, ""))
	j.Model, j.Cost = "painter", cost
	_, m, _ := cfg.ModelRef("painter")
	units, err := guard.UnitCost(cost, m, true)
	if err != nil {
		t.Fatalf("UnitCost(%v): %v", cost, err)
	}
	j.Estimate.Units = units
	g.Seal(j)
	return j
}

func TestUnitCost(t *testing.T) {
	_, cfg := newGuard(t)
	_, painter, _ := cfg.ModelRef("painter")
	_, plain, _ := cfg.ModelRef("gpt-4o")
	for _, tc := range []struct {
		name   string
		model  *config.Model
		cost   map[string]int
		strict bool
		want   map[string]int
		code   string // of the error; "" for none
		inMsg  string
	}{
		{"stated and defaulted", painter, map[string]int{"images": 2}, true, map[string]int{"images": 2, "tasks": 1}, "", ""},
		{"nothing stated: one of each", painter, nil, true, map[string]int{"images": 1, "tasks": 1}, "", ""},
		{"zero stated", painter, map[string]int{"images": 0, "tasks": 0}, true, map[string]int{"images": 0, "tasks": 0}, "", ""},
		{"a unit the model does not limit", painter, map[string]int{"audio_seconds": 3}, true, nil, job.CodeInvalidRequest, `model "painter" does not limit unit "audio_seconds" (it limits images, tasks)`},
		{"a unit on a model without units", plain, map[string]int{"images": 1}, true, nil, job.CodeInvalidRequest, `model "gpt-4o" does not limit unit "images" (it limits no units)`},
		{"after a fallback: ignored", plain, map[string]int{"images": 1}, false, nil, "", ""},
		{"more than the minute", painter, map[string]int{"images": 51}, true, nil, job.CodeTooLarge, "allows 50 images per minute"},
		{"a counted unit has no ceiling", painter, map[string]int{"tasks": 1 << 20}, true, map[string]int{"images": 1, "tasks": 1 << 20}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := guard.UnitCost(tc.cost, tc.model, tc.strict)
			if tc.code == "" {
				if err != nil || !reflect.DeepEqual(got, tc.want) {
					t.Errorf("UnitCost = %v, %v; want %v, nil", got, err, tc.want)
				}
				return
			}
			var ve *job.ValidationError
			if !errors.As(err, &ve) || ve.Code != tc.code || !strings.Contains(ve.Error(), tc.inMsg) {
				t.Errorf("UnitCost = %v, %v; want a %s error containing %q", got, err, tc.code, tc.inMsg)
			}
		})
	}
}

// TestUnitsAreSealedAndReserved: the seal covers the unit amounts, a
// forged (lowered) amount is recomputed from the job's cost, and an
// executor sends only a reservation that covers every unit.
func TestUnitsAreSealedAndReserved(t *testing.T) {
	g, cfg := newGuard(t)
	j := unitJob(t, g, cfg, map[string]int{"images": 3})
	if corrected, err := g.Queued(j, time.Now()); err != nil || corrected {
		t.Fatalf("Queued(sealed job with units) = %v, %v; want not corrected", corrected, err)
	}

	// Lowered under the seal: the seal breaks, the units come back.
	j = unitJob(t, g, cfg, map[string]int{"images": 3})
	j.Estimate.Units["images"] = 0
	if g.Sealed(j) {
		t.Fatal("the seal still verifies with the units lowered")
	}
	if corrected, err := g.Queued(j, time.Now()); err != nil || !corrected {
		t.Fatalf("Queued(forged units) = %v, %v; want corrected", corrected, err)
	}
	if got, want := j.Estimate.Units, map[string]int{"images": 3, "tasks": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("recomputed units %v, want %v", got, want)
	}
	// Units left out of the estimate: every unit the model limits is
	// reserved.
	j = unitJob(t, g, cfg, map[string]int{"images": 2})
	j.Estimate.Units = nil
	g.Seal(j) // as if sealed before the model limited units
	if corrected, err := g.Queued(j, time.Now()); err != nil || !corrected {
		t.Fatalf("Queued(units missing) = %v, %v; want corrected", corrected, err)
	}
	if got, want := j.Estimate.Units, map[string]int{"images": 2, "tasks": 1}; !reflect.DeepEqual(got, want) {
		t.Errorf("units filled in: %v, want %v", got, want)
	}

	// Dispatched: the reservation must cover every unit, under the
	// signature.
	j = admitted(g, unitJob(t, g, cfg, map[string]int{"images": 2}))
	if err := g.Dispatched(j); !errors.Is(err, guard.ErrUnverified) {
		t.Errorf("a reservation without units: got %v, want ErrUnverified", err)
	}
	j.Reservation.Units = map[string]int{"images": 2, "tasks": 1}
	g.Sign(j)
	if err := g.Dispatched(j); err != nil {
		t.Errorf("a reservation covering the units: got %v, want nil", err)
	}
	j.Reservation.Units["images"] = 5
	if err := g.Dispatched(j); !errors.Is(err, guard.ErrUnverified) {
		t.Errorf("units changed after signing: got %v, want ErrUnverified", err)
	}
	j.Reservation.Units = map[string]int{"images": 1, "tasks": 1}
	g.Sign(j)
	if err := g.Dispatched(j); !errors.Is(err, guard.ErrUnverified) {
		t.Errorf("a reservation of fewer images than estimated: got %v, want ErrUnverified", err)
	}
}

// TestSealedBodyIsNotParsedAgain: a hop parses the request body only when
// the seal does not verify. A body changed after sealing breaks the seal
// and is checked in full; a sealed body is not checked again, even against
// limits stricter than the ones it was sealed under (the job was accepted
// under those).
func TestSealedBodyIsNotParsedAgain(t *testing.T) {
	g, cfg := newGuard(t)
	body := request("gpt-4o-mini", 20, `,"max_tokens":4000`)

	// Sealed under these limits, checked under stricter ones: the same
	// fleet key, max_tokens 1000.
	strictCfg := *cfg
	strictCfg.Limits.MaxTokens = 1000
	strict := guard.New(&strictCfg, []byte(strings.Repeat("k", 32)))
	if _, err := job.ParseRequest(body, strict.Limits()); err == nil {
		t.Fatal("the body must fail the stricter limits for this test to mean anything")
	}
	j := ingested(g, body)
	if _, err := strict.Queued(j, time.Now()); err != nil {
		t.Fatalf("Queued(sealed) under stricter limits = %v; want nil (the seal stands for the check)", err)
	}
	if err := strict.Dispatched(admitted(g, j)); err != nil {
		t.Fatalf("Dispatched(sealed) under stricter limits = %v; want nil", err)
	}

	// The same body with the seal broken is checked in full.
	for name, mutate := range map[string]func(j *task.Task){
		"body changed":  func(j *task.Task) { j.Request = request("gpt-4o-mini", 20, `,"max_tokens":4001`) },
		"seal stripped": func(j *task.Task) { j.Seal = "" },
		"model changed": func(j *task.Task) { j.Request = request("gpt-4o", 20, `,"max_tokens":4000`) },
	} {
		j := ingested(g, body)
		mutate(j)
		_, err := strict.Queued(j, time.Now())
		var ve *job.ValidationError
		if !errors.As(err, &ve) {
			t.Errorf("%s: Queued = %v; want a validation error", name, err)
		}
	}
	// Malformed JSON under a broken seal: refused, not passed.
	j = ingested(g, body)
	j.Request = json.RawMessage(`{"model":"gpt-4o-mini","messages":[`)
	if err := g.Dispatched(admitted(g, j)); err == nil || errors.Is(err, guard.ErrUnverified) {
		t.Errorf("Dispatched(malformed, resigned) = %v; want a validation error", err)
	}
}

// TestDispatchedBoundsInPlacedUnits: the guard bounds a reservation in the
// units admission reserves in, its parts as the ledger holds them (the
// prompt as placed, calib.Placed at any correction in calib's range, of
// which a warm prefix may be held as cached), not in the raw estimate's.
// A warm prefix reserved at a correction above 1 holds more cached tokens
// than the raw estimate; it verifies, with its parts carried and without
// (a reservation from before they were). Beyond the largest correction it
// does not, and the error says admission signed it (ErrUnbounded: its
// budget goes back).
func TestDispatchedBoundsInPlacedUnits(t *testing.T) {
	g, cfg := newGuard(t)
	_, m, _ := cfg.Deployment("anthropic", "claude-x")
	rule := m.Rule()
	at := func(f float64, cachedShare float64, legacy bool) *task.Task {
		j := ingested(g, request("claude-x", 2000, ""))
		j.Provider, j.Model = "anthropic", "claude-x"
		g.Seal(j)
		j = admitted(g, j)
		h := rule.Claim(j.Estimate)
		h.Slice = 1
		h = rule.Place(h, calib.Placed(j.Estimate.PromptTokens, f), 0)
		h.Cached = int(float64(h.Prompt) * cachedShare)
		r := rule.Reserve(h)
		r.ReservedAt, r.SendAt, r.ValidUntil = j.Reservation.ReservedAt, j.Reservation.SendAt, j.Reservation.ValidUntil
		if legacy {
			r.Slice, r.Prompt = 0, 0
		}
		j.Reservation = r
		g.Sign(j)
		return j
	}
	for _, legacy := range []bool{false, true} {
		for _, f := range []float64{calib.MinRatio, 0.6, 1, 1.12, 1.4, calib.MaxRatio} {
			if err := g.Dispatched(at(f, 0.95, legacy)); err != nil {
				t.Errorf("correction %.2f, 95%% of the placed prompt cached (legacy %v): Dispatched = %v, want nil", f, legacy, err)
			}
		}
		j := at(calib.MaxRatio, 1, legacy)
		j.Reservation.Cached += 10
		if !legacy {
			j.Reservation.Prompt += 10
		}
		g.Sign(j)
		if err := g.Dispatched(j); !errors.Is(err, guard.ErrUnbounded) || !errors.Is(err, guard.ErrUnverified) {
			t.Errorf("cached beyond the largest correction (legacy %v): Dispatched = %v, want ErrUnbounded (an ErrUnverified)", legacy, err)
		}
	}
}

// TestDispatchedChecksTheParts: the parts a reservation carries unsigned
// (Slice, Prompt) must be the ones its signed ID and totals say: changed,
// the reservation is out of bounds; the same reservation without them (as
// an admission from before them made it) verifies.
func TestDispatchedChecksTheParts(t *testing.T) {
	g, cfg := newGuard(t)
	_, m, _ := cfg.Deployment("openai", "gpt-4o-mini")
	rule := m.Rule()
	placed := func() *task.Task {
		j := admitted(g, ingested(g, request("gpt-4o-mini", 2000, "")))
		h := rule.Claim(j.Estimate)
		h.Slice = 7
		r := rule.Reserve(h)
		r.ReservedAt, r.SendAt, r.ValidUntil = j.Reservation.ReservedAt, j.Reservation.SendAt, j.Reservation.ValidUntil
		j.Reservation = r
		g.Sign(j)
		return j
	}
	if err := g.Dispatched(placed()); err != nil {
		t.Fatalf("as placed: Dispatched = %v, want nil", err)
	}
	for name, mutate := range map[string]func(r *task.Reservation){
		"slice moved":     func(r *task.Reservation) { r.Slice++ },
		"prompt raised":   func(r *task.Reservation) { r.Prompt += 100 },
		"prompt lowered":  func(r *task.Reservation) { r.Prompt -= 100 },
		"output apart":    func(r *task.Reservation) { r.Output = 5 },
		"without parts":   func(r *task.Reservation) { r.Slice, r.Prompt = 0, 0 },
		"cached on 1 tpm": func(r *task.Reservation) { r.Cached = r.Prompt + 1 },
	} {
		j := placed()
		mutate(j.Reservation)
		err := g.Dispatched(j)
		switch name {
		case "without parts":
			if err != nil {
				t.Errorf("%s: Dispatched = %v, want nil (read the old way)", name, err)
			}
		case "output apart", "cached on 1 tpm":
			g.Sign(j) // signed fields: admission's doing
			if err := g.Dispatched(j); !errors.Is(err, guard.ErrUnbounded) {
				t.Errorf("%s (signed): Dispatched = %v, want ErrUnbounded", name, err)
			}
		default:
			if !errors.Is(err, guard.ErrUnbounded) {
				t.Errorf("%s: Dispatched = %v, want ErrUnbounded", name, err)
			}
		}
	}
}
