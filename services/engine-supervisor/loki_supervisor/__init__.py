"""Loki engine supervisor: owns llama-server (or an external engine), presets, launch rules,
slot routing and the engine lease. Run with ``python -m loki_supervisor``."""
