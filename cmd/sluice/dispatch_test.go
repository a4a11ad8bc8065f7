package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

func TestDispatch(t *testing.T) {
	t.Parallel()
	var ran []string
	cmds := map[string]command{
		"list": func(_ context.Context, args []string, _ func(string) string, _, _ io.Writer) error {
			ran = append(ran, "list "+strings.Join(args, " "))
			return nil
		},
	}
	for _, tc := range []struct {
		args              []string
		wantErr, wantRan  string
		wantOut, wantSErr bool
	}{
		{args: []string{"list", "-n", "3"}, wantRan: "list -n 3"},
		{args: nil, wantErr: "grp: no command given", wantSErr: true},
		{args: []string{"nope"}, wantErr: `grp: unknown command "nope"`, wantSErr: true},
		{args: []string{"--help"}, wantOut: true},
	} {
		ran = nil
		var stdout, stderr bytes.Buffer
		err := dispatch(context.Background(), "grp", "USAGE\n", cmds, tc.args, func(string) string { return "" }, &stdout, &stderr)
		if got := errString(err); got != tc.wantErr {
			t.Errorf("dispatch(%q) error = %q, want %q", tc.args, got, tc.wantErr)
		}
		if got := strings.Join(ran, ";"); got != tc.wantRan {
			t.Errorf("dispatch(%q) ran %q, want %q", tc.args, got, tc.wantRan)
		}
		if got := stdout.String() == "USAGE\n"; got != tc.wantOut {
			t.Errorf("dispatch(%q) usage on stdout = %v, want %v", tc.args, got, tc.wantOut)
		}
		if got := stderr.String() == "USAGE\n"; got != tc.wantSErr {
			t.Errorf("dispatch(%q) usage on stderr = %v, want %v", tc.args, got, tc.wantSErr)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
