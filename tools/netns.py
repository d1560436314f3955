"""Emulated hosts: network namespaces joined by veth pairs to a bridge, egress shaped by tc.

    with Network(num_hosts=4, rate="100mbit") as net:
      net.run_on_host(0, ["python", ...])      # inside host 0's namespace
      net.tx_bytes(0)                          # that host's interface counter

Layout (root needed; everything is created under a per-run name prefix):

    namespace PFX-h0  eth0 10.77.0.1/24 --veth-- vPFX0 (bridge port) --+
    namespace PFX-h1  eth0 10.77.0.2/24 --veth-- vPFX1 (bridge port) --+ br0 in PFX-br
    ...

Each host's eth0 egress goes through a tbf qdisc at `rate`, so every host sends at
most `rate` bits per second, as on a cluster's network.  Why these settings
(docs/performance.md, emulated hosts): MTU 9000 (MTU 1500 at 1 Gbit/s saturates 2 cores with
retransmits), a tbf burst of about rate x 100 us but at least one jumbo frame (a
big burst lets a stop-and-go ring spend saved tokens and beat the link), and a
200 ms latency bound.

gloo (JAX 0.10.2) takes its own address from gethostname(); inside a namespace
that resolves to 127.0.0.1 and the peers hang.  So every host process runs under
`unshare --uts` with its hostname set to its own IP address.

Everything is removed on exit from the `with` block, also on SIGINT/SIGTERM
(turned into exceptions while the block runs) and on errors; host processes run
in their own process groups, with timeouts, and are killed on the way out.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

SUBNET = "10.77.0"
MTU = 9000


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
  cmd = (["ip", "netns", "exec", netns] if netns else []) + list(args)
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
  if check and proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
  return proc.stdout


def parse_rate(text: str) -> int:
  """'100mbit', '1gbit' -> bits per second."""
  t = text.lower().strip()
  for suffix, mult in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3), ("bit", 1)):
    if t.endswith(suffix):
      return int(float(t[: -len(suffix)]) * mult)
  return int(t)


def tbf_burst(rate_bps: int) -> int:
  """Bytes of burst: about rate x 100 us, at least a jumbo frame plus headroom."""
  return max(int(rate_bps / 8 * 100e-6), 11_000)


class Network:
  """num_hosts namespaces on one shaped bridge; a context manager that cleans up."""

  def __init__(
    self,
    num_hosts: int,
    rate: str | None,
    prefix: str | None = None,
    slow_start_after_idle: bool = True,
  ):
    self.num_hosts = num_hosts
    # Linux restarts TCP slow start on a connection idle for one RTO; a ring
    # that computes between steps then pays slow start every step.  Clusters
    # that run collectives usually turn it off (per namespace, so the machine's
    # own setting is untouched).
    self.slow_start_after_idle = slow_start_after_idle
    self.rate = rate
    self.prefix = prefix or f"eqx{os.getpid() % 100000}"
    self.bridge_ns = f"{self.prefix}-br"
    self.procs: list[subprocess.Popen] = []
    self._old_handlers = {}

  # names
  def host_ns(self, i: int) -> str:
    return f"{self.prefix}-h{i}"

  def host_ip(self, i: int) -> str:
    return f"{SUBNET}.{i + 1}"

  def _port(self, i: int) -> str:
    return f"v{self.prefix[-8:]}{i}"[:15]

  # lifecycle
  def __enter__(self) -> Network:
    for sig in (signal.SIGINT, signal.SIGTERM):
      self._old_handlers[sig] = signal.signal(sig, self._on_signal)
    try:
      self._create()
    except BaseException:
      self.close()
      raise
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @staticmethod
  def _on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")

  def _create(self) -> None:
    _ip("ip", "netns", "add", self.bridge_ns)
    _ip("ip", "link", "set", "lo", "up", netns=self.bridge_ns)
    _ip("ip", "link", "add", "br0", "type", "bridge", netns=self.bridge_ns)
    _ip("ip", "link", "set", "br0", "mtu", str(MTU), "up", netns=self.bridge_ns)
    for i in range(self.num_hosts):
      ns, port = self.host_ns(i), self._port(i)
      _ip("ip", "netns", "add", ns)
      # Create the pair in the host namespace, then move the bridge end.
      _ip(
        "ip",
        "link",
        "add",
        "eth0",
        "mtu",
        str(MTU),
        "type",
        "veth",
        "peer",
        "name",
        port,
        "mtu",
        str(MTU),
        netns=ns,
      )
      _ip("ip", "link", "set", port, "netns", self.bridge_ns, netns=ns)
      _ip("ip", "link", "set", port, "master", "br0", "up", netns=self.bridge_ns)
      _ip("ip", "addr", "add", f"{self.host_ip(i)}/24", "dev", "eth0", netns=ns)
      _ip("ip", "link", "set", "eth0", "up", netns=ns)
      _ip("ip", "link", "set", "lo", "up", netns=ns)
      if not self.slow_start_after_idle:
        _ip("sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0", netns=ns)
    if self.rate:
      self.set_rate(self.rate)

  def set_rate(self, rate: str | None) -> None:
    """Shape every host's egress to `rate` (None: unshaped)."""
    self.rate = rate
    for i in range(self.num_hosts):
      ns = self.host_ns(i)
      _ip("tc", "qdisc", "del", "dev", "eth0", "root", netns=ns, check=False)
      if rate:
        bps = parse_rate(rate)
        _ip(
          "tc",
          "qdisc",
          "add",
          "dev",
          "eth0",
          "root",
          "tbf",
          "rate",
          str(bps),
          "burst",
          str(tbf_burst(bps)),
          "latency",
          "200ms",
          netns=ns,
        )

  def qdisc(self, i: int) -> str:
    return _ip("tc", "-s", "qdisc", "show", "dev", "eth0", netns=self.host_ns(i)).strip()

  def close(self) -> None:
    """Kill host processes, delete every namespace of this run, restore signal handlers."""
    # A second SIGTERM (`timeout` forwards one, a `pkill` sends another) must not cut the
    # cleanup short: ignore both until the namespaces are gone.
    for sig in self._old_handlers:
      signal.signal(sig, signal.SIG_IGN)
    for p in self.procs:
      if p.poll() is None:
        try:
          os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
    for p in self.procs:
      try:
        p.wait(timeout=10)
      except subprocess.TimeoutExpired:
        pass
    self.procs = []
    # Deleting a namespace deletes its veth end, and with it the pair.
    for ns in [self.host_ns(i) for i in range(self.num_hosts)] + [self.bridge_ns]:
      subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
    for sig, handler in self._old_handlers.items():
      signal.signal(sig, handler)
    self._old_handlers = {}

  # host processes
  def start_on_host(
    self, i: int, argv: list[str], env: dict | None = None, stdout=None, stderr=None
  ) -> subprocess.Popen:
    """Start argv inside host i's namespace, with hostname = its IP (for gloo)."""
    inner = f"hostname {self.host_ip(i)} && exec {shlex.join(argv)}"
    cmd = ["ip", "netns", "exec", self.host_ns(i), "unshare", "--uts", "sh", "-c", inner]
    # Own process group: close() kills the whole tree of this host, and only it.
    p = subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
    self.procs.append(p)
    return p

  def wait_all(self, procs: list[subprocess.Popen], timeout: float) -> list[int]:
    """Wait for every process; past `timeout` seconds kill the rest.  Return codes."""
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
      left = deadline - time.monotonic()
      try:
        codes.append(p.wait(timeout=max(left, 0.1)))
      except subprocess.TimeoutExpired:
        for q in procs:
          if q.poll() is None:
            os.killpg(q.pid, signal.SIGKILL)
        codes.append(p.wait())
    return codes

  def tx_bytes(self, i: int) -> int:
    out = _ip("cat", "/sys/class/net/eth0/statistics/tx_bytes", netns=self.host_ns(i))
    return int(out)


