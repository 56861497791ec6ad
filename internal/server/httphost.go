package server

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// allowedHostsFlag is the flag that lists the HTTP listener's hosts beyond
// loopback; error bodies name it.
const allowedHostsFlag = "-http-allowed-hosts"

// hostPolicy is which Host (HTTP/1.1's header, HTTP/2's :authority: r.Host
// for both) the HTTP listener answers: a loopback name or address
// (localhost, 127.0.0.0/8, ::1) with any port, or one of hosts. A name that
// an attacker's DNS can point at 127.0.0.1 (DNS rebinding) is not served,
// so a web page of another site cannot read or start runs through a
// browser on the same machine.
type hostPolicy struct {
	// hosts are the allowed hosts without a port (any port), lower case.
	hosts map[string]bool
	// hostPorts are the allowed host:port pairs, lower case.
	hostPorts map[string]bool
}

// newHostPolicy parses allowed: host names or IP addresses, each with or
// without a port (with one, only that port), IPv6 in brackets or not.
func newHostPolicy(allowed []string) (*hostPolicy, error) {
	p := &hostPolicy{hosts: map[string]bool{}, hostPorts: map[string]bool{}}
	for _, a := range allowed {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if strings.ContainsAny(a, "/@?#* \t") {
			return nil, fmt.Errorf("%s: %q is not a host: give a name or an address, with an optional port (no scheme, path or wildcard)", allowedHostsFlag, a)
		}
		host, port, ok := splitHost(a)
		if !ok || host == "" {
			return nil, fmt.Errorf("%s: %q is not a host: give a name or an address, with an optional port", allowedHostsFlag, a)
		}
		if port == "" {
			p.hosts[host] = true
		} else {
			p.hostPorts[net.JoinHostPort(host, port)] = true
		}
	}
	return p, nil
}

// splitHost splits a Host value into its host, lower case without brackets
// or a final dot, and port ("" when it has none). ok is false when it is
// not a host[:port].
func splitHost(h string) (host, port string, ok bool) {
	h = strings.ToLower(h)
	if strings.HasPrefix(h, "[") || strings.Count(h, ":") == 1 {
		var err error
		if host, port, err = net.SplitHostPort(h); err != nil {
			// "[::1]" without a port.
			if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
				host, port = h[1:len(h)-1], ""
			} else {
				return "", "", false
			}
		}
		if strings.HasPrefix(h, "[") && net.ParseIP(host) == nil {
			return "", "", false
		}
	} else {
		host = h // a name, an IPv4 address, or IPv6 without brackets
	}
	for _, c := range port {
		if c < '0' || c > '9' {
			return "", "", false
		}
	}
	host = strings.TrimSuffix(host, ".")
	return host, port, true
}

// allows says whether the listener answers a request for Host h.
func (p *hostPolicy) allows(h string) bool {
	host, port, ok := splitHost(h)
	if !ok || host == "" {
		return false
	}
	if isLoopbackHost(host) || p.hosts[host] {
		return true
	}
	return port != "" && p.hostPorts[net.JoinHostPort(host, port)]
}

// isLoopbackHost says whether host (no port, lower case) is localhost or a
// loopback address.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// errNoOrigin is originHost's answer for an Origin that names no host
// ("null": a sandboxed frame, a file:// page).
var errNoOrigin = errors.New("names no host")

// originHost returns an Origin's host[:port], lower case, its scheme's
// default port dropped.
func originHost(origin string) (string, error) {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", errNoOrigin
	}
	return canonicalHost(u.Host, u.Scheme), nil
}

// canonicalHost writes a host[:port] in lower case without a final dot,
// the port dropped when it is scheme's default (either HTTP's or HTTPS's
// when scheme is "": a Host header does not say which the client used,
// behind a TLS-terminating proxy).
func canonicalHost(h, scheme string) string {
	host, port, ok := splitHost(h)
	if !ok {
		return strings.ToLower(h)
	}
	switch {
	case port == "",
		port == "80" && scheme != "https",
		port == "443" && scheme != "http":
		if strings.Contains(host, ":") {
			return "[" + host + "]"
		}
		return host
	}
	return net.JoinHostPort(host, port)
}

// checkHost refuses, on every route of next, a request whose Host is not
// allowed by p (421 Misdirected Request), and a state-changing request (any
// method but GET, HEAD and OPTIONS: every call of the API is a POST) whose
// Origin is not the request's own host (403 Forbidden): a browser sends
// Origin with every POST, and a page of another site would otherwise make
// calls with the user's browser (CSRF). A request without Origin (curl, a
// gRPC client, any client but a browser) is not asked for one.
func checkHost(p *hostPolicy, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.allows(r.Host) {
			what := fmt.Sprintf("Host %q is", r.Host)
			if r.Host == "" {
				what = "a request without a Host is"
			}
			refuse(w, http.StatusMisdirectedRequest, fmt.Sprintf(
				"%s not served here: this listener answers loopback names and addresses (localhost, 127.0.0.1, [::1]) "+
					"and the hosts that serve's %s lists (a name the DNS rebinds to this machine must not reach it); "+
					"add the name clients use to %s", what, allowedHostsFlag, allowedHostsFlag))
			return
		}
		switch r.Method {
		case http.MethodGet, http.MethodHead, http.MethodOptions:
		default:
			origin := r.Header.Get("Origin")
			if origin == "" {
				break
			}
			scheme := ""
			if r.TLS != nil {
				scheme = "https"
			}
			oh, err := originHost(origin)
			if err == nil && oh == canonicalHost(r.Host, scheme) {
				break
			}
			refuse(w, http.StatusForbidden, fmt.Sprintf(
				"Origin %q is not this server's (Host %q): a page of another site may not call the API; "+
					"call it from the page this listener serves, or from a client that sends no Origin", origin, r.Host))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuse answers code with msg as plain text.
func refuse(w http.ResponseWriter, code int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, msg)
}

// CheckAllowedHosts checks a list of -http-allowed-hosts (what HTTPHandler
// takes), before anything is bound.
func CheckAllowedHosts(hosts []string) error {
	_, err := newHostPolicy(hosts)
	return err
}

// ListenHosts are the hosts an HTTP listener on listen, bound at bound
// (nil: not yet), answers besides loopback and -http-allowed-hosts: the
// listen address's own host as given (a name or an address) and the
// address it was bound to, unless they are every interface (0.0.0.0, ::,
// empty), which names no host clients would send: on such a listener only
// the hosts -http-allowed-hosts lists are served.
func ListenHosts(listen string, bound net.Addr) []string {
	var hosts []string
	add := func(h string) {
		if h == "" {
			return
		}
		if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
			return
		}
		hosts = append(hosts, h)
	}
	if h, _, err := net.SplitHostPort(listen); err == nil {
		add(h)
	}
	if tcp, ok := bound.(*net.TCPAddr); ok && tcp != nil {
		add(tcp.IP.String())
	}
	return hosts
}
