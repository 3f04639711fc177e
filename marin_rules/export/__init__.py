"""Export trained models to other ecosystems' layouts.

`layout.py` decides, without JAX, which Hugging Face architecture reproduces a model
config (or refuses it with the reason); `hf.py` is the `export_hf` step that writes
the folder `transformers` loads.
"""
