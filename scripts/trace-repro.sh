#!/bin/sh
# docs/tracing.md reproduce run: two pods (netns) on a bridge, plain vs shortcut.
set -eu
B=${B:-bin/eztunnel}; OUT=${OUT:-results/trace}; mkdir -p $OUT
CG=$(sed -n 's/^[^ ]* \([^ ]*\) cgroup2 .*/\1/p' /proc/mounts | head -n1)/eztrc; PIN=/sys/fs/bpf/eztrc
cleanup() { kill $SRV $AG 2>/dev/null || true; $B uninstall --pin-path $PIN >/dev/null 2>&1 || true
  ip netns del eztr-a 2>/dev/null; ip netns del eztr-b 2>/dev/null; ip link del eztrbr 2>/dev/null; rmdir $CG 2>/dev/null || true; }
SRV=; AG=; trap cleanup EXIT
ip link add eztrbr type bridge; ip addr add 10.77.43.1/24 dev eztrbr; ip link set eztrbr up
for p in a:2 b:3; do n=${p%:*}; i=${p#*:}; ip netns add eztr-$n
  ip link add eztr$n type veth peer name eth0 netns eztr-$n; ip link set eztr$n master eztrbr up
  ip -n eztr-$n addr add 10.77.43.$i/24 dev eth0; ip -n eztr-$n link set eth0 up; ip -n eztr-$n link set lo up; done
mkdir -p $CG
sh -c "echo \$\$ > $CG/cgroup.procs; exec nsenter --net=/run/netns/eztr-b $B workload serve --echo :7001" & SRV=$!
sh -c "echo \$\$ > $CG/cgroup.procs; exec nsenter --net=/run/netns/eztr-b $B workload udp --serve :7002" & SRV="$SRV $!"
sleep 0.5
run() { # name proto port client-args...
  name=$1; proto=$2; port=$3; shift 3
  $B trace --host 10.77.43.3 --proto $proto --port $port --netns ",eztr-a,eztr-b" --csv $OUT/$name.csv --plot $OUT/$name --json --ready-file $OUT/.ready > $OUT/$name.json & T=$!
  while [ ! -e $OUT/.ready ]; do sleep 0.05; done; rm $OUT/.ready
  sh -c "echo \$\$ > $CG/cgroup.procs; exec nsenter --net=/run/netns/eztr-a $B $*" > /dev/null
  kill -INT $T; wait $T; }
run tcp-plain tcp 7001 workload pingpong --addr 10.77.43.3:7001 --size 100 --n 5000 --warmup 0
run udp-plain udp 7002 workload udp --addr 10.77.43.3:7002 --size 100 --n 5000
$B run --cgroup $CG --pin-path $PIN & AG=$!; sleep 1
run tcp-shortcut tcp 7001 workload pingpong --addr 10.77.43.3:7001 --size 100 --n 5000 --warmup 0
