"""Runs per computation of compiled HLO text (hlo_text.py), which the DCN byte count of a
scanned program needs."""

import jax
import jax.numpy as jnp
import pytest

from equarx_pass.frontends import tpu_aot
from equarx_pass.ir import hlo_text


def compiled_text(trips: int) -> str:
  def f(x):
    return jax.lax.fori_loop(0, trips, lambda i, v: jnp.sin(v) * 1.5 + i, x)

  return jax.jit(f).lower(jnp.ones((64,))).compile().as_text()


@pytest.mark.parametrize("trips", [3, 11])
def test_a_loop_body_runs_its_trip_count(trips):
  text = compiled_text(trips)
  comps, entry = hlo_text.split_computations(text)
  runs = hlo_text.executions(text)
  assert runs[entry] == 1
  [while_line] = [line for lines in comps.values() for line in lines if " while(" in line]
  body = while_line.split("body=")[1].split(",")[0].split()[0].lstrip("%")
  assert runs[body] == trips


SEND = (
  "  %send = (f32[1024]{0}, u32[], token[]) send(%p, %t), channel_id=1, is_host_transfer=true, "
  'frontend_attributes={_xla_megascale_transfer_type="ALL_REDUCE"}'
)


def test_transfers_in_a_loop_body_count_once_per_iteration():
  text = f"""HloModule m

%body (b: (s32[], f32[1024])) -> (s32[], f32[1024]) {{
{SEND}
}}

%cond (c: (s32[], f32[1024])) -> pred[] {{
  %c = (s32[], f32[1024]) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(12)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

ENTRY %main (p: f32[1024]) -> (s32[], f32[1024]) {{
  %p = f32[1024]{{0}} parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[1024]) tuple(%zero, %p)
  ROOT %w = (s32[], f32[1024]) while(%init), condition=%cond, body=%body
{SEND}
}}
"""
  once = tpu_aot.cross_slice_bytes(SEND, 2)
  assert once == 4096  # 2 (S-1)/S of 4 KiB for an all-reduce across 2 slices
  assert tpu_aot.cross_slice_bytes(text, 2) == (12 + 1) * once
