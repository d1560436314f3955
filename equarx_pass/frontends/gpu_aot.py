"""Ahead-of-time compiles for a multi-node GPU cluster (--equarx_compile_for=gpu:h100:2x8),
and the bytes per GPU a compiled GPU program sends between nodes.

No GPU is needed.  JAX's CUDA plugin (the cuda-aot extra: jax-cuda12-plugin with pip's
nvcc and nvJitLink) gives compile-only devices for a cluster described by XLA's target
description of the GPU (gpu_targets/, shipped with the package) and a shape, N nodes of G
GPUs; its client compiles a sharded program into a real executable for that GPU (sm_90a
for the H100).  Each compile-only device has the `process_index` of its node, so
equarx_pass.jit finds the nodes as it does on the cluster (topology.from_devices).

The plugin registers only where JAX_PLATFORMS names no other platform or where a GPU is
present: on a machine without one, set JAX_PLATFORMS=cpu before JAX starts
(--equarx_compile_for compiles in a child process that does).

A compiled GPU program marks no transfer as crossing nodes (multislice TPU programs do:
tpu_aot.cross_slice_bytes); what crosses is read from each collective's replica groups
and the node of each device (cross_node_bytes).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import Any, Sequence

import numpy as np

from equarx_pass.errors import CompileError
from equarx_pass.frontends import compile_child
from equarx_pass.ir import hlo_text
from equarx_pass.ir.hlo_text import replica_groups
from equarx_pass.planning.policy import GPU_TARGET_CONFIGS, parse_cluster

COMPILE_TIMEOUT_S = 600
PLUGIN_HINT = (
  "the CUDA plugin is not installed: install the cuda-aot extra (pip install '.[cuda-aot]' "
  "in a checkout, 'equarx-pass[cuda-aot]' from a wheel)"
)


def have_cuda_plugin() -> bool:
  """Whether JAX's CUDA plugin (the cuda-aot extra) is installed, without loading it."""
  try:
    return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  except ModuleNotFoundError:  # no jax_plugins package: no plugin at all
    return False


def target_config(model: str) -> str:
  """XLA's target description of the GPU `model`, as shipped in gpu_targets/."""
  here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")
  with open(os.path.join(here, GPU_TARGET_CONFIGS[model])) as f:
    return f.read()


def cluster_devices(topology: str) -> list:
  """Compile-only devices of the cluster 'h100:2x8', node by node: device i is on node
  i // G (its process_index).  Needs the CUDA plugin registered (see the docstring)."""
  from jax.experimental import topologies

  cluster = parse_cluster(topology)
  if not have_cuda_plugin():
    raise CompileError(f"cannot make devices for gpu:{topology}: {PLUGIN_HINT}")
  desc = topologies.get_topology_desc(
    topology_name="",
    platform="cuda",
    target_config=target_config(cluster.model),
    topology=cluster.topology,
  )
  return list(desc.devices)


# --- what crosses nodes -------------------------------------------------------------

COLLECTIVES = (
  "all-reduce",
  "reduce-scatter",
  "all-gather",
  "all-to-all",
  "collective-permute",
)
# Collectives whose traffic between nodes is not read here: counting would be a guess.
_NOT_COUNTED = ("ragged-all-to-all", "collective-broadcast", "send", "recv")
_INSTRUCTION = re.compile(
  r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.+?)\s+([a-z\-]+)\((.*)$",
)


def _bytes_of(shape: str) -> float:
  """Bytes of an HLO shape: an array, or a tuple of them (summed)."""
  return hlo_text.shape_bytes(shape)[0]  # what it does not know is layouts' and tokens' text


def _top_level(shape: str) -> list[str]:
  """The elements of a tuple shape '(a, (b, c))' -> ['a', '(b, c)']; an array: [itself]."""
  shape = shape.strip()
  if not shape.startswith("("):
    return [shape]
  parts, depth, current = [], 0, ""
  for ch in shape[1:-1]:
    depth += ch in "([{"
    depth -= ch in ")]}"
    if ch == "," and depth == 0:
      parts.append(current.strip())
      current = ""
    else:
      current += ch
  return parts + [current.strip()]


