package streams

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// An unchanged stream is left as it is; a changed member, or one the
// server lacks, makes an update.
func TestSameStreamSettings(t *testing.T) {
	t.Parallel()
	want := jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, MaxMsgs: 10, MaxMsgSize: 1024, Duplicates: time.Minute}
	cur := want
	cur.Metadata = map[string]string{"_nats.level": "1"} // filled by the server
	if !sameStreamSettings(cur, want) {
		t.Error("a stream with the wanted settings and server metadata reads as changed")
	}
	for name, mod := range map[string]func(*jetstream.StreamConfig){
		"limit":   func(c *jetstream.StreamConfig) { c.MaxMsgs = 11 },
		"subject": func(c *jetstream.StreamConfig) { c.Subjects = []string{"t.>"} },
		"size":    func(c *jetstream.StreamConfig) { c.MaxMsgSize = 0 },
	} {
		c := cur
		mod(&c)
		if sameStreamSettings(c, want) {
			t.Errorf("%s changed: reads as the same", name)
		}
	}
}
