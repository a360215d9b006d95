// pdpclient: the node tier's test app. It reads only what pdp-injector gave its container (CERBOS_PDP_ADDR,
// CERBOS_PDP_SOCKET, and with a profile's tls setting CERBOS_PDP_TLS, CERBOS_PDP_TLS_CA,
// CERBOS_PDP_TLS_SERVER_NAME, CERBOS_PDP_TLS_CERT, CERBOS_PDP_TLS_KEY) and makes real Cerbos CheckResources calls
// with the shipped sample policy
// (manifests/components/pdp-daemonset/policies/document.yaml: role user may view a document, nothing else):
//
//	tcp     gRPC  cerbos.svc.v1.CerbosService/CheckResources to $CERBOS_PDP_ADDR (HTTP/2 cleartext, or TLS with
//	              ALPN h2 when CERBOS_PDP_TLS=true: the server verified against the CA file and the server name,
//	              the client certificate given when the variables name one; files read at each dial, so
//	              rotated certificates are used without a restart)
//	http    HTTP  POST /api/check/resources to $CERBOS_PDP_HTTP_ADDR (HTTP/1.1, or TLS with ALPN http/1.1 when
//	              CERBOS_PDP_TLS=true, verified as for tcp)
//	socket  HTTP  POST /api/check/resources on $CERBOS_PDP_SOCKET (the JSON API, as curl --unix-socket does)
//	sgrpc   gRPC  the same gRPC call over $CERBOS_PDP_SOCKET (Cerbos serves gRPC on its HTTP listener too)
//
// Each check asks for view (expected EFFECT_ALLOW) and delete (expected EFFECT_DENY).
//
//	pdpclient check [--sleep] [--wait D]
//	                                one round over every wired path, first attempt only (unless --wait: retry for
//	                                up to D); exit 1 if a wired path failed or answered wrong; --sleep: then sleep
//	                                forever (a Deployment)
//	pdpclient watch [--interval D]  check every D (default 100ms) over tcp, http and socket, forever; prints every
//	                                failure and, every second, `summary PATH ok=N fail=N longest_gap_ms=N ...`
//	pdpclient flood [--connections N] [--period D]
//	                                a hostile app: holds N connections (default 2000) to $CERBOS_PDP_SOCKET, each
//	                                sent one byte every D (default 500ms) so it stays in the middle of a request;
//	                                one the front closes is opened again after D; prints every second
//	                                `flood held=N opened=N closed=N` (held: open for two periods or more)
//	pdpclient resolve NAME...       prints the Pod's resolv.conf (`resolv.conf ...`, one line), then looks each
//	                                name up with Go's resolver, as an app's dial does (search list, ndots):
//	                                `RESOLVED name addr,... (N ms)`, `NXDOMAIN name (N ms)` or `ERROR name: why`;
//	                                exit 1 if any lookup ended in an error other than NXDOMAIN
//
// Only the Go standard library and golang.org/x/net/http2 (Debian's golang-golang-x-net-dev); the protobuf
// messages are encoded by hand (the fields used are listed next to each function).
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"
)

const timeout = 2 * time.Second

var expected = map[string]string{"view": "EFFECT_ALLOW", "delete": "EFFECT_DENY"}

// ---- protobuf, by hand ------------------------------------------------------------------------------------

func varint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func field(b []byte, num int, payload []byte) []byte { // wire type 2: length-delimited
	b = varint(b, uint64(num)<<3|2)
	b = varint(b, uint64(len(payload)))
	return append(b, payload...)
}

func str(b []byte, num int, s string) []byte { return field(b, num, []byte(s)) }

// checkResourcesRequest encodes cerbos.request.v1.CheckResourcesRequest:
//
//	1 request_id string; 3 principal cerbos.engine.v1.Principal {1 id, 3 roles}; 4 resources repeated
//	ResourceEntry {1 actions repeated string, 2 resource cerbos.engine.v1.Resource {1 kind, 3 id}}
func checkResourcesRequest(id string) []byte {
	var principal, resource, entry, req []byte
	principal = str(principal, 1, "alice")
	principal = str(principal, 3, "user")
	resource = str(resource, 1, "document")
	resource = str(resource, 3, "doc-1")
	entry = str(entry, 1, "view")
	entry = str(entry, 1, "delete")
	entry = field(entry, 2, resource)
	req = str(req, 1, id)
	req = field(req, 3, principal)
	req = field(req, 4, entry)
	return req
}

