"""Examples that run real models through equarx-pass; they need `pip install -e .[examples]`.

    python -m equarx_pass.examples.minilm     # all-MiniLM-L6-v2, 4-way tensor parallel

The core package never imports this subpackage.
"""