def _sent_across(op: str, line: str, shape: str, node_of: Sequence[int]) -> np.ndarray:
  """Bytes each device sends to other nodes in one run of collective `op` (`line` its
  instruction, `shape` its result shape as written).

  With G the group's devices, k its nodes and m the group's devices on the sender's node,
  per device: an all-reduce of S bytes 2 (k-1)/k S/m, a reduce-scatter of an S-byte
  operand (k-1)/k S/m, an all-gather of an R-byte result (k-1)/k R/m (all three as
  bandwidth-optimal algorithms that reduce or gather inside each node first and send
  each node's part across once: exact for m = 1, and a floor otherwise, which one flat
  ring over every device exceeds), an all-to-all of S bytes the parts bound for other
  nodes, (G - m)/G S, and a collective-permute its operand to a target on another node.
  """
  start = op.endswith("-start")
  base = op[: -len("-start")] if start else op
  sent = np.zeros(len(node_of))
  parts = _top_level(shape)
  if base == "collective-permute":
    nbytes = _bytes_of(parts[0])
    pairs = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
    if pairs is None:
      raise ValueError(f"a collective-permute without pairs: {line.strip()[:300]}")
    for source, target in re.findall(r"\{(\d+),(\d+)\}", pairs.group(1)):
      if node_of[int(source)] != node_of[int(target)]:
        sent[int(source)] += nbytes
    return sent
  if base == "all-reduce":
    operand = result = _bytes_of(shape)  # (a tuple: one array per operand)
  elif start:
    operand, result = _bytes_of(parts[0]), _bytes_of(",".join(parts[1:]))
  else:
    operand = result = _bytes_of(shape)
  for group in replica_groups(line, len(node_of)):
    nodes = [node_of[d] for d in group]
    k = len(set(nodes))
    if k == 1:
      continue
    for device, node in zip(group, nodes):
      m = nodes.count(node)
      if base == "all-reduce":
        sent[device] += 2 * (k - 1) / k * result / m
      elif base == "reduce-scatter":
        # Unstarted, the shape is the result, one n-th of the operand.
        full = operand if start else result * len(group)
        sent[device] += (k - 1) / k * full / m
      elif base == "all-gather":
        sent[device] += (k - 1) / k * result / m
      elif base == "all-to-all":
        sent[device] += (len(group) - m) / len(group) * operand
  return sent


def cross_node_bytes(hlo_text: str, node_of: Sequence[int], in_branches: bool = False) -> float:
  """Bytes per device that a compiled GPU program sends between nodes in one run: the
  most any device sends.  `node_of[i]`: the node of the device with logical id i (the
  ids the replica groups name), e.g. [d.process_index for d in devices].

  Each collective is priced by _sent_across; one inside a while loop's body counts once
  per iteration (hlo_text.executions; a loop whose trip count the text does not give
  raises hlo_text.UnknownTripCount).  Computations that run only when a conditional's
  branch is taken (hlo_text.only_in_branches) are left out; `in_branches` counts them
  instead, each as if its branch were taken.  A collective of a kind not read here (send/recv,
  ragged all-to-all, broadcast) between nodes raises ValueError: its bytes would be a
  guess.
  """
  from equarx_pass.ir import hlo_text as hlo

  comps, entry = hlo.split_computations(hlo_text)
  runs = hlo.executions(hlo_text) if entry is not None else {}
  taken = hlo.only_in_branches(hlo_text) if entry is not None else frozenset()
  if entry is None:
    comps, runs = {"": hlo_text.splitlines()}, {"": 0 if in_branches else 1}
  total = np.zeros(len(node_of))
  for name, lines in comps.items():
    times = runs.get(name, 0) if (name in taken) == in_branches else 0
    for line in lines:
      found = _INSTRUCTION.match(line)
      if not found or not times:
        continue
      shape, op, _ = found.groups()
      base = op[: -len("-start")] if op.endswith("-start") else op
      if base in _NOT_COUNTED and not _one_node(line, node_of):
        raise ValueError(f"cannot count the bytes across nodes of a {base}: {line.strip()[:200]}")
      if base in COLLECTIVES:
        total += times * _sent_across(op, line, shape, node_of)
  return float(total.max()) if len(total) else 0.0


