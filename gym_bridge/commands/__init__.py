"""One module per CLI verb; each keeps heavy imports (torch, transformers) inside its functions.

Top floor: may import any package; none imports it but :mod:`gym_bridge.cli`.
"""
