package wire

import "encoding/json"

// CheckChatStd is CheckChat decoding with encoding/json.
func CheckChatStd(body []byte, allowed func(name string) bool) (map[string]json.RawMessage, error) {
	return checkChat(body, allowed, json.Unmarshal)
}
