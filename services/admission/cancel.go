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
func (s *Service) dropCancelled(key string) {
	now := s.now()
	delete(s.waits, key)
	if len(s.cancelled) < maxCancelled {
		s.cancelled[key] = now
	}
	hj, ok := s.held.get(key)
	if !ok {
		return
	}
	q := s.queues[hj.key]
	gone := q.sched.Remove(func(it *Item) bool { return it.Value.(*Candidate).Job.Key() == key })
	for _, it := range gone {
		s.held.remove(it)
		_ = it.Value.(*Candidate).Msg.Ack()
	}
}

// forgetCancelled drops keys older than CancelMemory.
func (s *Service) forgetCancelled(now time.Time) {
	for k, at := range s.cancelled {
		if now.Sub(at) > CancelMemory {
			delete(s.cancelled, k)
		}
	}
}
