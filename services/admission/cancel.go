package admission

import "time"

// A job its caller cancelled (services/result) has its terminal result
// published and its operation record marked: an executor that takes it
// ends it without a call. Admission, told on the cancel subject, drops it
// sooner, so that it takes no budget: at once when held here, else when
// JetStream delivers it again (within CancelMemory).

// CancelMemory is how long a cancelled job's key is kept to drop its
// message when JetStream delivers it again.
const CancelMemory = 10 * time.Minute

// maxCancelled bounds the keys kept.
const maxCancelled = 100_000

// dropCancelled drops the held job of key, if any, and remembers the key.
func (h *holder) dropCancelled(key string) {
	now := h.now()
	delete(h.waitBook.waits, key)
	if len(h.waitBook.cancelled) < maxCancelled {
		h.waitBook.cancelled[key] = now
	}
	hj, ok := h.held.get(key)
	if !ok {
		return
	}
	q := h.queues[hj.key]
	gone := q.sched.Remove(func(it *Item) bool { return it.Value.(*Candidate).Job.Key() == key })
	for _, it := range gone {
		h.held.remove(it)
		_ = it.Value.(*Candidate).Msg.Ack()
	}
}

// forgetCancelled drops keys older than CancelMemory.
func (wb *waitBook) forgetCancelled(now time.Time) {
	for k, at := range wb.cancelled {
		if now.Sub(at) > CancelMemory {
			delete(wb.cancelled, k)
		}
	}
}
