package meshlab

import (
	"fmt"
	"net/netip"
	"strings"
)

const haproxyGlobal = `global
    uid %[1]d
    gid %[1]d
    maxconn 4096%[2]s

defaults
    mode tcp
    timeout connect 5s
    timeout client 5m
    timeout server 5m
`

// SidecarConfig is one pod's sidecar.
//
// Outbound on 15001 (and 15002, where the capture sends PortEchoKernel):
// `server orig 0.0.0.0:0` forwards to the connection's
// original destination. HAProxy built with USE_LINUX_TPROXY reads
// SO_ORIGINAL_DST before getsockname, so a REDIRECTed connection reports
// where the app meant to go, as Envoy's original_dst filter does.
//
// Inbound on 15006 (and 15007): `server app 127.0.0.1` without a port
// forwards to the original destination port on loopback, as Istio's
// inbound passthrough did before it moved to the pod IP with source
// 127.0.0.6.
//
// The proxy starts as root to bind, then runs as ProxyUID; its outbound
// sockets are created after that, so the capture's owner match sees it.
// With tls the proxy-to-proxy leg is TLS: the outbound side connects with
// ssl, the inbound side terminates it with cert (a PEM file holding
// certificate and key). statsSock, when set, is an admin stats socket.
func SidecarConfig(tls bool, cert, statsSock string) string {
	var b strings.Builder
	fmt.Fprintf(&b, haproxyGlobal, ProxyUID, statsLine(statsSock))
	inSSL, outSSL := "", ""
	if tls {
		inSSL, outSSL = " ssl crt "+cert, " ssl verify none"
	}
	fmt.Fprintf(&b, `
frontend outbound
    bind 0.0.0.0:%d
    bind 0.0.0.0:%d
    default_backend original_dst

backend original_dst
    server orig 0.0.0.0:0%s

frontend inbound
    bind 0.0.0.0:%d%s
    bind 0.0.0.0:%d%s
    default_backend local_app

backend local_app
    server app 127.0.0.1
`, PortOutbound, PortOutboundKernel, outSSL, PortInbound, inSSL, PortInboundKernel, inSSL)
	return b.String()
}

// nodeProxyConfig is the shared node proxy of ambient mode. Each service
// port p has an outbound listener on p (where the client pod's DNAT sends
// it) that forwards to the inbound listener 127.0.0.1:p+offset, which
// forwards to the server pod: three TCP legs per connection, as
// app -> ztunnel -> ztunnel (HBONE) -> app. With tls the middle leg is TLS.
func nodeProxyConfig(server netip.Addr, tls bool, cert string) string {
	var b strings.Builder
	fmt.Fprintf(&b, haproxyGlobal, ProxyUID, "")
	inSSL, outSSL := "", ""
	if tls {
		inSSL, outSSL = " ssl crt "+cert, " ssl verify none"
	}
	for _, p := range servicePorts {
		in := p + ambientInboundOffset
		fmt.Fprintf(&b, `
listen out_%[1]d
    bind 0.0.0.0:%[1]d
    server hbone 127.0.0.1:%[2]d%[3]s

listen in_%[1]d
    bind 127.0.0.1:%[2]d%[4]s
    server pod %[5]s:%[1]d
`, p, in, outSSL, inSSL, server)
	}
	return b.String()
}

func statsLine(sock string) string {
	if sock == "" {
		return ""
	}
	return "\n    stats socket " + sock + " mode 600 level admin"
}

// nginxConfig serves dir/www on PortHTTP with one worker, logs off.
func nginxConfig(dir string) string {
	return fmt.Sprintf(`daemon off;
master_process on;
worker_processes 1;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    sendfile off;
    keepalive_requests 1000000;
    client_body_temp_path %[1]s/nginx-body;
    proxy_temp_path %[1]s/nginx-proxy;
    fastcgi_temp_path %[1]s/nginx-fastcgi;
    uwsgi_temp_path %[1]s/nginx-uwsgi;
    scgi_temp_path %[1]s/nginx-scgi;
    server {
        listen %[2]d;
        root %[1]s/www;
    }
}
`, dir, PortHTTP)
}
