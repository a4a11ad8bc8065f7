package api

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-dev/sluice/pkg/job"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestBearerKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		h, key string
		ok     bool
	}{
		{"Bearer k1", "k1", true},
		{"bearer k1", "k1", true},
		{"BEARER k1", "k1", true},
		{"BeArEr \t k1 \t", "k1", true},
		{"Bearer\tk1", "k1", true},
		{"  Bearer k1", "k1", true},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearer    ", "", false},
		{"Basic azE6", "", false},
		{"Bearerk1", "", false},
		{"Token k1", "", false},
		{"", "", false},
	} {
		key, ok := BearerKey(tc.h)
		if key != tc.key || ok != tc.ok {
			t.Errorf("BearerKey(%q): got %q, %v; want %q, %v", tc.h, key, ok, tc.key, tc.ok)
		}
	}
}

func req(headers ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/v1/jobs/x", nil)
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	return r
}

func TestAuthTenant(t *testing.T) {
	t.Parallel()
	keys := map[string]string{"key-acme": "acme", "key-beta": "beta"}
	closed := NewAuth(keys, []string{"acme", "beta", "nokey"}, false)
	open := NewAuth(keys, []string{"acme", "beta", "nokey"}, true)
	openOne := NewAuth(nil, []string{"default"}, true)
	for _, tc := range []struct {
		name    string
		auth    Auth
		r       *http.Request
		tenant  string
		wantErr error // ErrUnauthorized, or errUnknownTenant for a ValidationError
	}{
		{"bearer", closed, req("Authorization", "Bearer key-acme"), "acme", nil},
		{"bearer lower case", closed, req("Authorization", "bearer key-beta"), "beta", nil},
		{"bearer upper case", closed, req("Authorization", "BEARER key-acme"), "acme", nil},
		{"x-api-key", closed, req("X-Api-Key", "key-beta"), "beta", nil},
		{"x-api-key lower-case name", closed, req("x-api-key", "key-acme"), "acme", nil},
		{"basic scheme falls back to x-api-key", closed, req("Authorization", "Basic Zm9v", "X-Api-Key", "key-acme"), "acme", nil},
		{"wrong key", closed, req("Authorization", "Bearer key-acme2"), "", ErrUnauthorized},
		{"key prefix", closed, req("Authorization", "Bearer key-acm"), "", ErrUnauthorized},
		{"wrong x-api-key", closed, req("X-Api-Key", "nope"), "", ErrUnauthorized},
		{"other scheme only", closed, req("Authorization", "Basic a2V5LWFjbWU="), "", ErrUnauthorized},
		{"empty bearer", closed, req("Authorization", "Bearer "), "", ErrUnauthorized},
		{"no key, closed", closed, req(), "", ErrUnauthorized},
		{"no key, closed, tenant header ignored", closed, req("X-Sluice-Tenant", "acme"), "", ErrUnauthorized},
		{"open: key still checked", open, req("Authorization", "Bearer wrong"), "", ErrUnauthorized},
		{"open: key works", open, req("Authorization", "Bearer key-beta"), "beta", nil},
		{"open: tenant header", open, req("X-Sluice-Tenant", "nokey"), "nokey", nil},
		{"open: unknown tenant header", open, req("X-Sluice-Tenant", "evil"), "", errUnknownTenant},
		{"open: several tenants, no header", open, req(), "", errUnknownTenant},
		{"open: the only tenant", openOne, req(), "default", nil},
		{"zero Auth refuses", Auth{}, req("Authorization", "Bearer key-acme"), "", ErrUnauthorized},
	} {
		got, err := tc.auth.Tenant(tc.r)
		if got != tc.tenant {
			t.Errorf("%s: tenant got %q, want %q", tc.name, got, tc.tenant)
		}
		switch tc.wantErr {
		case nil:
			if err != nil {
				t.Errorf("%s: got error %v, want none", tc.name, err)
			}
		case errUnknownTenant:
			var ve *job.ValidationError
			if !errors.As(err, &ve) || ve.Code != job.CodeUnknownTenant {
				t.Errorf("%s: got error %v, want unknown_tenant", tc.name, err)
			}
		default:
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("%s: got error %v, want %v", tc.name, err, tc.wantErr)
			}
		}
	}
}

var errUnknownTenant = errors.New("unknown tenant")

// AuthError answers 401 without echoing what the caller sent.
func TestAuthErrorHidesKey(t *testing.T) {
	t.Parallel()
	a := NewAuth(map[string]string{"key-acme": "acme"}, []string{"acme"}, false)
	_, err := a.Tenant(req("Authorization", "Bearer sk-secret-guess"))
	rec := httptest.NewRecorder()
	AuthError(rec, err)
	if rec.Code != http.StatusUnauthorized || strings.Contains(rec.Body.String(), "sk-secret-guess") {
		t.Errorf("AuthError: got %d %s; want 401 without the presented key", rec.Code, rec.Body)
	}
}

