# Accepts one connection and answers only when the test writes a line on
# stdin, so the client is blocked for as long as the test needs.
# Usage: gate_server.py PORT raw|http READY_FILE
import socket, sys

port, mode, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ls = socket.socket(socket.AF_INET6)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
ls.bind(("::", port))
ls.listen()
open(ready, "w").close()
c, _ = ls.accept()
if mode == "http":
    req = b""
    while b"\r\n\r\n" not in req:
        b = c.recv(4096)
        if not b:
            sys.exit(0)
        req += b
sys.stdin.readline()
body = b"hello from the gate\n"
try:
    if mode == "http":
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    else:
        c.sendall(body)
    c.shutdown(socket.SHUT_WR)
    while c.recv(4096):
        pass
except OSError:
    pass  # the client may already have given up
