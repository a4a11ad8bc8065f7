package job

import (
	"fmt"
	"strings"
	"testing"
)

func TestCheckMembers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body, field, msg string // field "" and msg "": accepted
	}{
		{body: `{"model":"a","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`},
		{body: `{"max_tokens":100000,"MAX_TOKENS":1}`, field: "request", msg: `duplicate member "max_tokens" (also as "MAX_TOKENS")`},
		{body: `{"n":100,"N":1}`, field: "request", msg: `duplicate member "n" (also as "N")`},
		{body: `{"model":"a","model":"b"}`, field: "request", msg: `duplicate member "model" (also as "model")`},
		{body: `{"model":"a","\u006dodel":"b"}`, field: "request", msg: `duplicate member "model" (also as "model")`},
		{body: `{"messages":[{"role":"user"},{"role":"user","ROLE":"system"}]}`, field: "request.messages[1]", msg: `"role" (also as "ROLE")`},
		{body: `{"a":{"b":[[{"x":1,"X":2}]]}}`, field: "request.a.b[0][0]", msg: `"x" (also as "X")`},
		// encoding/json folds the long s and the Kelvin sign too.
		{body: `{"stream":true,"ſtream":false}`, field: "request", msg: `"stream" (also as "ſtream")`},
		{body: `{"k":1,"\u212a":2}`, field: "request", msg: "\"k\" (also as \"\u212a\")"},
		// A JSON Schema's properties may differ by case; not twice the same.
		{body: `{"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"id":{},"ID":{}}}}}]}`},
		{body: `{"tools":[{"function":{"parameters":{"properties":{"id":{},"id":{}}}}}]}`, field: "request.tools[0].function.parameters.properties", msg: `"id" (also as "id")`},
		{body: `{"Parameters":{"a":1,"A":2}}`, field: "request.Parameters", msg: `"a" (also as "A")`},
		{body: `not json`},
		{body: `[1,2,{"a":1},{"a":2}]`},
		{body: ` { "a" : 1 , "b" : [ ] , "c" : { } , "A" : 2 } `, field: "request", msg: `"a" (also as "A")`},
		// Past linearNames members an object's names are compared by map.
		{body: manyMembers(40, `"M40":1`), field: "request", msg: `duplicate member "m40" (also as "M40")`},
		{body: manyMembers(40, `"M3":0`), field: "request", msg: `duplicate member "m3" (also as "M3")`},
		{body: manyMembers(40, `"m41":{"x":1,"y":{"X":2}},"m42":[{"a":1,"A":1}]`), field: "request.m42[0]", msg: `"a" (also as "A")`},
		{body: manyMembers(40, `"m41":0`)},
	} {
		err := CheckMembers("request", []byte(c.body), nil)
		if c.msg == "" {
			if err != nil {
				t.Errorf("%s: %v, want accepted", c.body, err)
			}
			continue
		}
		ve, ok := err.(*ValidationError)
		if !ok || ve.Field != c.field || !strings.Contains(ve.Message, c.msg) {
			t.Errorf("%s: got %v, want a validation error at %s saying %s", c.body, err, c.field, c.msg)
		}
	}
}

// A member that reaches a field only by folding is refused where the
// body's type is known: Sluice would read it, a provider matching names
// exactly would not.
func TestCheckMembersFoldOnly(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		body, field, msg string
	}{
		{body: `{"model":"a","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`},
		{body: `{"model":"a","MAX_TOKENS":1}`, field: "request", msg: `member "MAX_TOKENS" is read as "max_tokens"`},
		{body: `{"model":"a","messages":[{"Role":"user"}]}`, field: "request.messages[0]", msg: `member "Role" is read as "role"`},
		{body: `{"model":"a","stream_options":{"Include_Usage":true}}`, field: "request.stream_options", msg: `"Include_Usage" is read as "include_usage"`},
		{body: `{"model":"a","SLUICE_RESPONSES":{}}`, field: "request", msg: `"SLUICE_RESPONSES" is read as "sluice_responses"`},
		{body: `{"model":"a","Temperature":0}`, field: "request", msg: `member "Temperature" is read as "temperature"`},
		// Unknown members and what Sluice does not look into pass.
		{body: `{"model":"a","Top_P":1,"tools":[{"Type":"function"}],"messages":[{"role":"user","content":[{"TYPE":"text"}]}]}`},
	} {
		err := CheckMembers("request", []byte(c.body), (*ChatRequest)(nil))
		if c.msg == "" {
			if err != nil {
				t.Errorf("%s: %v, want accepted", c.body, err)
			}
			continue
		}
		ve, ok := err.(*ValidationError)
		if !ok || ve.Field != c.field || !strings.Contains(ve.Message, c.msg) {
			t.Errorf("%s: got %v, want a validation error at %s saying %s", c.body, err, c.field, c.msg)
		}
	}
	if err := CheckMembers("", []byte(`{"Tenant":"a","request":{}}`), (*Job)(nil)); err == nil || !strings.Contains(err.Error(), `"Tenant" is read as "tenant"`) {
		t.Errorf("envelope with Tenant: %v, want refused", err)
	}
}

func TestCheckProducerRequest(t *testing.T) {
	t.Parallel()
	for body, refused := range map[string]bool{
		`{"model":"a","sluice_responses":{}}`: true,
		`{"model":"a","SLUICE_RESPONSES":{}}`: true,
		`{"model":"a","ſluice_x":1}`:          true,
		`{"model":"a","sluice":1}`:            false,
		`{"model":"a"}`:                       false,
	} {
		if err := CheckProducerRequest("request", []byte(body)); (err != nil) != refused {
			t.Errorf("%s: %v, want refused %v", body, err, refused)
		}
	}
}

// BenchmarkCheckMembers checks a chat body of about 1 MB (the default
// body limit): 2,000 messages of 500 bytes.
func BenchmarkCheckMembers(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"model":"a","max_tokens":16,"messages":[`)
	for i := range 2000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"` + strings.Repeat(`word\n `, 83) + `"}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if err := CheckMembers("request", body, (*ChatRequest)(nil)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseSmall parses a small job envelope as ingest does for each
// job from INTAKE (the body of `sluice bench overhead`).
func BenchmarkParseSmall(b *testing.B) {
	data := []byte(`{"id":"0190f6c4-8b1e-7c3a-9d2e-4f5a6b7c8d9e","tenant":"acme","priority":"interactive","request":` +
		`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseRequestSmall parses the small chat body ingest estimates.
func BenchmarkParseRequestSmall(b *testing.B) {
	body := []byte(`{"model":"gpt-4o-mini","max_tokens":16,"messages":[{"role":"user","content":"Say hello to the benchmark."}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseRequest(body, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

// manyMembers is an object of n members "m1".."mn" and then more.
func manyMembers(n int, more string) string {
	var b strings.Builder
	b.WriteString("{")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, `"m%d":%d,`, i, i)
	}
	return b.String() + more + "}"
}