var waitCases = []struct {
	v         string
	allowZero bool
	want      time.Duration
	ok        bool
}{
	{"30s", false, 30 * time.Second, true},
	{"1.5", false, 1500 * time.Millisecond, true},
	{"15m", false, 15 * time.Minute, true},
	{"900", false, 15 * time.Minute, true},
	{"0", true, 0, true},
	{"0s", true, 0, true},
	{"0", false, 0, false},
	{"15m1s", false, 0, false},
	{"901", false, 0, false},
	{"1000h", false, 0, false},
	{"1e300", false, 0, false},
	{"-1e300", false, 0, false},
	{"1e-300", false, 0, false},
	{"9223372036854775807", false, 0, false},
	{"99999999999999999999h", false, 0, false},
	{"NaN", false, 0, false},
	{"nan", false, 0, false},
	{"Inf", false, 0, false},
	{"+Inf", false, 0, false},
	{"-inf", false, 0, false},
	{"-5s", false, 0, false},
	{"-5", false, 0, false},
	{"0x10", false, 0, false},
	{"0x1p4", false, 0, false},
	{"1e2", false, 0, false},
	{"1.", false, 1 * time.Second, true},
	{".5", false, 500 * time.Millisecond, true},
	{".", false, 0, false},
	{"1.2.3", false, 0, false},
	{"900.0000000001", false, 0, false},
	{"", false, 0, false},
	{"soon", false, 0, false},
	{"30 s", false, 0, false},
}

func TestParseWait(t *testing.T) {
	t.Parallel()
	for _, tc := range waitCases {
		got, err := ParseWait(tc.v, 15*time.Minute, tc.allowZero)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseWait(%q, 15m, %v): got %v, %v; want %v, ok %v", tc.v, tc.allowZero, got, err, tc.want, tc.ok)
		}
	}
	if _, err := ParseWait("1000h", 15*time.Minute, false); err == nil || !strings.Contains(err.Error(), "15m0s") {
		t.Errorf("ParseWait(1000h): got %v, want an error naming the 15m limit", err)
	}
}

func FuzzParseWait(f *testing.F) {
	for _, tc := range waitCases {
		f.Add(tc.v, tc.allowZero)
	}
	const max = 15 * time.Minute
	f.Fuzz(func(t *testing.T, v string, allowZero bool) {
		d, err := ParseWait(v, max, allowZero)
		if err != nil {
			if d != 0 {
				t.Errorf("ParseWait(%q): error %v with duration %v", v, err, d)
			}
			return
		}
		if d < 0 || d > max || (d == 0 && !allowZero) {
			t.Errorf("ParseWait(%q, allowZero %v): accepted %v, outside (0, %v]", v, allowZero, d, max)
		}
		if l := strings.ToLower(v); strings.Contains(l, "nan") || strings.Contains(l, "inf") {
			t.Errorf("ParseWait(%q): accepted a non-finite value as %v", v, d)
		}
	})
}

func FuzzAuthHeader(f *testing.F) {
	for _, s := range []string{"Bearer k1", "bearer k1", "BEARER\tk1", "Bearer", "Bearer ", "Basic Zm9v", "", " Bearer  k1 ", "Bearer k1 k2", "Bearer \x00"} {
		f.Add(s)
	}
	a := NewAuth(map[string]string{"k1": "acme"}, []string{"acme"}, false)
	f.Fuzz(func(t *testing.T, h string) {
		key, ok := BearerKey(h)
		if ok && (key == "" || strings.TrimSpace(key) != key) {
			t.Errorf("BearerKey(%q): ok with key %q, want a non-empty trimmed key", h, key)
		}
		if !ok && key != "" {
			t.Errorf("BearerKey(%q): not ok but key %q", h, key)
		}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header["Authorization"] = []string{h}
		tenant, err := a.Tenant(r)
		if want := ok && key == "k1"; (err == nil) != want || (err == nil && tenant != "acme") {
			t.Errorf("Tenant with Authorization %q: got %q, %v; want accepted %v", h, tenant, err, want)
		}
	})
}

func TestWaiters(t *testing.T) {
	t.Parallel()
	w := NewWaiters(2)
	r1, ok1 := w.Acquire("acme")
	r2, ok2 := w.Acquire("acme")
	if !ok1 || !ok2 {
		t.Fatalf("two waiters of 2: got %v %v, want both", ok1, ok2)
	}
	if _, ok := w.Acquire("acme"); ok {
		t.Errorf("third waiter of 2: got a slot, want refused")
	}
	rb, ok := w.Acquire("beta")
	if !ok {
		t.Errorf("another tenant's waiter: refused, want a slot")
	}
	rb()
	r1()
	r1() // a second release of the same slot frees nothing more
	r3, ok := w.Acquire("acme")
	if !ok {
		t.Fatalf("after one release: refused, want a slot")
	}
	if _, ok := w.Acquire("acme"); ok {
		t.Errorf("after a double release: got a third slot, want refused")
	}
	r2()
	r3()

	// Concurrent acquires never hand out more than the limit: a slot is
	// held until all 50 have asked, so exactly the limit is granted.
	w = NewWaiters(5)
	var wg sync.WaitGroup
	var asked, granted atomic.Int64
	allAsked := make(chan struct{})
	for range 50 {
		wg.Go(func() {
			rel, ok := w.Acquire("acme")
			if ok {
				granted.Add(1)
			}
			if asked.Add(1) == 50 {
				close(allAsked)
			}
			if ok {
				<-allAsked
				rel()
			}
		})
	}
	wg.Wait()
	if got := granted.Load(); got != 5 {
		t.Errorf("50 concurrent waiters, none leaving before all had asked: %d granted, want the limit 5", got)
	}
}

func TestTooManyWaiters(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	TooManyWaiters(rec, 7)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), CodeTooManyWaiters) {
		t.Errorf("TooManyWaiters: got %d Retry-After %q %s; want 429 too_many_waiters with Retry-After", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}