type pbField struct {
	num  int
	wire int
	v    uint64
	data []byte
}

func parse(b []byte) ([]pbField, error) {
	var out []pbField
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 {
			return nil, errors.New("bad protobuf key")
		}
		b = b[n:]
		f := pbField{num: int(key >> 3), wire: int(key & 7)}
		switch f.wire {
		case 0:
			v, n := binary.Uvarint(b)
			if n <= 0 {
				return nil, errors.New("bad varint")
			}
			f.v, b = v, b[n:]
		case 1:
			if len(b) < 8 {
				return nil, errors.New("short fixed64")
			}
			b = b[8:]
		case 2:
			l, n := binary.Uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return nil, errors.New("bad length")
			}
			f.data, b = b[n:n+int(l)], b[n+int(l):]
		case 5:
			if len(b) < 4 {
				return nil, errors.New("short fixed32")
			}
			b = b[4:]
		default:
			return nil, fmt.Errorf("unsupported wire type %d", f.wire)
		}
		out = append(out, f)
	}
	return out, nil
}

var effects = map[uint64]string{0: "EFFECT_UNSPECIFIED", 1: "EFFECT_ALLOW", 2: "EFFECT_DENY", 3: "EFFECT_NO_MATCH"}

// effectsOf decodes cerbos.response.v1.CheckResourcesResponse: 2 results repeated ResultEntry {2 actions
// map<string, cerbos.effect.v1.Effect>}; a map entry is {1 key string, 2 value enum}.
func effectsOf(b []byte) (map[string]string, error) {
	fs, err := parse(b)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range fs {
		if f.num != 2 || f.wire != 2 {
			continue
		}
		rs, err := parse(f.data)
		if err != nil {
			return nil, err
		}
		for _, r := range rs {
			if r.num != 2 || r.wire != 2 {
				continue
			}
			kv, err := parse(r.data)
			if err != nil {
				return nil, err
			}
			var k string
			var v uint64
			for _, e := range kv {
				if e.num == 1 {
					k = string(e.data)
				} else if e.num == 2 {
					v = e.v
				}
			}
			out[k] = effects[v]
		}
	}
	return out, nil
}

// ---- transports -------------------------------------------------------------------------------------------

func h2c(dial func(ctx context.Context) (net.Conn, error)) *http.Client {
	t := &http2.Transport{
		AllowHTTP: true,
		DialTLS: func(network, addr string, _ *tls.Config) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			return dial(ctx)
		},
		ReadIdleTimeout: 2 * time.Second,
		PingTimeout:     time.Second,
	}
	return &http.Client{Transport: t, Timeout: timeout}
}

// tlsDialer dials addr and runs a TLS handshake as a gRPC SDK would with the injected variables.
func tlsDialer(addr, caFile, serverName, certFile, keyFile, proto string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		ca, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("no certificate in %s", caFile)
		}
		conf := &tls.Config{RootCAs: roots, ServerName: serverName, NextProtos: []string{proto}, MinVersion: tls.VersionTLS12}
		if certFile != "" && keyFile != "" {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, err
			}
			conf.Certificates = []tls.Certificate{cert}
		}
		d := tls.Dialer{Config: conf}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("tls: %w", err)
		}
		if p := c.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != proto {
			c.Close()
			return nil, fmt.Errorf("tls: ALPN %q, want %s", p, proto)
		}
		return c, nil
	}
}

func unixDialer(path string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}
}

func tcpDialer(addr string) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}
}

func grpcCheck(c *http.Client, id string) (map[string]string, error) {
	msg := checkResourcesRequest(id)
	frame := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
	frame = append(frame, msg...)
	req, _ := http.NewRequest("POST", "http://cerbos/cerbos.svc.v1.CerbosService/CheckResources", bytes.NewReader(frame))
	req.Header.Set("content-type", "application/grpc")
	req.Header.Set("te", "trailers")
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	status := resp.Trailer.Get("grpc-status")
	if status == "" {
		status = resp.Header.Get("grpc-status") // trailers-only answer
	}
	if resp.StatusCode != 200 || status != "0" {
		return nil, fmt.Errorf("http %d grpc-status %q %q", resp.StatusCode, status,
			resp.Trailer.Get("grpc-message")+resp.Header.Get("grpc-message"))
	}
	if len(body) < 5 {
		return nil, fmt.Errorf("short gRPC answer (%d bytes)", len(body))
	}
	return effectsOf(body[5:])
}

