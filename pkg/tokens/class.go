package tokens

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/sluice-dev/sluice/pkg/job"
)

// A request's shape class groups requests whose provider count differs
// from the estimate in the same way: "<size>_<script>[_tools][_images]", or
// "embed_<size>_<script>" for embeddings. Size is the prompt estimate's
// class (s: under 1,000 tokens, m: under 8,000, l: more); script is latin
// when at least 80 % of the letters are Latin, else other (providers'
// tokenizers differ most on other scripts).
const (
	smallPrompt  = 1_000
	mediumPrompt = 8_000
	latinShare   = 0.8
)

func sizeClass(n int) string {
	switch {
	case n < smallPrompt:
		return "s"
	case n < mediumPrompt:
		return "m"
	}
	return "l"
}

// scriptCounter counts letters and Latin letters over several texts.
type scriptCounter struct{ letters, latin int }

func (c *scriptCounter) add(s string) {
	for i := 0; i < len(s); {
		r, w := rune(s[i]), 1
		if r >= utf8.RuneSelf {
			r, w = utf8.DecodeRuneInString(s[i:])
		}
		i += w
		switch {
		case r < utf8.RuneSelf:
			if r|0x20 >= 'a' && r|0x20 <= 'z' {
				c.letters++
				c.latin++
			}
		case unicode.IsLetter(r):
			c.letters++
			if unicode.Is(unicode.Latin, r) {
				c.latin++
			}
		}
	}
}

func (c *scriptCounter) class() string {
	if c.letters == 0 || float64(c.latin) >= latinShare*float64(c.letters) {
		return "latin"
	}
	return "other"
}

func chatClass(req *job.ChatRequest, prompt int) string {
	var sc scriptCounter
	for _, m := range req.Messages {
		sc.add(m.Text())
	}
	parts := []string{sizeClass(prompt), sc.class()}
	if len(req.Tools) > 0 && string(req.Tools) != "null" && string(req.Tools) != "[]" {
		parts = append(parts, "tools")
	}
	if HasImages(req) {
		parts = append(parts, "images")
	}
	return strings.Join(parts, "_")
}

func embeddingsClass(req *job.EmbeddingsRequest, input int) string {
	var sc scriptCounter
	for _, t := range req.Texts {
		sc.add(t)
	}
	return "embed_" + sizeClass(input) + "_" + sc.class()
}

// ValidClass reports whether s is a class Estimate can name: it becomes
// part of a budgets key, so nothing else is accepted.
func ValidClass(s string) bool {
	rest, embed := strings.CutPrefix(s, "embed_")
	f := strings.Split(rest, "_")
	if len(f) < 2 || len(f) > 4 || (embed && len(f) != 2) {
		return false
	}
	if f[0] != "s" && f[0] != "m" && f[0] != "l" || f[1] != "latin" && f[1] != "other" {
		return false
	}
	switch strings.Join(f[2:], "_") {
	case "", "tools", "images", "tools_images":
		return true
	}
	return false
}
