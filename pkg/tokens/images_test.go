package tokens_test

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"testing"

	"github.com/sluice-dev/sluice/pkg/job"
	"github.com/sluice-dev/sluice/pkg/tokens"
)

// pngDataURL is a data URL of a PNG header for a w×h image: all a size
// reader needs.
func pngDataURL(w, h int) string {
	b := []byte("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 2 // 8-bit RGB
	b = binary.BigEndian.AppendUint32(b, 13)
	chunk := append([]byte("IHDR"), ihdr...)
	b = append(b, chunk...)
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(chunk))
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b)
}

// OpenAI's vision guide's worked examples.
func TestImageTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		w, h   int
		detail string
		want   int
	}{
		{1024, 1024, "high", 765},  // 768×768: 4 tiles
		{2048, 4096, "high", 1105}, // 1024×2048, then 768×1536: 6 tiles
		{4096, 8192, "low", 85},
		{512, 512, "auto", 255},  // not scaled up: 1 tile
		{100, 3000, "high", 765}, // 68×2048: 4 tiles
	} {
		if got := tokens.ImageTokens(tc.w, tc.h, tc.detail); got != tc.want {
			t.Errorf("ImageTokens(%d, %d, %q) = %d, want %d", tc.w, tc.h, tc.detail, got, tc.want)
		}
	}
}

// Images are part of the prompt: read from a data URL's header, or charged
// as 1024×1024 when Sluice cannot read the size.
func TestPromptCountsImagesAndTools(t *testing.T) {
	t.Parallel()
	text := tokens.Prompt(&job.ChatRequest{Model: "gpt-4o", Messages: []job.ChatMessage{msg("user", "", "hello world")}})
	for _, tc := range []struct {
		url, detail string
		want        int
	}{
		{pngDataURL(2048, 4096), "high", 1105},
		{pngDataURL(2048, 4096), "low", 85},
		{"https://example.test/a.png", "", 765},
		{"data:image/png;base64,bm90IGFuIGltYWdl", "high", 765},
	} {
		content := fmt.Sprintf(`[{"type":"text","text":"hello "},{"type":"image_url","image_url":{"url":%q,"detail":%q}},{"type":"text","text":"world"}]`, tc.url, tc.detail)
		req := &job.ChatRequest{Model: "gpt-4o", Messages: []job.ChatMessage{{Role: "user", Content: json.RawMessage(content)}}}
		if got := tokens.Prompt(req); got != text+tc.want {
			t.Errorf("image %.40s (detail %q): prompt %d, want %d (text) + %d (image)", tc.url, tc.detail, got, text, tc.want)
		}
	}
	tools := json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Get the weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`)
	req := &job.ChatRequest{Model: "gpt-4o", Messages: []job.ChatMessage{msg("user", "", "hello world")}, Tools: tools}
	if got := tokens.Prompt(req); got <= text+20 {
		t.Errorf("prompt with a tool definition: %d, want the tool's tokens (about 30) on top of %d", got, text)
	}
}

func TestClass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body, want string
	}{
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"hello world"}]}`, "s_latin"},
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"Xin chào thế giới, hôm nay trời đẹp"}]}`, "s_latin"},
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"Привет, мир! Как дела сегодня?"}]}`, "s_other"},
		{`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, "s_latin_tools"},
		{`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.test/a.png"}}]}]}`, "s_latin_images"},
	} {
		_, est, err := tokens.Estimate(job.EndpointChat, []byte(tc.body), job.DefaultLimits, 100)
		if err != nil {
			t.Fatal(err)
		}
		if est.Class != tc.want || !tokens.ValidClass(est.Class) {
			t.Errorf("%s: class %q (valid %v), want %q", tc.body, est.Class, tokens.ValidClass(est.Class), tc.want)
		}
	}
	for _, bad := range []string{"", "x", "s_latin_x", "m_latin.>", "embed_s_latin_tools", "s_latin_images_tools"} {
		if tokens.ValidClass(bad) {
			t.Errorf("ValidClass(%q) = true, want false", bad)
		}
	}
}

// Anthropic's vision guide's worked examples, and its resize of the long
// edge to 1568 px.
func TestAnthropicImageTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ w, h, want int }{
		{200, 200, 54},
		{1000, 1000, 1334},
		{1092, 1092, 1590},
		{3136, 1568, 1600}, // 1568×784: 1639, capped at the 1,600 maximum
		{1568, 100, 210},
	} {
		if got := tokens.AnthropicImageTokens(tc.w, tc.h); got != tc.want {
			t.Errorf("AnthropicImageTokens(%d, %d) = %d, want %d", tc.w, tc.h, got, tc.want)
		}
	}
	text := tokens.Prompt(&job.ChatRequest{Model: "claude-sonnet-4-5", Messages: []job.ChatMessage{msg("user", "", "hello world")}})
	for _, tc := range []struct {
		url  string
		want int
	}{
		{pngDataURL(1000, 1000), 1334},
		{"https://example.test/a.png", tokens.AnthropicMaxImageTokens},
	} {
		content := fmt.Sprintf(`[{"type":"text","text":"hello "},{"type":"image_url","image_url":{"url":%q}},{"type":"text","text":"world"}]`, tc.url)
		req := &job.ChatRequest{Model: "claude-sonnet-4-5", Messages: []job.ChatMessage{{Role: "user", Content: json.RawMessage(content)}}}
		if got := tokens.Prompt(req); got != text+tc.want {
			t.Errorf("Claude image %.40s: prompt %d, want %d (text) + %d (image)", tc.url, got, text, tc.want)
		}
	}
}
