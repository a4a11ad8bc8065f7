package bench

import (
	"encoding/json"
	"math/rand/v2"
)

// repeatJobs makes a share of jobs repeat an earlier request exactly, as
// callers asking the same question again do: each job after the first is,
// with probability share, a copy of a distinct job before it. Every body
// asks for temperature 0, so the answers may be cached. It returns the
// jobs and how many distinct requests they hold.
func repeatJobs(jobs []Job, share float64, seed uint64) ([]Job, int, error) {
	rnd := rand.New(rand.NewPCG(seed, seedFor("repeats")))
	out := make([]Job, len(jobs))
	var distinct []int
	for i, j := range jobs {
		if i > 0 && rnd.Float64() < share {
			out[i] = out[distinct[rnd.IntN(len(distinct))]]
			continue
		}
		var body map[string]any
		if err := json.Unmarshal(j.Body, &body); err != nil {
			return nil, 0, err
		}
		body["temperature"] = 0
		b, err := json.Marshal(body)
		if err != nil {
			return nil, 0, err
		}
		j.Body = b
		out[i] = j
		distinct = append(distinct, i)
	}
	return out, len(distinct), nil
}