func httpCheck(c *http.Client, id string) (map[string]string, error) {
	reqBody := fmt.Sprintf(`{"requestId":%q,"principal":{"id":"alice","roles":["user"]},`+
		`"resources":[{"actions":["view","delete"],"resource":{"kind":"document","id":"doc-1"}}]}`, id)
	resp, err := c.Post("http://cerbos/api/check/resources", "application/json", strings.NewReader(reqBody))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("http %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	}
	var out struct {
		Results []struct {
			Actions map[string]string `json:"actions"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != 1 {
		return nil, fmt.Errorf("%d results", len(out.Results))
	}
	return out.Results[0].Actions, nil
}

type path struct {
	name   string
	target string
	check  func(id string) (map[string]string, error)
}

// fallbacks counts the checks a path's fallback answered (the central Service in CERBOS_PDP_FALLBACK_ADDR or
// CERBOS_PDP_FALLBACK_HTTP_ADDR), per path.
var fallbacks sync.Map

// withFallback asks the fallback address when the node's path fails, as an app given the fallback variable
// would: one more try, on the central Service, within the same check.
func withFallback(name string, primary, fallback func(id string) (map[string]string, error)) func(id string) (map[string]string, error) {
	if fallback == nil {
		return primary
	}
	n, _ := fallbacks.LoadOrStore(name, new(int64))
	return func(id string) (map[string]string, error) {
		got, err := primary(id)
		if err == nil {
			return got, nil
		}
		got, ferr := fallback(id + "-fallback")
		if ferr != nil {
			return nil, fmt.Errorf("%v; fallback: %v", err, ferr)
		}
		atomic.AddInt64(n.(*int64), 1)
		return got, nil
	}
}

func fallbackCount(name string) int64 {
	n, ok := fallbacks.Load(name)
	if !ok {
		return 0
	}
	return atomic.LoadInt64(n.(*int64))
}

// httpFallback is a check against CERBOS_PDP_FALLBACK_HTTP_ADDR (plaintext, in the cluster), or nil.
func httpFallback() func(id string) (map[string]string, error) {
	addr := os.Getenv("CERBOS_PDP_FALLBACK_HTTP_ADDR")
	if addr == "" {
		return nil
	}
	d := tcpDialer(addr)
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return d(ctx) },
		IdleConnTimeout: 30 * time.Second,
	}}
	return func(id string) (map[string]string, error) { return httpCheck(hc, id) }
}

func wiredPaths(grpcOnSocket bool) []path {
	var ps []path
	if addr := os.Getenv("CERBOS_PDP_ADDR"); addr != "" {
		dial, target := tcpDialer(addr), addr
		if os.Getenv("CERBOS_PDP_TLS") == "true" {
			dial = tlsDialer(addr, os.Getenv("CERBOS_PDP_TLS_CA"), os.Getenv("CERBOS_PDP_TLS_SERVER_NAME"),
				os.Getenv("CERBOS_PDP_TLS_CERT"), os.Getenv("CERBOS_PDP_TLS_KEY"), "h2")
			target = "tls://" + addr
		}
		c := h2c(dial)
		var fallback func(id string) (map[string]string, error)
		if fb := os.Getenv("CERBOS_PDP_FALLBACK_ADDR"); fb != "" {
			fc := h2c(tcpDialer(fb))
			fallback = func(id string) (map[string]string, error) { return grpcCheck(fc, id) }
		}
		ps = append(ps, path{"tcp", target, withFallback("tcp", func(id string) (map[string]string, error) { return grpcCheck(c, id) }, fallback)})
	}
	if addr := os.Getenv("CERBOS_PDP_HTTP_ADDR"); addr != "" {
		dial, target := tcpDialer(addr), addr
		if os.Getenv("CERBOS_PDP_TLS") == "true" {
			dial = tlsDialer(addr, os.Getenv("CERBOS_PDP_TLS_CA"), os.Getenv("CERBOS_PDP_TLS_SERVER_NAME"),
				os.Getenv("CERBOS_PDP_TLS_CERT"), os.Getenv("CERBOS_PDP_TLS_KEY"), "http/1.1")
			target = "tls://" + addr
		}
		// The dialer does the TLS itself (files read at each dial), so the transport sees a plain connection.
		hc := &http.Client{Timeout: timeout, Transport: &http.Transport{
			DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
			IdleConnTimeout: 30 * time.Second,
		}}
		ps = append(ps, path{"http", target, withFallback("http", func(id string) (map[string]string, error) { return httpCheck(hc, id) }, httpFallback())})
	}
	if sock := os.Getenv("CERBOS_PDP_SOCKET"); sock != "" {
		d := unixDialer(sock)
		hc := &http.Client{Timeout: timeout, Transport: &http.Transport{
			DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return d(ctx) },
			IdleConnTimeout: 30 * time.Second,
		}}
		ps = append(ps, path{"socket", sock, withFallback("socket", func(id string) (map[string]string, error) { return httpCheck(hc, id) }, httpFallback())})
		if grpcOnSocket {
			gc := h2c(d)
			ps = append(ps, path{"sgrpc", sock, func(id string) (map[string]string, error) { return grpcCheck(gc, id) }})
		}
	}
	return ps
}

func verdict(got map[string]string) error {
	for action, want := range expected {
		if got[action] != want {
			return fmt.Errorf("%s: got %q, want %s", action, got[action], want)
		}
	}
	return nil
}

func cmdCheck(args []string) int {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	sleep := fs.Bool("sleep", false, "sleep forever afterwards")
	wait := fs.Duration("wait", 0, "retry each path (every 200 ms) until it answers right or this much time passed")
	_ = fs.Parse(args)
	host, _ := os.LookupEnv("CERBOS_PDP_HOST")
	fmt.Printf("env CERBOS_PDP_HOST=%q CERBOS_PDP_ADDR=%q CERBOS_PDP_HTTP_ADDR=%q CERBOS_PDP_SOCKET=%q uid=%d\n",
		host, os.Getenv("CERBOS_PDP_ADDR"), os.Getenv("CERBOS_PDP_HTTP_ADDR"), os.Getenv("CERBOS_PDP_SOCKET"), os.Getuid())
	ps := wiredPaths(true)
	rc := 0
	if len(ps) == 0 {
		fmt.Println("FAIL no PDP wired: neither CERBOS_PDP_ADDR nor CERBOS_PDP_SOCKET is set")
		rc = 1
	}
	for _, p := range ps {
		start := time.Now()
		attempts := 0
		var got map[string]string
		var err error
		for {
			attempts++
			got, err = p.check("check-" + p.name)
			if err == nil {
				err = verdict(got)
			}
			if err == nil || time.Since(start) >= *wait {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		ms := time.Since(start).Milliseconds()
		if attempts > 1 {
			fmt.Printf("RETRIED %s %d attempts over %d ms\n", p.name, attempts, ms)
		}
		if err != nil {
			what := "first attempt"
			if attempts > 1 {
				what = fmt.Sprintf("after %d attempts", attempts)
			}
			fmt.Printf("FAIL %s %s %s: %v (%d ms)\n", p.name, p.target, what, err, ms)
			rc = 1
		} else {
			fmt.Printf("OK %s %s view=%s delete=%s (%d ms)\n", p.name, p.target, got["view"], got["delete"], ms)
		}
	}
	fmt.Printf("RESULT %s\n", map[bool]string{true: "ok", false: "failed"}[rc == 0])
	if *sleep {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
	}
	return rc
}

type stats struct {
	sync.Mutex
	ok, fail       int
	longestGap     time.Duration
	lastOK         time.Time
	failingSince   time.Time // zero while healthy
	firstFailStart time.Time
}

func cmdWatch(args []string) int {
	fs := flag.NewFlagSet("watch", flag.ExitOnError)
	interval := fs.Duration("interval", 100*time.Millisecond, "time between checks, per path")
	_ = fs.Parse(args)
	ps := wiredPaths(false)
	if len(ps) == 0 {
		fmt.Println("FAIL no PDP wired")
		return 1
	}
	all := map[string]*stats{}
	for _, p := range ps {
		st := &stats{}
		all[p.name] = st
		go func(p path, st *stats) {
			for i := 0; ; i++ {
				start := time.Now()
				got, err := p.check(fmt.Sprintf("watch-%s-%d", p.name, i))
				if err == nil {
					err = verdict(got)
				}
				now := time.Now()
				st.Lock()
				if err != nil {
					st.fail++
					if st.failingSince.IsZero() {
						st.failingSince = now
					}
					fmt.Printf("%s fail %s: %v\n", now.UTC().Format("15:04:05.000"), p.name, err)
				} else {
					if !st.failingSince.IsZero() {
						gap := now.Sub(st.lastOK)
						if st.lastOK.IsZero() {
							gap = now.Sub(st.failingSince)
						}
						if gap > st.longestGap {
							st.longestGap = gap
						}
						fmt.Printf("%s recovered %s after a gap of %d ms\n", now.UTC().Format("15:04:05.000"),
							p.name, gap.Milliseconds())
						st.failingSince = time.Time{}
					}
					st.ok++
					st.lastOK = now
				}
				st.Unlock()
				if d := *interval - time.Since(start); d > 0 {
					time.Sleep(d)
				}
			}
		}(p, st)
	}
	for range time.Tick(time.Second) {
		for _, p := range ps {
			st := all[p.name]
			st.Lock()
			cur := int64(0)
			if !st.failingSince.IsZero() {
				cur = time.Since(st.failingSince).Milliseconds()
			}
			fmt.Printf("summary %s ok=%d fail=%d longest_gap_ms=%d current_gap_ms=%d fallback=%d target=%s\n",
				p.name, st.ok, st.fail, st.longestGap.Milliseconds(), cur, fallbackCount(p.name), p.target)
			st.Unlock()
		}
	}
	return 0
}

func cmdFlood(args []string) int {
	fs := flag.NewFlagSet("flood", flag.ExitOnError)
	n := fs.Int("connections", 2000, "connections to hold")
	period := fs.Duration("period", 500*time.Millisecond, "time between two bytes on a connection")
	_ = fs.Parse(args)
	sock := os.Getenv("CERBOS_PDP_SOCKET")
	if sock == "" {
		fmt.Println("FAIL no CERBOS_PDP_SOCKET")
		return 1
	}
	var held, opened, closed atomic.Int64
	for i := 0; i < *n; i++ {
		go func() {
			for {
				c, err := net.DialTimeout("unix", sock, timeout)
				if err == nil {
					opened.Add(1)
					cycle := 0
					for {
						cycle++
						if cycle == 3 {
							held.Add(1)
						}
						if _, err := c.Write([]byte("P")); err != nil {
							break
						}
						// A read that ends before the period is the front's close (nothing is ever answered).
						_ = c.SetReadDeadline(time.Now().Add(*period))
						var b [1]byte
						if _, err := c.Read(b[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
							break
						}
					}
					_ = c.Close()
					closed.Add(1)
					if cycle >= 3 {
						held.Add(-1)
					}
				}
				time.Sleep(*period)
			}
		}()
	}
	for range time.Tick(time.Second) {
		fmt.Printf("flood held=%d opened=%d closed=%d\n", held.Load(), opened.Load(), closed.Load())
	}
	return 0
}

func cmdResolve(names []string) int {
	if conf, err := os.ReadFile("/etc/resolv.conf"); err != nil {
		fmt.Printf("resolv.conf unreadable: %v\n", err)
	} else {
		var conf1 []string
		for _, l := range strings.Split(string(conf), "\n") {
			if l = strings.Join(strings.Fields(l), " "); l != "" {
				conf1 = append(conf1, l)
			}
		}
		fmt.Printf("resolv.conf %s\n", strings.Join(conf1, " | "))
	}
	rc := 0
	for _, name := range names {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := net.DefaultResolver.LookupHost(ctx, name)
		cancel()
		ms := time.Since(start).Milliseconds()
		var dnsErr *net.DNSError
		switch {
		case err == nil:
			fmt.Printf("RESOLVED %s %s (%d ms)\n", name, strings.Join(addrs, ","), ms)
		case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
			fmt.Printf("NXDOMAIN %s (%d ms)\n", name, ms)
		default:
			fmt.Printf("ERROR %s: %v (%d ms)\n", name, err, ms)
			rc = 1
		}
	}
	return rc
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pdpclient check [--sleep] | watch [--interval D] | flood [--connections N] | resolve NAME...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "check":
		os.Exit(cmdCheck(os.Args[2:]))
	case "watch":
		os.Exit(cmdWatch(os.Args[2:]))
	case "flood":
		os.Exit(cmdFlood(os.Args[2:]))
	case "resolve":
		os.Exit(cmdResolve(os.Args[2:]))
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}
