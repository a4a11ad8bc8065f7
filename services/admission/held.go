package admission

// heldSet is the bookkeeping of the jobs this process holds in its models'
// schedulers: each by its key (task.Task.Key: ids are unique per tenant only), with its model's budget key (for "why does it
// wait" and for a redelivery of a job already held), and how many there
// are and how many bytes they take (admission.max_held, max_held_bytes).
// Every item that enters a scheduler is added here, and removed when it
// leaves (popped, evicted, expired, given back or let go).
type heldSet struct {
	byID  map[string]heldJob
	n     int
	bytes int
}

type heldJob struct {
	key string // the model's budget key
	c   *Candidate
}

func newHeldSet() heldSet {
	return heldSet{byID: map[string]heldJob{}}
}

// add records it, held for the model at key.
func (h *heldSet) add(key string, it *Item) {
	c := it.Value.(*Candidate)
	h.byID[c.Job.Key()] = heldJob{key: key, c: c}
	h.n++
	h.bytes += it.Size
}

// remove forgets it.
func (h *heldSet) remove(it *Item) {
	delete(h.byID, it.Value.(*Candidate).Job.Key())
	h.n--
	h.bytes -= it.Size
}

// get returns the held job with jobKey (task.Task.Key).
func (h *heldSet) get(jobKey string) (heldJob, bool) {
	hj, ok := h.byID[jobKey]
	return hj, ok
}

// over reports whether the set holds more than maxN jobs or maxBytes.
func (h *heldSet) over(maxN, maxBytes int) bool {
	return h.n > maxN || h.bytes > maxBytes
}
