"""Run a StableHLO module as XLA would on the test's CPU devices, one input per device.

For modules that are not JAX programs (HLO dumps, other projects' test modules): each
argument is an array with a leading axis of one slice per device, and so is each result.
"""

import jax
import numpy as np
from jax.extend import backend as jax_backend

from equarx_pass import _jax_private
from equarx_pass.planning import match


def run_per_device(module, inputs: list[np.ndarray]) -> list[np.ndarray]:
  """Compile `module` for its num_replicas x num_partitions devices and run it."""
  facts = match.module_facts(module)
  count = facts.num_replicas * facts.num_partitions
  devices = jax.devices()[:count]
  assignment = np.arange(count).reshape(facts.num_replicas, facts.num_partitions)
  options = jax_backend.get_compile_options(
    num_replicas=facts.num_replicas,
    num_partitions=facts.num_partitions,
    device_assignment=assignment,
  )
  client = devices[0].client
  executable = client.compile_and_load(str(module), _jax_private.device_list(devices), options)
  # Each argument as an array "replicated" over the devices whose per-device buffers
  # hold different values: the executable reads each device's own buffer.
  mesh = jax.sharding.Mesh(np.array(devices), ("devices",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  args = [
    jax.make_array_from_single_device_arrays(
      x.shape[1:], replicated, [jax.device_put(x[i], d) for i, d in enumerate(devices)]
    )
    for x in inputs
  ]
  results = executable.execute_sharded(args).disassemble_into_single_device_arrays()
  return [np.stack([np.asarray(shard) for shard in per_device]) for per_device in results]
