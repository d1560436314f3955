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


def test_transfers_in_a_conditional_branch_are_counted_apart():
  text = f"""HloModule m

%sync (b: f32[1024]) -> f32[1024] {{
  %b = f32[1024]{{0}} parameter(0)
{SEND}
  ROOT %r = f32[1024]{{0}} copy(%b)
}}

%skip (s: f32[1024]) -> f32[1024] {{
  ROOT %s = f32[1024]{{0}} parameter(0)
}}

ENTRY %main (p: f32[1024], i: s32[]) -> f32[1024] {{
  %p = f32[1024]{{0}} parameter(0)
  %i = s32[] parameter(1)
{SEND}
  ROOT %c = f32[1024]{{0}} conditional(%i, %p, %p), branch_computations={{%sync, %skip}}
}}
"""
  assert hlo_text.only_in_branches(text) == {"sync", "skip"}
  once = tpu_aot.cross_slice_bytes(SEND, 2)
  # Every run sends the entry's transfer; the branch's only when it is taken.
  assert tpu_aot.cross_slice_bytes(text, 2) == once
  assert tpu_aot.cross_slice_bytes(text, 2, in_branches=True) == once


def test_compiled_conditional_branches_run_only_when_taken():
  def f(pred, x):
    return jax.lax.cond(pred, lambda v: jnp.sin(v) * 2.0, lambda v: jnp.cos(v) + 1.0, x)

  text = jax.jit(f).lower(True, jnp.ones((64,))).compile().as_text()
  comps, entry = hlo_text.split_computations(text)
  [line] = [line for line in comps[entry] if " conditional(" in line]
  taken = hlo_text.only_in_branches(text)
  branches = line.split("branch_computations={")[1].split("}")[0].replace("%", "").split(", ")
  assert set(branches) <= taken and entry not in taken
