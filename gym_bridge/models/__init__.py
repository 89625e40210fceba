"""Embedded models and the passes over them, shared by generation, training and evaluation.

Owns: the name registry and the one loader (:mod:`.registry`, :mod:`.gguf_cache`), a local byte-level
tokenizer and a tiny warm-started Llama (:mod:`.tokenizer`, :mod:`.tiny`, :mod:`.evaluate`); the one
log-prob gather (:mod:`.logprobs`), the forward pass with one prompt pass per distinct prompt
(:mod:`.shared_prefix`) and grouped-query attention without copied key/value heads
(:mod:`.gqa_attention`), which the sampler and the trainer both run; and handing freed host memory back
between phases (:mod:`.host_memory`).

Models floor: imports only the records floor (:mod:`gym_bridge.data`, the tiny model's problems).
Importing the package is cheap; the registry and tiny model import torch/transformers inside their
functions, the passes at their top.
"""
