"""All-reduce speed on emulated hosts behind a rate-limited network.

    sudo python tools/netbench.py --quick              # about 4 minutes
    sudo python tools/netbench.py                      # the full run (prints its estimate)
    sudo python tools/netbench.py --procs 4 --rates 100mbit --sizes 8M --dtypes bf16 \
        --scheme="--equarx_enable" --scheme="--equarx_enable --equarx_format=int4"

P JAX processes (--procs hosts, --devices-per-host D CPU devices each, jax.distributed
over gloo), each in its own network namespace whose egress tc limits to RATE
(tools/netns.py).  One psum over all P x D devices; for every rate, dtype and
per-device message size, the same run compares:

  native    jax.lax.psum as XLA compiles it (XLA:CPU's all-reduce over gloo)
  int8ref   the hierarchical int8 all-reduce written by hand in jnp (native inside the
            host, int8 two-shot across, no rotation; tools/int8_reference.py): what a
            user gets without the pass, with the same bytes across hosts
  bf16ring  the unquantized bandwidth-optimal bf16 all-reduce, the paper's baseline:
            a ring of ppermutes across the hosts (tools/bf16_ring.py), with D > 1 on
            each host's 1/D piece between a native reduce-scatter and all-gather
            inside the host (the hierarchical bf16 all-reduce)
  SCHEME    equarx_pass.jit(psum, flags=SCHEME --equarx_min_bytes=0) per scheme; the
            hosts are its fast domains (one per process), so with D > 1 the default
            is the hierarchical form

Per program: warm-up calls, then REPEATS timed calls, each after a barrier (a
tiny psum); time of a call = the slowest host's; the table shows the median.
Bytes per host per call come from each host's interface counter (tx_bytes of
its eth0, the barrier's own bytes subtracted).  Every host checks its result
against the float64 sum of all inputs (relative L2 error) and hashes it; "same"
says whether every rank got identical bits.

Writes results/netbench.json (or --out) and a PNG plot next to it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib  # noqa: E402

PORT = 12355
BASELINES = ("native", "bf16ring", "int8ref")
DTYPE_BYTES = {"bf16": 2, "f32": 4}
SMALL_BYTES, SMALL_REPEATS = 1 << 20, 25  # below 1 MiB: at least 25 timed calls
STEP_LATENCY_S = 2e-3  # measured per ring step on a 2-core host (docs/performance.md)


# --- worker: runs inside one host namespace ------------------------------------


def _tx_bytes() -> int:
  with open("/sys/class/net/eth0/statistics/tx_bytes") as f:
    return int(f.read())


def _inputs(rank: int, num_values: int, dtype, seed: int = 0):
  import numpy as np

  rng = np.random.default_rng([seed, rank, num_values])
  return rng.standard_normal(num_values, dtype=np.float32).astype(dtype)


def worker(cfg: dict) -> None:
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax
  import jax.numpy as jnp
  import numpy as np
  from bf16_ring import bf16_ring_allreduce
  from int8_reference import hierarchical_int8
  from jax.sharding import Mesh, NamedSharding
  from jax.sharding import PartitionSpec as P

  import equarx_pass

  rank, hosts, per_host = cfg["rank"], cfg["procs"], cfg.get("devices_per_host", 1)
  jax.config.update("jax_num_cpu_devices", per_host)
  jax.distributed.initialize(
    cfg["coordinator"], num_processes=hosts, process_id=rank, initialization_timeout=120
  )
  n = hosts * per_host
  assert jax.device_count() == n, jax.devices()
  devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  mesh = Mesh(np.array(devices).reshape(hosts, per_host), ("host", "dev"))
  axes = ("host", "dev")
  sharding = NamedSharding(mesh, P(axes))
  local = [d for d in devices if d.process_index == jax.process_index()]
  out = open(cfg["out"], "a")
  say = print if rank == 0 else (lambda *a, **k: None)

  def global_array(values_of):
    """values_of(i): the values of device i (global position)."""
    first = values_of(rank * per_host)
    return jax.make_array_from_single_device_arrays(
      (n,) + first.shape,
      sharding,
      [jax.device_put(values_of(rank * per_host + j)[None], d) for j, d in enumerate(local)],
    )

  def shard_mapped(body):
    return jax.shard_map(body, mesh=mesh, in_specs=P(axes), out_specs=P(axes))

  def hierarchical_bf16(v):
    """Native reduce-scatter inside the host, the bf16 ring across hosts, all-gather."""
    v = v.reshape(-1)
    size = v.shape[0]
    pad = -size % per_host
    piece = jax.lax.psum_scatter(jnp.pad(v, (0, pad)), "dev", tiled=True)
    piece = bf16_ring_allreduce(piece, "host", hosts)
    return jax.lax.all_gather(piece, "dev", tiled=True)[:size].reshape(1, -1)

  barrier_fn = jax.jit(shard_mapped(lambda v: jax.lax.psum(v, axes)))
  token = global_array(lambda i: np.ones(1, np.float32))

  def barrier():
    barrier_fn(token).block_until_ready()

  barrier()
  tx = _tx_bytes()
  for _ in range(20):
    barrier()
  barrier_bytes = (_tx_bytes() - tx) / 20

  def reference_int8(v):
    flat = v.reshape(-1)
    return hierarchical_int8(flat, "dev", "host", per_host, hosts).reshape(1, -1)

  def programs(nbytes_model):
    progs = {
      "native": (jax.jit(shard_mapped(lambda v: jax.lax.psum(v, axes))), None),
      "bf16ring": (jax.jit(shard_mapped(hierarchical_bf16)), nbytes_model),
      "int8ref": (jax.jit(shard_mapped(reference_int8)), None),
    }
    for scheme in cfg["schemes"]:
      try:
        f = equarx_pass.jit(
          shard_mapped(lambda v: jax.lax.psum(v, axes)), flags=scheme + " --equarx_min_bytes=0"
        )
      except equarx_pass.FlagError as e:
        progs[scheme] = (None, f"not available ({e})")
        continue
      progs[scheme] = (f, None)
    return progs

  for dtype_name in cfg["dtypes"]:
    dtype = {"bf16": jnp.bfloat16, "f32": np.float32}[dtype_name]
    for size in cfg["sizes"]:
      num_values = size // DTYPE_BYTES[dtype_name]
      exact = sum(_inputs(r, num_values, dtype).astype(np.float64) for r in range(n))
      x = global_array(lambda i: _inputs(i, num_values, dtype))
      # Per host: each of its devices rings its 1/D piece across the hosts in bf16.
      piece = -(-num_values // per_host)
      ring_bytes = per_host * 2 * (hosts - 1) * -(-piece // hosts) * 2
      for name, (f, note) in programs(ring_bytes).items():
        row = dict(rank=rank, rate=cfg["rate"], dtype=dtype_name, size=size, program=name)
        if f is None:
          out.write(json.dumps(dict(row, error=note)) + "\n")
          out.flush()
          continue
        try:
          start = time.perf_counter()
          y = f(x)  # compiles (and, for equarx, rewrites)
          y.block_until_ready()
          first = time.perf_counter() - start
          # Small messages take milliseconds and scheduling noise on 2 shared cores
          # is of the same order: more calls.  Decided by size, so every rank
          # makes the same number of calls.
          small = size < SMALL_BYTES
          for _ in range(cfg["warmup"] + 2 * small):
            barrier()
            f(x).block_until_ready()
          reps = max(cfg["repeats"], SMALL_REPEATS) if small else cfg["repeats"]
          times = []
          tx = _tx_bytes()
          for _ in range(reps):
            barrier()
            start = time.perf_counter()
            y = f(x)
            y.block_until_ready()
            times.append(time.perf_counter() - start)
          sent = (_tx_bytes() - tx - reps * barrier_bytes) / reps
          shards = [np.asarray(s.data).reshape(-1) for s in y.addressable_shards]
          got = shards[0]
          err = float(np.linalg.norm(got.astype(np.float64) - exact) / np.linalg.norm(exact))
          # "same" across hosts compares these; a host whose devices differ never matches.
          digest = hashlib.sha256(got.tobytes()).hexdigest()[:16]
          if any(not np.array_equal(got, other) for other in shards[1:]):
            digest = f"{digest}-devices-differ-on-host-{rank}"
          model = None
          if hasattr(f, "report") and f.report.records:
            # The report's bytes across hosts, per device: what this host's link carries.
            record = f.report.records[-1]
            after = record.traffic_after
            model = per_host * after.slow if after is not None else record.bytes_after
          elif name == "bf16ring":
            model = ring_bytes
          elif name == "int8ref":  # codes and one f32 scale per 128, twice (S-1)/S
            unit = per_host * hosts * 128
            padded = -(-num_values // unit) * unit
            model = 2 * (hosts - 1) * padded // hosts * (1 + 4 / 128)
          row.update(
            times=times,
            first_call=first,
            tx_bytes=sent,
            model_bytes=model,
            rel_err=err,
            digest=digest,
          )
        except Exception as e:  # one broken scheme must not sink the run
          row.update(error=f"{type(e).__name__}: {str(e)[:300]}")
        out.write(json.dumps(row) + "\n")
        out.flush()
        if "times" in row:
          say(
            f"  {cfg['rate']:>8} {dtype_name:>4} {benchlib.fmt_bytes(size):>9} "
            f"{name:<44} {statistics.median(row['times']) * 1e3:9.1f} ms  "
            f"{row['tx_bytes'] / 2**20:8.2f} MiB sent  err {row['rel_err']:.1e}",
            flush=True,
          )
        else:
          say(
            f"  {cfg['rate']:>8} {dtype_name:>4} {benchlib.fmt_bytes(size):>9} "
            f"{name:<44} {row['error'][:80]}",
            flush=True,
          )
  out.close()
  barrier()
  jax.distributed.shutdown()


# --- parent: builds the network, starts the workers, aggregates ----------------


def estimate_seconds(sizes, dtypes, rate_bps, procs, programs, repeats, warmup) -> float:
  """A rough model: bf16-ring bytes at the link rate, native at 4 bytes/value."""
  total = 0.0
  for dtype in dtypes:
    for size in sizes:
      values = size // DTYPE_BYTES[dtype]
      ring = 2 * (procs - 1) * -(-values // procs) * 2 * 8 / rate_bps
      latency = 2 * (procs - 1) * STEP_LATENCY_S
      per = {"native": 2 * ring + latency, "bf16ring": ring + latency, "int8ref": ring / 2}
      calls = max(repeats, SMALL_REPEATS) + 2 if size < SMALL_BYTES else repeats
      for p in programs:
        t = per.get(p, ring / 2 + latency + values * 20e-9 * procs)
        total += (calls + warmup + 1) * t + 0.7
  return total + 15


def run_rate(net, rate, cfg, outdir) -> list[dict]:
  import netns

  net.set_rate(None if rate == "none" else rate)
  env = dict(
    os.environ,
    JAX_PLATFORMS="cpu",
    TF_CPP_MIN_LOG_LEVEL="3",
    PYTHONPATH=benchlib.ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
  )
  env.pop("XLA_FLAGS", None)  # one CPU device per process
  if cfg.get("xla_flags"):
    env["XLA_FLAGS"] = cfg["xla_flags"]
  rate_bps = netns.parse_rate(rate) if rate != "none" else 10**10
  budget = cfg["budget"][rate]
  procs, files = [], []
  for i in range(net.num_hosts):
    path = os.path.join(outdir, f"{rate}-host{i}.jsonl")
    files.append(path)
    wcfg = dict(
      cfg["worker"],
      rank=i,
      procs=net.num_hosts,
      rate=rate,
      out=path,
      coordinator=f"{net.host_ip(0)}:{PORT}",
    )
    log = open(os.path.join(outdir, f"{rate}-host{i}.log"), "w")
    argv = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(wcfg)]
    procs.append(net.start_on_host(i, argv, env=env, stdout=None if i == 0 else log, stderr=log))
  load_before = os.getloadavg()
  codes = net.wait_all(procs, timeout=budget)
  load_after = os.getloadavg()
  if any(codes):
    print(f"{rate}: worker exit codes {codes} (logs in {outdir})", file=sys.stderr)
  rows = []
  for path in files:
    if os.path.exists(path):
      with open(path) as f:
        rows.extend(json.loads(line) for line in f if line.strip())
  del rate_bps
  for r in rows:
    r["loadavg"] = [load_before[0], load_after[0]]
  return rows


def aggregate(rows: list[dict], procs: int) -> list[dict]:
  """One row per (rate, dtype, size, program): the slowest host per call, medians."""
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault((r["rate"], r["dtype"], r["size"], r["program"]), []).append(r)
  out = []
  for (rate, dtype, size, program), rs in groups.items():
    row = dict(rate=rate, dtype=dtype, size=size, program=program, hosts=len(rs))
    errors = [r["error"] for r in rs if "error" in r]
    if errors or len(rs) < procs:
      row["error"] = errors[0] if errors else f"only {len(rs)} of {procs} hosts reported"
      out.append(row)
      continue
    per_call = [max(ts) for ts in zip(*(r["times"] for r in rs))]
    row.update(
      seconds=statistics.median(per_call),
      calls=len(per_call),
      per_call=per_call,
      tx_bytes_hosts=[r["tx_bytes"] for r in sorted(rs, key=lambda r: r["rank"])],
      seconds_min=min(per_call),
      seconds_max=max(per_call),
      tx_bytes=statistics.mean(r["tx_bytes"] for r in rs),
      tx_bytes_max=max(r["tx_bytes"] for r in rs),
      model_bytes=rs[0].get("model_bytes"),
      rel_err=max(r["rel_err"] for r in rs),
      same=len({r["digest"] for r in rs}) == 1,
      first_call=max(r["first_call"] for r in rs),
      loadavg=rs[0].get("loadavg"),
    )
    out.append(row)
  # Ratios to both baselines, within each (rate, dtype, size).
  base = {(r["rate"], r["dtype"], r["size"], r["program"]): r for r in out if "seconds" in r}
  for r in out:
    if "seconds" not in r:
      continue
    for b in BASELINES:
      ref = base.get((r["rate"], r["dtype"], r["size"], b))
      if ref:
        r[f"vs_{b}"] = ref["seconds"] / r["seconds"]
        r[f"bytes_vs_{b}"] = ref["tx_bytes"] / r["tx_bytes"] if r["tx_bytes"] > 0 else None
  return out


def label(program: str) -> str:
  return program if program in BASELINES else benchlib.scheme_label(program)


def print_tables(agg: list[dict]) -> str:
  cols = [
    "rate",
    "dtype",
    "size",
    "program",
    "median ms",
    "MiB sent/host",
    "x native",
    "x bf16ring",
    "x int8ref",
    "bytes x bf16ring",
    "rel err",
    "same",
  ]
  rows = []
  for r in sorted(agg, key=lambda r: (r["rate"], r["dtype"], r["size"])):
    row = {
      "rate": r["rate"],
      "dtype": r["dtype"],
      "size": benchlib.fmt_bytes(r["size"]),
      "program": label(r["program"]),
    }
    if "seconds" in r:
      row.update(
        {
          "median ms": f"{r['seconds'] * 1e3:.1f}",
          "MiB sent/host": f"{r['tx_bytes'] / 2**20:.3f}",
          "x native": f"{r.get('vs_native', 0):.2f}",
          "x bf16ring": f"{r.get('vs_bf16ring', 0):.2f}",
          "x int8ref": f"{r.get('vs_int8ref', 0):.2f}",
          "bytes x bf16ring": (
            f"{r['bytes_vs_bf16ring']:.2f}" if r.get("bytes_vs_bf16ring") else "-"
          ),
          "rel err": f"{r['rel_err']:.1e}",
          "same": "yes" if r["same"] else "NO",
        }
      )
    else:
      row["median ms"] = r["error"][:60]
    rows.append(row)
  text = benchlib.table(rows, cols)
  print(text)
  return benchlib.markdown_table(rows, cols)


def pivot_markdown(agg: list[dict], min_size: int = 0) -> str:
  """One row per (rate, dtype, size): median ms of every program, then each scheme's
  speed-up over both baselines, bytes per host, error and bit-identity."""
  programs = list(dict.fromkeys(r["program"] for r in agg))
  schemes = [p for p in programs if p not in BASELINES]
  by = {(r["rate"], r["dtype"], r["size"], r["program"]): r for r in agg}
  cols = (
    ["rate", "dtype", "size/dev"]
    + [f"{label(p)} ms" for p in programs]
    + [f"{label(p)} x ring / x native" for p in schemes]
    + ["MiB sent/host: " + " / ".join(label(p) for p in programs[:3])]
    + [f"{label(p)} rel err" for p in schemes[:1]]
    + ["bf16ring rel err", "same bits"]
  )
  rows = []
  for rate, dtype, size in sorted(
    {(r["rate"], r["dtype"], r["size"]) for r in agg}, key=lambda k: (k[0], k[1], k[2])
  ):
    if size < min_size:
      continue
    row = {"rate": rate, "dtype": dtype, "size/dev": benchlib.fmt_bytes(size)}
    got = [by.get((rate, dtype, size, p)) for p in programs]
    for p, r in zip(programs, got):
      row[f"{label(p)} ms"] = f"{r['seconds'] * 1e3:.1f}" if r and "seconds" in r else "-"
    for p in schemes:
      r = by.get((rate, dtype, size, p))
      if r and "vs_bf16ring" in r:
        row[f"{label(p)} x ring / x native"] = f"{r['vs_bf16ring']:.2f} / {r['vs_native']:.2f}"
    row[cols[3 + len(programs) + len(schemes)]] = " / ".join(
      f"{r['tx_bytes'] / 2**20:.2f}" if r and "tx_bytes" in r else "-" for r in got[:3]
    )
    first = by.get((rate, dtype, size, schemes[0])) if schemes else None
    ring = by.get((rate, dtype, size, "bf16ring"))
    if first and "rel_err" in first:
      row[f"{label(schemes[0])} rel err"] = f"{first['rel_err']:.1e}"
    if ring and "rel_err" in ring:
      row["bf16ring rel err"] = f"{ring['rel_err']:.1e}"
    row["same bits"] = "yes" if all(r and r.get("same") for r in got) else "NO"
    rows.append(row)
  return benchlib.markdown_table(rows, cols)


def threshold(agg: list[dict], scheme: str) -> int | None:
  """Smallest measured size from which `scheme` beats native at every larger size,
  every rate and dtype (None: never)."""
  agg = [r for r in agg if r["rate"] != "none"]  # unshaped: a compute floor, no link
  sizes = sorted({r["size"] for r in agg})
  keys = {(r["rate"], r["dtype"]) for r in agg}
  best = None
  for size in reversed(sizes):
    rows = [r for r in agg if r["size"] == size and r["program"] == scheme and "seconds" in r]
    if len(rows) < len(keys) or any(r["vs_native"] <= 1.0 for r in rows):
      break
    best = size
  return best


def summary(agg: list[dict]) -> list[str]:
  """The figures the targets are about, one line each."""
  lines = []
  schemes = [p for p in dict.fromkeys(r["program"] for r in agg) if p not in BASELINES]
  for scheme in schemes:
    rs = [r for r in agg if r["program"] == scheme and "vs_bf16ring" in r]
    for rate in sorted({r["rate"] for r in rs}):
      for dtype in sorted({r["dtype"] for r in rs}):
        sel = sorted(
          (r for r in rs if r["rate"] == rate and r["dtype"] == dtype), key=lambda r: r["size"]
        )
        big = [r for r in sel if r["size"] >= 8 << 20]
        if big:
          lines.append(
            f"{label(scheme)} at {rate}, {dtype}: over the bf16 ring "
            + ", ".join(f"{benchlib.fmt_bytes(r['size'])} {r['vs_bf16ring']:.2f}x" for r in big)
            + "; over native "
            + ", ".join(f"{benchlib.fmt_bytes(r['size'])} {r['vs_native']:.2f}x" for r in big)
            + "; over the hand-written int8 "
            + ", ".join(
              f"{benchlib.fmt_bytes(r['size'])} {r.get('vs_int8ref', float('nan')):.2f}x"
              for r in big
            )
          )
    t = threshold(agg, scheme)
    lines.append(
      f"{label(scheme)}: faster than native at every shaped rate and dtype from "
      f"{benchlib.fmt_bytes(t)} up"
      if t
      else f"{label(scheme)}: at no measured size faster than native at every shaped rate and dtype"
    )
  return lines


def plot(agg: list[dict], path: str) -> None:
  """Top row: median time per call; bottom row: speed-up over the bf16 ring."""
  plt = benchlib.pyplot()
  if plt is None:
    return
  keys = sorted({(r["rate"], r["dtype"]) for r in agg})
  fig, axes = plt.subplots(2, len(keys), figsize=(3.6 * len(keys), 5.6), squeeze=False)
  for col, (rate, dtype) in enumerate(keys):
    rs = [r for r in agg if r["rate"] == rate and r["dtype"] == dtype and "seconds" in r]
    for program in dict.fromkeys(r["program"] for r in rs):
      mine = sorted((r for r in rs if r["program"] == program), key=lambda r: r["size"])
      style = "--" if program in BASELINES else "-"
      mib = [r["size"] / 2**20 for r in mine]
      axes[0][col].plot(
        mib, [r["seconds"] * 1e3 for r in mine], style, marker=".", label=label(program)
      )
      axes[1][col].plot(
        mib,
        [r.get("vs_bf16ring", float("nan")) for r in mine],
        style,
        marker=".",
        label=label(program),
      )
    axes[0][col].set_title(f"{rate}, {dtype}", fontsize=9)
    axes[0][col].set_yscale("log")
    axes[0][col].set_ylabel("median ms per all-reduce")
    axes[1][col].axhline(1, color="grey", lw=0.5)
    axes[1][col].set_ylabel("speed-up over the bf16 ring")
    axes[1][col].set_xlabel("MiB per device")
    for ax in (axes[0][col], axes[1][col]):
      ax.set_xscale("log", base=2)
  axes[0][0].legend(fontsize=7)
  fig.suptitle(
    f"all-reduce on {agg[0].get('hosts', '?')} emulated hosts (slowest host per call, median)",
    fontsize=9,
  )
  fig.tight_layout()
  benchlib.save_plot(fig, path)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--procs", type=int, default=4, help="hosts")
  ap.add_argument(
    "--devices-per-host", type=int, default=1, help="CPU devices in each host's process"
  )
  ap.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
  ap.add_argument(
    "--sizes",
    nargs="+",
    default=None,
    help="bytes per device, e.g. 64K 1M 32M (default depends on --quick)",
  )
  ap.add_argument(
    "--max-size",
    nargs="+",
    default=[],
    help="RATE=SIZE caps per rate, e.g. 100mbit=8M (the slow link takes long)",
  )
  ap.add_argument("--dtypes", nargs="+", default=["bf16", "f32"])
  benchlib.add_scheme_argument(ap)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--warmup", type=int, default=1)
  ap.add_argument("--quick", action="store_true", help="few sizes, 3 repeats")
  ap.add_argument(
    "--keep-raw", action="store_true", help="also write every host's own rows to OUT.raw.json"
  )
  ap.add_argument(
    "--xla-flags",
    default="",
    help="XLA_FLAGS for the host processes (e.g. XLA:CPU scheduler options)",
  )
  ap.add_argument(
    "--no-slow-start-after-idle",
    action="store_true",
    help="set net.ipv4.tcp_slow_start_after_idle=0 in every host namespace",
  )
  ap.add_argument("--out", default=os.path.join(benchlib.RESULTS, "netbench.json"))
  ap.add_argument(
    "--replot", metavar="JSON", help="only print the tables and redraw the plot of a saved run"
  )
  ap.add_argument("--worker", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    worker(json.loads(args.worker))
    return 0
  if args.replot:
    with open(args.replot) as f:
      agg = json.load(f)["results"]
    print(pivot_markdown(agg))
    print("\n".join(summary(agg)))
    plot(agg, os.path.splitext(args.replot)[0] + ".png")
    return 0

  import netns

  if os.geteuid() != 0:
    print("needs root (network namespaces and tc)", file=sys.stderr)
    return 2
  if args.sizes is None:
    args.sizes = (
      ["64K", "1M", "8M"] if args.quick else ["4K", "16K", "64K", "256K", "1M", "4M", "8M", "32M"]
    )
  else:
    args.sizes = [s for arg in args.sizes for s in arg.split(",")]
  if args.quick:
    args.repeats = min(args.repeats, 3)
  sizes = [benchlib.parse_size(s) for s in args.sizes]
  caps = {k: benchlib.parse_size(v) for k, v in (c.split("=") for c in args.max_size)}
  ok, missing = benchlib.split_schemes(args.scheme or benchlib.DEFAULT_SCHEMES)
  for s, why in missing.items():
    print(f"scheme {s!r}: {why}")
  programs = list(BASELINES) + ok

  plan, total = {}, 0.0
  for rate in args.rates:
    rsizes = [s for s in sizes if s <= caps.get(rate, 1 << 62)]
    bps = netns.parse_rate(rate) if rate != "none" else 10**10
    est = estimate_seconds(
      rsizes, args.dtypes, bps, args.procs, programs, args.repeats, args.warmup
    )
    plan[rate] = (rsizes, est)
    total += est
  print(
    f"{args.procs} hosts, rates {args.rates}, dtypes {args.dtypes}, "
    f"{len(programs)} programs, {args.repeats} timed calls each; "
    f"expected about {total / 60:.1f} min (each rate is stopped at 3x its estimate)"
  )

  outdir = tempfile.mkdtemp(prefix="netbench-")
  rows = []
  started = time.time()
  with netns.Network(
    args.procs, None, slow_start_after_idle=not args.no_slow_start_after_idle
  ) as net:
    for rate in args.rates:
      rsizes, est = plan[rate]
      cfg = {
        "budget": {rate: 3 * est + 60},
        "xla_flags": args.xla_flags,
        "worker": dict(
          sizes=rsizes,
          dtypes=args.dtypes,
          schemes=ok,
          repeats=args.repeats,
          warmup=args.warmup,
          devices_per_host=args.devices_per_host,
        ),
      }
      print(
        f"--- {rate}: sizes {[benchlib.fmt_bytes(s) for s in rsizes]}, about {est / 60:.1f} min"
      )
      rows.extend(run_rate(net, rate, cfg, outdir))
  elapsed = time.time() - started
  agg = aggregate(rows, args.procs)
  for r in agg:
    r["hosts"] = args.procs
  print_tables(agg)
  lines = summary(agg)
  print("\n".join(lines))
  benchlib.write_result(
    args.out,
    agg,
    procs=args.procs,
    devices_per_host=args.devices_per_host,
    rates=args.rates,
    repeats=args.repeats,
    warmup=args.warmup,
    seconds=elapsed,
    tcp_slow_start_after_idle=0 if args.no_slow_start_after_idle else 1,
    xla_flags=args.xla_flags,
    unavailable=missing,
    summary=lines,
    table_markdown=pivot_markdown(agg),
  )
  if args.keep_raw:  # every host's own timings and counters
    benchlib.write_result(os.path.splitext(args.out)[0] + ".raw.json", rows)
  print(f"{elapsed / 60:.1f} min")
  plot(agg, os.path.splitext(args.out)[0] + ".png")
  return 0


if __name__ == "__main__":
  sys.exit(main())