def bytes_across_nodes(lowered, compiled=None) -> float:
  """cross_node_bytes of the program `lowered` (a jax.stages.Lowered of jax.jit or
  equarx_pass.jit for devices of cluster_devices) compiles to, `compiled` where given:
  the nodes are the devices' process_index, by their position in the program's device
  assignment."""
  from equarx_pass import _jax_private

  compiled = lowered.compile() if compiled is None else compiled
  devices = _jax_private.lowered_devices(lowered)
  return cross_node_bytes(compiled.as_text(), [d.process_index for d in devices])


def _one_node(line: str, node_of: Sequence[int]) -> bool:
  """Whether a collective of a kind not counted stays inside one node."""
  try:
    groups = replica_groups(line, len(node_of))
  except ValueError:
    return False
  return all(len({node_of[d] for d in group}) == 1 for group in groups)


# --- --equarx_compile_for=gpu:... ---------------------------------------------------


def compile_for_target(
  module_text: str,
  target: str,
  timeout: float = COMPILE_TIMEOUT_S,
  device_ids: Sequence[int] | None = None,
) -> dict:
  """Compile `module_text` for `target` ('gpu:h100:2x8') in a child process: the fields
  of a tpu_aot.TopologyCompile but the collective counts (tpu_aot.compile_for_target
  adds them), with the bytes per device the program sends across nodes.

  device_ids: the cluster's device ids by logical id, where the program was lowered for
  that cluster's devices (equarx_pass.jit on cluster_devices); else logical id i runs on
  device i, node i // G, as the pass plans a file for the target."""
  _, _, topology = target.partition(":")
  parse_cluster(topology)
  if not have_cuda_plugin():
    raise CompileError(f"cannot compile for {target}: {PLUGIN_HINT}")
  return compile_child.run(
    "equarx_pass.frontends.gpu_aot",
    module_text,
    target,
    [",".join(map(str, device_ids))] if device_ids is not None else [],
    {},
    timeout,
  )


def _compile_in_this_process(
  module_text: str, target: str, device_ids: Sequence[int] | None = None
) -> dict:

  _, _, topology = target.partition(":")
  devices: list[Any] = cluster_devices(topology)
  if device_ids is not None:
    by_id = {d.id: d for d in devices}
    if sorted(device_ids) != sorted(by_id):
      return {"error": f"device ids {list(device_ids)} are not the devices of {target}"}
    devices = [by_id[i] for i in device_ids]
  compiled = compile_child.compile_here(module_text, devices, target)
  if isinstance(compiled, dict):
    return compiled
  executable, seconds = compiled
  hlo_text = "\n".join(m.to_string() for m in executable.hlo_modules())
  try:
    stats = executable.get_compiled_memory_stats()
    temp_bytes: int | None = int(stats.temp_size_in_bytes)
  except Exception:  # a client that gives no memory statistics
    temp_bytes = None
  return dict(
    temp_bytes=temp_bytes,
    target=target,
    seconds=seconds,
    num_devices=len(devices),
    cost={},
    hlo_text=hlo_text,
    cross_node_bytes=cross_node_bytes(hlo_text, [d.process_index for d in devices]),
  )


def main(argv: list[str]) -> int:
  usage = "usage: python -m equarx_pass.frontends.gpu_aot gpu:MODEL:NxG [ID,ID,...] < module"

  def compile_fn(module_text: str, target: str, ids: str | None = None) -> dict:
    device_ids = [int(i) for i in ids.split(",")] if ids is not None else None
    return _compile_in_this_process(module_text, target, device_ids)

  return compile_child.child_main(argv, usage, (2, 3), compile_fn)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
