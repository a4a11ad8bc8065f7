package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// Model is the model every workload asks for. It has a known tokenizer, so
// every strategy estimates prompts with pkg/tokens' real BPE count; the
// simulator counts them its own way (about 1.2 times as many for the
// workloads' English words), as a provider would.
const Model = "gpt-4o-mini"

// Dim is a rate-limit dimension.
type Dim string

const (
	Requests Dim = "rpm" // requests per minute
	Tokens   Dim = "tpm" // tokens (prompt + max output) per minute
)

// Unit names what a Dim counts.
func (d Dim) Unit() string {
	if d == Requests {
		return "requests"
	}
	return "tokens"
}

// Job is one chat-completions request of a workload.
type Job struct {
	Body      []byte
	Prompt    int // prompt tokens as pkg/tokens counts them
	MaxTokens int
}

// Cost is what a provider charges against TPM at arrival: prompt + max output.
func (j Job) Cost() int { return j.Prompt + j.MaxTokens }

// Spec describes a workload before it is generated.
type Spec struct {
	Name        string
	Description string
	RPM, TPM    int     // the simulated provider's limits at scale 1
	LongShare   float64 // fraction of long requests, the rest are short
}

// Request shapes. Short: ~120 prompt tokens + 80 max_tokens; long: ~4,000
// prompt tokens + 1,000 max_tokens. Prompt sizes vary ±15 % around these.
const (
	shortPrompt, shortMax = 120, 80
	longPrompt, longMax   = 4000, 1000
)

// Specs are the workloads `sluice bench` knows, by name. Each one's binding
// limit is the dimension whose offered total is the larger multiple of its
// limit: A binds on RPM (its TPM is 5x what it offers), B on TPM (it offers a
// fraction of its RPM), and mix on TPM.
var Specs = []Spec{
	{Name: "a", Description: "many short requests (~120 prompt + 80 max_tokens), RPM-bound", RPM: 600, TPM: 1_000_000, LongShare: 0},
	{Name: "b", Description: "long requests (~4,000 prompt + 1,000 max_tokens), TPM-bound", RPM: 500, TPM: 200_000, LongShare: 1},
	{Name: "mix", Description: "80 % short, 20 % long requests, TPM-bound", RPM: 500, TPM: 150_000, LongShare: 0.2},
}

// SpecNames lists the names of Specs.
func SpecNames() []string {
	var out []string
	for _, s := range Specs {
		out = append(out, s.Name)
	}
	return out
}

// LookupSpec returns the spec named name.
func LookupSpec(name string) (Spec, bool) {
	i := slices.IndexFunc(Specs, func(s Spec) bool { return s.Name == name })
	if i < 0 {
		return Spec{}, false
	}
	return Specs[i], true
}

// Workload is a set of jobs offered all at once against a provider's limits.
type Workload struct {
	Spec
	Load float64 // offered total as a multiple of the binding limit
	Jobs []Job
}

// Offered returns the requests and tokens (prompt + max output) of all jobs.
func (w *Workload) Offered() (reqs, toks int) {
	for _, j := range w.Jobs {
		toks += j.Cost()
	}
	return len(w.Jobs), toks
}

// Binding is the limit the workload presses hardest: the dimension whose
// offered total is the larger multiple of its limit.
func (w *Workload) Binding() Dim {
	reqs, toks := w.Offered()
	if ratio(toks, w.TPM) > ratio(reqs, w.RPM) {
		return Tokens
	}
	return Requests
}

// Limit returns the per-minute limit of dimension d.
func (w *Workload) Limit(d Dim) int {
	if d == Requests {
		return w.RPM
	}
	return w.TPM
}

func ratio(n, limit int) float64 {
	if limit <= 0 {
		return 0
	}
	return float64(n) / float64(limit)
}

// Generate makes the workload of spec: jobs drawn from a generator fixed by
// seed until the offered total reaches load times one minute of a limit (the
// first limit reached). scale multiplies the limits (and so the job count);
// TPM is kept large enough for the largest request to run at all.
func Generate(spec Spec, load, scale float64, seed uint64) (*Workload, error) {
	if load <= 0 || scale <= 0 {
		return nil, fmt.Errorf("load and scale must be positive (load %g, scale %g)", load, scale)
	}
	spec.RPM = max(int(math.Round(float64(spec.RPM)*scale)), 1)
	spec.TPM = max(int(math.Round(float64(spec.TPM)*scale)), 1)
	if spec.LongShare > 0 {
		spec.TPM = max(spec.TPM, 6_000)
	} else {
		spec.TPM = max(spec.TPM, 400)
	}
	w := &Workload{Spec: spec, Load: load}
	rnd := rand.New(rand.NewPCG(seed, seedFor(spec.Name)))
	reqs, toks := 0, 0
	for ratio(reqs, spec.RPM) < load && ratio(toks, spec.TPM) < load {
		long := rnd.Float64() < spec.LongShare
		target, maxTok := shortPrompt, shortMax
		if long {
			target, maxTok = longPrompt, longMax
		}
		target = int(float64(target) * (0.85 + 0.3*rnd.Float64()))
		j, err := newJob(rnd, target, maxTok)
		if err != nil {
			return nil, err
		}
		w.Jobs = append(w.Jobs, j)
		reqs++
		toks += j.Cost()
	}
	return w, nil
}

// seedFor gives each workload its own stream from one --seed.
func seedFor(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return h
}

var vocabulary = strings.Fields(`the of and to in is that for it as was with be by on not he this are or his
from at which but have an they you were her she there one all we their has been would more when if will
into no out so said what up its about than them can only other new some could time these two may then do
first any my now such like our over man me even most made after also did many before must through back
years where much your way well down should because each just those people how too little state good very
make world still own see men work long get here between both life being under never day same another know
while last might us great old year off come since against go came right used take three`)

// newJob writes a prompt of about target tokens (pkg/tokens' count, chat
// framing included) and wraps it in a chat-completions body.
func newJob(rnd *rand.Rand, target, maxTok int) (Job, error) {
	words := make([]string, 0, target)
	body := func() []byte {
		b, _ := json.Marshal(map[string]any{
			"model":      Model,
			"max_tokens": maxTok,
			"messages":   []map[string]string{{"role": "user", "content": strings.Join(words, " ")}},
		})
		return b
	}
	count := func() (int, error) {
		req, err := job.ParseRequest(body(), job.DefaultLimits)
		if err != nil {
			return 0, err
		}
		return tokens.Prompt(req), nil
	}
	// Common words are one token each; a few rounds of correction land on
	// the target (or within a token or two of it).
	const framing = 7 // reply priming 3 + message 3 + "user" 1
	for range max(target-framing, 1) {
		words = append(words, vocabulary[rnd.IntN(len(vocabulary))])
	}
	n, err := count()
	for round := 0; err == nil && n != target && round < 4; round++ {
		if n < target {
			for range target - n {
				words = append(words, vocabulary[rnd.IntN(len(vocabulary))])
			}
		} else {
			words = words[:max(len(words)-(n-target), 1)]
		}
		n, err = count()
	}
	if err != nil {
		return Job{}, fmt.Errorf("generate job: %w", err)
	}
	return Job{Body: body(), Prompt: n, MaxTokens: maxTok}, nil
}
