package config

import "github.com/sluice-dev/sluice/pkg/clip"

// KindAzure is an Azure OpenAI resource: each model is a deployment,
// called at {base_url}/openai/deployments/{upstream or name}/... with the
// api-version api_version (default provider.DefaultAzureAPIVersion) and
// the key in the api-key header. Its requests and answers are OpenAI's.
const KindAzure = "azure"

// checkAzure checks what only an azure provider may set.
func checkAzure(p Provider, key string, fail func(key, format string, args ...any)) {
	switch {
	case p.Kind != KindAzure && p.APIVersion != "":
		fail(key+".api_version", "is an azure provider's; provider %q is of kind %s", p.Name, p.Kind)
	case len(p.APIVersion) > 64 || !apiVersion(p.APIVersion):
		fail(key+".api_version", "must be a version such as 2024-10-21 (letters, digits, '-' and '.'), got %q", clip.String(p.APIVersion, shown))
	case p.Kind == KindAzure && p.Responses == ResponsesNative:
		fail(key+".responses", "must be chat or absent for an azure provider (it is called on chat completions)")
	}
}

func apiVersion(v string) bool {
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '.') {
			return false
		}
	}
	return true
}
