#!/usr/bin/python3
"""Clients and servers for the Service load-balancing e2e test (TestServices).

server PORT NAME      TCP: sends NAME\\n then echoes; UDP: answers NAME|payload.
tcp HOST PORT BYTES   one connection: peer (getpeername), backend name, echo exact.
udp HOST PORT N       connected UDP: peer, N datagrams, reply sources and names.
udpun HOST PORT N     unconnected UDP (sendto/recvfrom): reply sources and names.
connerr HOST PORT     the errno name a TCP connect ends with ("ok" if it connects).
udpsticky HOST PORT   unconnected UDP, one socket: 5 datagrams, a result line, then
                      after a line on stdin 5 more and a second result line.
loop HOST PORT        TCP connections one after another until stdin closes: a line
                      per connection, the backend name or "err:<reason>".
origdst PORT N        a REDIRECT target: listens on PORT (IPv4 and IPv6), prints
                      "listening", then for N connections the SO_ORIGINAL_DST answer
                      (each connection gets the line "origdst" and is closed).
proxy PORT UID        a sidecar proxy behind an in-pod REDIRECT: runs as UID, listens on
                      PORT (IPv4), prints "listening", then for each connection reads
                      SO_ORIGINAL_DST, connects there and splices the bytes both ways;
                      a line per connection: the answer and the upstream's getpeername.
                      Ends when stdin closes.
hold TCPHOST TCPPORT UDPHOST UDPPORT
                      one TCP connection and one connected UDP socket, held: for each
                      line on stdin a result line (peers, reply source, backends,
                      whether the echoes were exact) until stdin closes.
Results are JSON on stdout.
"""
import errno
import json
import os
import socket
import sys
import threading


def family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def addr(sa):
    return "[%s]:%d" % (sa[0], sa[1]) if ":" in sa[0] else "%s:%d" % (sa[0], sa[1])


def server(port, name):
    def tcp_conn(c):
        with c:
            c.sendall(name.encode() + b"\n")
            while True:
                b = c.recv(65536)
                if not b:
                    return
                c.sendall(b)

    def tcp():
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", port))
        s.listen(128)
        while True:
            c, _ = s.accept()
            threading.Thread(target=tcp_conn, args=(c,), daemon=True).start()

    def udp():
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", port))
        while True:
            b, sa = s.recvfrom(65536)
            s.sendto(name.encode() + b"|" + b, sa)

    threading.Thread(target=udp, daemon=True).start()
    print("listening", flush=True)
    tcp()


def recv_line(s):
    b = b""
    while not b.endswith(b"\n"):
        c = s.recv(1)
        if not c:
            raise EOFError("closed before the backend's name")
        b += c
    return b[:-1].decode()


def tcp(host, port, n):
    s = socket.socket(family(host), socket.SOCK_STREAM)
    s.settimeout(20)
    s.connect((host, port))
    peer = addr(s.getpeername())
    name = recv_line(s)
    data = os.urandom(n)
    got = bytearray()

    def reader():
        while len(got) < n:
            b = s.recv(65536)
            if not b:
                break
            got.extend(b)

    r = threading.Thread(target=reader)
    r.start()
    s.sendall(data)
    r.join()
    s.close()
    return {"peer": peer, "backend": name, "exact": bytes(got) == data, "bytes": len(got)}


def udp(host, port, n, connected):
    s = socket.socket(family(host), socket.SOCK_DGRAM)
    s.settimeout(5)
    out = {"sources": [], "backends": [], "exact": True}
    if connected:
        s.connect((host, port))
        out["peer"] = addr(s.getpeername())
    for i in range(n):
        payload = os.urandom(64 + i)
        if connected:
            s.send(payload)
        else:
            s.sendto(payload, (host, port))
        b, sa = s.recvfrom(65536)
        name, _, echoed = b.partition(b"|")
        out["exact"] = out["exact"] and echoed == payload
        for k, v in (("sources", addr(sa)), ("backends", name.decode())):
            if v not in out[k]:
                out[k].append(v)
    return out


def udpsticky(host, port):
    s = socket.socket(family(host), socket.SOCK_DGRAM)
    s.settimeout(5)

    def burst():
        out = {"sources": [], "backends": []}
        for _ in range(5):
            s.sendto(b"x", (host, port))
            b, sa = s.recvfrom(65536)
            for k, v in (("sources", addr(sa)), ("backends", b.partition(b"|")[0].decode())):
                if v not in out[k]:
                    out[k].append(v)
        print(json.dumps(out), flush=True)

    burst()
    sys.stdin.readline()
    burst()


