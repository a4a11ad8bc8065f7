package tokens

import (
	"testing"

	"github.com/tiktoken-go/tokenizer"
)

// Warm loads the encoding of each model it is given (ingest warms its
// configured models' as it is made, so a fresh node's first job does not
// wait for a tokenizer to load).
func TestWarm(t *testing.T) {
	mu.Lock()
	codecs = map[tokenizer.Encoding]tokenizer.Codec{}
	mu.Unlock()
	Warm("gpt-4o-mini", "gpt-4")
	mu.Lock()
	defer mu.Unlock()
	for _, enc := range []tokenizer.Encoding{tokenizer.O200kBase, tokenizer.Cl100kBase} {
		if codecs[enc] == nil {
			t.Errorf("%s not loaded by Warm", enc)
		}
	}
}
