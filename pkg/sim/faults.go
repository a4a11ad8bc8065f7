package sim

import (
	"context"
	"net"
	"net/http"
	"time"
)

// fault is what the fault roll decided for an admitted request.
type fault int

const (
	noFault fault = iota
	fault500
	fault502
	fault503
	faultReset
	faultHang
	faultStreamCut
	faultStreamStall
)

// roll decides the fault of the n-th admitted request: a pure function of
// the seed and n, so a run with the same seed and order is reproducible.
func (f Faults) roll(n uint64) fault {
	u := float64(splitmix64(uint64(f.Seed)^splitmix64(n))>>11) / (1 << 53)
	for _, o := range []struct {
		rate float64
		f    fault
	}{{f.Rate500, fault500}, {f.Rate502, fault502}, {f.Rate503, fault503}, {f.RateReset, faultReset}, {f.RateHang, faultHang},
		{f.RateStreamCut, faultStreamCut}, {f.RateStreamStall, faultStreamStall}} {
		if u < o.rate {
			return o.f
		}
		u -= o.rate
	}
	return noFault
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// serverError is the body and status of a 5xx fault.
func (f fault) serverError() (int, apiError) {
	switch f {
	case fault502:
		return http.StatusBadGateway, apiError{Message: "Bad gateway.", Type: "server_error"}
	case fault503:
		return http.StatusServiceUnavailable, apiError{Message: "The engine is currently overloaded, please try again later.", Type: "server_error"}
	default:
		return http.StatusInternalServerError, apiError{Message: "The server had an error while processing your request. Sorry about that!", Type: "server_error"}
	}
}

// dropConnection closes the client's connection without a response: a TCP
// reset when the connection can be hijacked, otherwise an aborted handler
// (net/http closes the connection or resets the HTTP/2 stream).
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0) // close with RST, not FIN
	}
	_ = conn.Close()
}

// hang holds the request until the client gives up or hangFor passes, then
// drops the connection.
func hang(ctx context.Context, w http.ResponseWriter, hangFor time.Duration) {
	t := time.NewTimer(hangFor)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	dropConnection(w)
}
