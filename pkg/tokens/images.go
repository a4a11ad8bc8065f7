package tokens

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"image"
	_ "image/gif"  // image.DecodeConfig reads GIF sizes
	_ "image/jpeg" // and JPEG
	_ "image/png"  // and PNG
	"strings"

	"github.com/sluice-dev/sluice/pkg/job"
)

// OpenAI's published rule for image inputs (vision models that count in
// 512-px tiles): 85 tokens at detail "low"; otherwise the image is scaled to
// fit 2048×2048, then its short side down to 768 px, and costs 85 + 170 per
// 512-px tile. An image whose size Sluice cannot read (a URL, an unknown
// format) is charged as a 1024×1024 one at its detail: 765 tokens.
const (
	ImageBaseTokens = 85
	ImageTileTokens = 170
	unknownSide     = 1024
)

// ImageTokens is what OpenAI charges for a width×height image at detail
// ("low", "high" or "auto"; auto is charged as high, the most it can be).
func ImageTokens(width, height int, detail string) int {
	if detail == "low" {
		return ImageBaseTokens
	}
	w, h := float64(max(width, 1)), float64(max(height, 1))
	if m := max(w, h); m > 2048 {
		w, h = w*2048/m, h*2048/m
	}
	if s := min(w, h); s > 768 {
		w, h = w*768/s, h*768/s
	}
	tiles := ceilDiv(int(w+0.5), 512) * ceilDiv(int(h+0.5), 512)
	return ImageBaseTokens + ImageTileTokens*tiles
}

// Anthropic's published rule: an image costs width×height/750 tokens after
// it is scaled to fit 1568 px on its long edge and about 1.15 megapixels
// (1,600 tokens at most). An image whose size Sluice cannot read is charged
// that maximum.
const (
	anthropicPixelsPerToken = 750
	anthropicMaxEdge        = 1568
	AnthropicMaxImageTokens = 1600
)

// AnthropicImageTokens is what Anthropic charges for a width×height image.
func AnthropicImageTokens(width, height int) int {
	w, h := float64(max(width, 1)), float64(max(height, 1))
	if m := max(w, h); m > anthropicMaxEdge {
		w, h = w*anthropicMaxEdge/m, h*anthropicMaxEdge/m
	}
	return min(int(w*h/anthropicPixelsPerToken+0.999), AnthropicMaxImageTokens)
}

// anthropicModel reports whether model is one of Anthropic's, whose images
// are charged by AnthropicImageTokens.
func anthropicModel(model string) bool {
	return strings.HasPrefix(strings.ToLower(model), "claude")
}

func ceilDiv(a, b int) int { return (max(a, 1) + b - 1) / b }

// imagePart is an image_url content part.
type imagePart struct {
	Type     string `json:"type"`
	ImageURL struct {
		URL    string `json:"url"`
		Detail string `json:"detail"`
	} `json:"image_url"`
}

// Images counts the image parts of a chat request's messages by the
// model's provider's rule (AnthropicImageTokens for Claude models,
// ImageTokens otherwise): a data URL's size is read from its header; any
// other image is charged as 1024×1024 by OpenAI's rule and at the maximum
// by Anthropic's.
func Images(req *job.ChatRequest) int {
	n, anthropic := 0, anthropicModel(req.Model)
	for _, m := range req.Messages {
		if len(m.Content) == 0 || m.Content[0] != '[' || !bytes.Contains(m.Content, []byte("image_url")) {
			continue
		}
		var parts []imagePart
		if json.Unmarshal(m.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			if p.Type != "image_url" {
				continue
			}
			w, h, known := imageSize(p.ImageURL.URL)
			switch {
			case anthropic && !known:
				n += AnthropicMaxImageTokens
			case anthropic:
				n += AnthropicImageTokens(w, h)
			default:
				n += ImageTokens(w, h, p.ImageURL.Detail)
			}
		}
	}
	return n
}

// imageSize reads a base64 data URL's image size; unknownSide (and false)
// for anything else.
func imageSize(url string) (int, int, bool) {
	rest, ok := strings.CutPrefix(url, "data:")
	if !ok {
		return unknownSide, unknownSide, false
	}
	_, data, ok := strings.Cut(rest, ";base64,")
	if !ok {
		return unknownSide, unknownSide, false
	}
	cfg, _, err := image.DecodeConfig(base64.NewDecoder(base64.StdEncoding, strings.NewReader(data)))
	if err != nil || cfg.Width <= 0 || cfg.Height <= 0 {
		return unknownSide, unknownSide, false
	}
	return cfg.Width, cfg.Height, true
}

// HasImages reports whether any message has an image part.
func HasImages(req *job.ChatRequest) bool {
	for _, m := range req.Messages {
		if len(m.Content) > 0 && m.Content[0] == '[' && bytes.Contains(m.Content, []byte(`"image_url"`)) {
			return true
		}
	}
	return false
}
