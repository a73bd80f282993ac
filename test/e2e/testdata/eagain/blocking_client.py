# Reads one line from HOST:PORT with a blocking socket while a SIGALRM
# handler is installed, and prints what the application observed as JSON.
# Modes: recv (socket.recv, no timeout), recv_sarestart (same, handler with
# SA_RESTART), timeout (settimeout: CPython polls a non-blocking socket),
# makefile (sock.makefile("rb").readline(), as http.client does).
import errno, json, signal, socket, sys

host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
signals = 0


def on_alarm(signum, frame):
    global signals
    signals += 1


signal.signal(signal.SIGALRM, on_alarm)
if mode == "recv_sarestart":
    signal.siginterrupt(signal.SIGALRM, False)
s = socket.create_connection((host, port))
if mode == "timeout":
    s.settimeout(600)
out = {}
try:
    if mode == "makefile":
        data = s.makefile("rb").readline()
    else:
        data = s.recv(100)
    out["result"] = "data" if data == b"hello from the gate\n" else "short:%r" % data
except OSError as e:
    out["result"] = "%s(%s)" % (type(e).__name__, errno.errorcode.get(e.errno, e.errno))
out["handler_ran"] = signals > 0
print(json.dumps(out, sort_keys=True))