def connerr(host, port):
    s = socket.socket(family(host), socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect((host, port))
        return {"result": "ok"}
    except OSError as e:
        return {"result": errno.errorcode.get(e.errno, str(e.errno)) if e.errno else repr(e)}


def loop(host, port):
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        try:
            s = socket.socket(family(host), socket.SOCK_STREAM)
            s.settimeout(5)
            s.connect((host, port))
            name = recv_line(s)
            s.sendall(b"ping")
            echoed = b""
            while len(echoed) < 4:
                b = s.recv(4)
                if not b:
                    break
                echoed += b
            s.close()
            print(name if echoed == b"ping" else "err:echo", flush=True)
        except (OSError, EOFError) as e:
            print("err:" + repr(e), flush=True)


def hold(thost, tport, uhost, uport):
    t = socket.socket(family(thost), socket.SOCK_STREAM)
    t.settimeout(10)
    t.connect((thost, tport))
    tname = recv_line(t)
    u = socket.socket(family(uhost), socket.SOCK_DGRAM)
    u.settimeout(5)
    u.connect((uhost, uport))
    k = 0
    for _ in sys.stdin:
        k += 1
        out = {"tcp_backend": tname}
        try:
            msg = ("round %d " % k).encode() * 100
            t.sendall(msg)
            got = b""
            while len(got) < len(msg):
                b = t.recv(65536)
                if not b:
                    break
                got += b
            out["tcp_exact"] = got == msg
            out["tcp_peer"] = addr(t.getpeername())
        except OSError as e:
            out["tcp_error"] = errno.errorcode.get(e.errno, repr(e)) if e.errno else repr(e)
        try:
            payload = os.urandom(100)
            u.send(payload)
            b, sa = u.recvfrom(65536)
            name, _, echoed = b.partition(b"|")
            out.update(udp_source=addr(sa), udp_backend=name.decode(), udp_exact=echoed == payload)
            out["udp_peer"] = addr(u.getpeername())
        except OSError as e:
            out["udp_error"] = errno.errorcode.get(e.errno, repr(e)) if e.errno else repr(e)
            try:
                u.recv(65536)
            except OSError as e2:
                out["udp_recv_error"] = errno.errorcode.get(e2.errno, repr(e2)) if e2.errno else repr(e2)
        print(json.dumps(out), flush=True)


def origdst(port, n):
    import select
    import struct
    s4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s4.bind(("0.0.0.0", port))
    s4.listen(16)
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s6.bind(("::", port))
    s6.listen(16)
    print("listening", flush=True)
    for _ in range(n):
        r, _, _ = select.select([s4, s6], [], [], 30)
        if not r:
            sys.exit("no connection in 30 s")
        c, _ = r[0].accept()
        with c:
            if r[0] is s4:
                b = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST: sockaddr_in
                p, a = struct.unpack("!H", b[2:4])[0], socket.inet_ntop(socket.AF_INET, b[4:8])
            else:
                b = c.getsockopt(socket.IPPROTO_IPV6, 80, 28)  # IP6T_SO_ORIGINAL_DST: sockaddr_in6
                p, a = struct.unpack("!H", b[2:4])[0], socket.inet_ntop(socket.AF_INET6, b[8:24])
            print(json.dumps({"orig": addr((a, p))}), flush=True)
            c.sendall(b"origdst\n")


def proxy(port, uid):
    import struct
    threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # the sockets below are the proxy's: iptables' owner match and the BPF see uid
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(16)
    print("listening", flush=True)

    def pipe(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        finally:
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    while True:
        c, _ = ls.accept()
        b = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST: sockaddr_in
        p, a = struct.unpack("!H", b[2:4])[0], socket.inet_ntop(socket.AF_INET, b[4:8])
        u = socket.create_connection((a, p), timeout=10)
        print(json.dumps({"orig": addr((a, p)), "upstream_peer": addr(u.getpeername())}), flush=True)
        t = threading.Thread(target=pipe, args=(u, c))
        t.start()
        pipe(c, u)
        t.join()
        u.close()
        c.close()


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "server":
        server(int(args[0]), args[1])
    elif mode == "tcp":
        print(json.dumps(tcp(args[0], int(args[1]), int(args[2]))))
    elif mode == "udp":
        print(json.dumps(udp(args[0], int(args[1]), int(args[2]), True)))
    elif mode == "udpun":
        print(json.dumps(udp(args[0], int(args[1]), int(args[2]), False)))
    elif mode == "connerr":
        print(json.dumps(connerr(args[0], int(args[1]))))
    elif mode == "udpsticky":
        udpsticky(args[0], int(args[1]))
    elif mode == "loop":
        loop(args[0], int(args[1]))
    elif mode == "origdst":
        origdst(int(args[0]), int(args[1]))
    elif mode == "proxy":
        proxy(int(args[0]), int(args[1]))
    elif mode == "hold":
        hold(args[0], int(args[1]), args[2], int(args[3]))
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
