"""Examples that run real models through equarx-pass; they need `pip install -e .[examples]`.

    python -m equarx_pass.examples.minilm     # all-MiniLM-L6-v2, 4-way tensor parallel

`auto_sharded.py` (jax.jit + NamedSharding programs, no psum) needs only JAX.

The core package never imports this subpackage.
"""