def stale_namespaces(prefix: str = "eqx") -> list[str]:
  out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


_SINK = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5999)); s.listen(1); c, _ = s.accept(); n = 0
while True:
  b = c.recv(1 << 20)
  if not b: break
  n += len(b)
print(n)
"""

_SOURCE = """
import socket, sys, time
for _ in range(100):
  try:
    c = socket.create_connection((sys.argv[1], 5999)); break
  except OSError:
    time.sleep(0.05)
t = time.perf_counter(); c.sendall(bytes(int(sys.argv[2]))); c.close()
print(time.perf_counter() - t)
"""


def smoke_test(rate: str = "100mbit", nbytes: int = 4 << 20) -> float:
  """Send nbytes from host 0 to host 1 through the shaped bridge; return bits/s."""
  with Network(2, rate) as net:
    sink = net.start_on_host(1, [sys.executable, "-c", _SINK], stdout=subprocess.PIPE)
    src = net.start_on_host(
      0, [sys.executable, "-c", _SOURCE, net.host_ip(1), str(nbytes)], stdout=subprocess.PIPE
    )
    net.wait_all([src, sink], timeout=60)
    seconds = float(src.stdout.read())
    got = int(sink.stdout.read())
    sent = net.tx_bytes(0)
  bps = nbytes * 8 / seconds
  print(
    f"{rate}: {got} bytes in {seconds:.3f} s = {bps / 1e6:.1f} Mbit/s of payload; "
    f"eth0 tx_bytes {sent} ({sent / nbytes:.3f}x payload)"
  )
  return bps


if __name__ == "__main__":
  import argparse

  argparse.ArgumentParser(
    description="Smoke test (root): 4 MiB at 100mbit and 32 MiB at 1gbit between two hosts."
  ).parse_args()
  smoke_test("100mbit")
  smoke_test("1gbit", 32 << 20)
  print("left over namespaces:", stale_namespaces() or "none")
  sys.exit(0)
